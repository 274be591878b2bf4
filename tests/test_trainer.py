"""Trainer: learning, the schedule, precision, logging and results (issue 2; stopping and
resuming: tests/test_resume.py)."""
import json
import math
import platform

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.trainer import Trainer
from sigma_moe.tasks import TASKS
from tests.helpers import (
    CONFIGS,
    TINY,
    TINY_MOE,
    compose_cfg,
    losses,
    metrics,
)

RUN = TASKS.get("lm")


def test_loss_decreases_on_enwik_mini(tmp_path):
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=40", "trainer.lr=3e-3",
                       "trainer.val_every=1000", "trainer.ckpt_every=1000", "task.val_segments=2"])
    res = RUN(cfg, tmp_path)
    curve = losses(tmp_path)
    assert curve[40] < curve[5], curve
    # held-out loss more than 1 nat below the uniform distribution over the 205 bytes
    assert res["valid"]["loss"] < math.log(205) - 1.0, res["valid"]
    assert res["steps"] == 40 and res["metric"] == "bpc" and res["ranks"] == 1
    assert res["valid"]["bpc"] == pytest.approx(res["valid"]["loss"] / 0.6931471805599453)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["test"]["bpc"] == res["test"]["bpc"] and saved["n_params"] > 0
    assert saved["libraries"]["torch"] == torch.__version__  # the installed distribution's
    assert saved["libraries"]["python"] == platform.python_version()
    assert len(saved["valid_routing"]) == 2 and len(saved["valid_routing"][0]["expert_share"]) == 4


def test_eval_mode_reevaluates_the_last_checkpoint(tmp_path):
    from sigma_moe.framework.run_dirs import choose_run_dir

    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=3", "trainer.ckpt_every=3"])
    trained = RUN(cfg, tmp_path)
    (tmp_path / "results.json").unlink()  # as if killed after its last checkpoint
    log = (tmp_path / "metrics.jsonl").read_bytes()
    evaluated = RUN({**cfg, "mode": "eval"}, tmp_path)
    assert (tmp_path / "metrics.jsonl").read_bytes() == log  # the training's record
    assert evaluated["steps"] == 3
    assert evaluated["valid"] == trained["valid"] and evaluated["test"] == trained["test"]
    assert json.loads((tmp_path / "eval_results.json").read_text())["test"] == trained["test"]
    # an evaluation does not mark the run finished: rerunning the training resumes it
    assert not (tmp_path / "results.json").exists()
    assert choose_run_dir(cfg, tmp_path) == tmp_path
    with pytest.raises(ConfigError, match="no checkpoint"):
        RUN({**cfg, "mode": "eval"}, tmp_path / "empty")
    assert not (tmp_path / "empty" / "config.yaml").exists()  # nothing that looks like a run
    # how it evaluates may change; what was trained may not (its numbers would be filed
    # under this run)
    fewer = RUN({**cfg, "mode": "eval", "task": {**cfg["task"], "final_segments": 1}}, tmp_path)
    assert fewer["steps"] == 3
    saved = json.loads((tmp_path / "eval_results.json").read_text())
    assert saved["evaluation"]["final_segments"] == 1  # which evaluation it holds
    assert evaluated["evaluation"]["final_segments"] == cfg["task"]["final_segments"]
    before = (tmp_path / "eval_results.json").read_bytes()
    with pytest.raises(ConfigError, match=r"was trained with ffn.k=2, not 1; evaluate it"):
        RUN({**cfg, "mode": "eval", "ffn": {**cfg["ffn"], "k": 1}}, tmp_path)
    assert (tmp_path / "eval_results.json").read_bytes() == before


def test_wandb_offline_logs_into_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=2", "task.final_segments=1",
                       "logger=wandb", "logger.mode=offline"])
    RUN(cfg, tmp_path)
    run_id = (tmp_path / "wandb_id.txt").read_text()
    (offline,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    assert list(offline.glob("*.wandb"))  # the offline run's data, syncable later


def test_wandb_online_without_a_login_is_one_line(tmp_path, monkeypatch):
    from sigma_moe.framework.loggers import LoggerConfig, RunLogger

    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    with pytest.raises(ConfigError, match=r"^logger.mode=online: wandb.init failed: No API key "
                                          r"configured. Use `wandb login` to log in; "
                                          r"logger.mode=offline logs locally"):
        RunLogger(LoggerConfig(kind="wandb", mode="online"), tmp_path, {}, "run")
    with pytest.raises(ConfigError, match=r"^logger.mode=offline: wandb.init failed: .*project"):
        RunLogger(LoggerConfig(kind="wandb", project="my/project"), tmp_path, {}, "run")


def test_step_metrics_reach_the_host_in_one_transfer(monkeypatch):
    from sigma_moe.framework.trainer import to_host

    calls = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(t.shape) or real(t))
    values = {"loss": torch.tensor(2.5, dtype=torch.float64), "reg": 0.0,
              "ce": torch.tensor(2.25, dtype=torch.float64)}
    host = to_host(values)
    assert host == {"loss": 2.5, "reg": 0.0, "ce": 2.25} and list(host) == list(values)
    assert all(type(v) is float for v in host.values()) and calls == [(2,)]
    assert to_host({"reg": 1}) == {"reg": 1.0}
    # mixed dtypes and devices (a model without gradients has its grad norm on the CPU)
    assert to_host({"loss": torch.tensor(1.5, dtype=torch.float64),
                    "grad_norm": torch.tensor(0.25)}) == {"loss": 1.5, "grad_norm": 0.25}


def test_a_training_step_waits_for_the_device_once(tmp_path, monkeypatch):
    """The trainer's own code reads device values once per step (the metrics and the grad
    norm together): each read waits for the GPU."""
    import sys

    from sigma_moe.framework import trainer

    reads = []
    for name in ("tolist", "item", "__float__"):
        real = getattr(torch.Tensor, name)

        def read(t, *a, _real=real, _name=name):
            if sys._getframe(1).f_code.co_filename == trainer.__file__:
                reads.append(_name)
            return _real(t, *a)
        monkeypatch.setattr(torch.Tensor, name, read)
    steps = []
    real_step = Trainer.train_step

    def train_step(self):
        reads.clear()
        out = real_step(self)
        steps.append(list(reads))
        return out
    monkeypatch.setattr(Trainer, "train_step", train_step)
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=3", "trainer.grad_clip=0.5",
                       "trainer.val_every=1000", "task.final_segments=1"])
    RUN(cfg, tmp_path)
    assert steps == [["tolist"]] * 3, steps


def test_lr_schedule_warmup_then_cosine_over_the_whole_run():
    """The authors' schedule: a cosine of period `total` started after the warmup (their
    CosineAnnealingLR(T_max=stop_after) stepped at iter - lr_warmup), so with warmup it
    stops short of 0; without, it reaches 0 at the last step."""
    from sigma_moe.framework.optim import lr_factor

    assert [lr_factor(s, 10, 4, "cosine") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 10, 4, "cosine") == 1.0  # cosine starts after the warmup
    assert lr_factor(9, 10, 4, "cosine") == pytest.approx(0.5)  # half its period
    assert lr_factor(10, 10, 0, "cosine") == pytest.approx(0.0, abs=1e-12)
    # WT-B: 4000 warmup steps of 100k; the authors' lr at the last step is 0.39% of the base
    assert lr_factor(99_999, 100_000, 4000, "cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 95_999 / 100_000)))
    assert lr_factor(52_000, 100_000, 4000, "cosine") == pytest.approx(0.5313, abs=1e-4)
    assert lr_factor(9, 10, 0, "constant") == 1.0


def test_trainer_defaults_are_the_papers():
    """docs/REFERENCE.md "Training": Adam betas (0.9, 0.999), eps 1e-8, no weight decay, lr
    2.5e-4 over 100k steps, clip 0.25, validation every 2000 steps, a checkpoint every 10k;
    the yaml and the dataclass agree (runs read the yaml, direct users the dataclass)."""
    from sigma_moe.framework.trainer_config import TrainerConfig

    want = {"steps": 100_000, "lr": 2.5e-4, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": 0.0, "schedule": "cosine", "grad_clip": 0.25, "val_every": 2000,
            "ckpt_every": 10_000}
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        yaml = OmegaConf.to_container(compose("config").trainer)
    dataclass = vars(TrainerConfig()) | {"betas": list(TrainerConfig().betas)}
    for source in (yaml, dataclass):
        assert {k: source[k] for k in want} == want


def test_logged_lr_follows_the_schedule_and_gradients_are_clipped(tmp_path, monkeypatch):
    """Every parameter group (weight decay makes two) follows warmup and cosine, and the
    optimizer gets gradients clipped to exactly grad_clip in L2 norm (an L1 clip is
    smaller, also below the limit)."""
    from sigma_moe.framework.optim import lr_factor

    seen, group_lrs = [], []
    real_step = torch.optim.AdamW.step

    def step(self, *a, **k):  # the gradient norm and learning rates the optimizer gets
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(x) for x in grads]))))
        group_lrs.append([g["lr"] for g in self.param_groups])
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=6", "trainer.warmup_steps=2",
                       "trainer.lr=0.01", "trainer.grad_clip=0.001", "trainer.log_every=1",
                       "trainer.weight_decay=0.1", "trainer.val_every=1000",
                       "task.final_segments=1"])
    RUN(cfg, tmp_path)
    rows = [r for r in metrics(tmp_path) if "train/lr" in r]
    want = [0.01 * lr_factor(s, 6, 2, "cosine") for s in range(6)]
    assert [r["train/lr"] for r in rows] == pytest.approx(want)
    assert all(len(lrs) == 2 for lrs in group_lrs)
    assert group_lrs == [pytest.approx([lr, lr]) for lr in want]
    assert all(r["train/grad_norm"] > 0.001 for r in rows)  # logged before clipping
    assert len(seen) == 6 and seen == pytest.approx([0.001] * 6, rel=1e-3)


def test_final_evaluation_keeps_eval_mem_segments_of_memory(tmp_path, monkeypatch):
    """The paper's valid/test numbers use 4 segments of memory, training 1: the final
    evaluation must pass the eval setting, not the training one."""
    from sigma_moe.tasks.lm import LMTask

    calls, real_evaluate = [], LMTask.evaluate

    def evaluate(self, split, batch_size, mem_segments, *a, **k):
        calls.append((split, mem_segments, k.get("stats", False)))
        return real_evaluate(self, split, batch_size, mem_segments, *a, **k)

    monkeypatch.setattr(LMTask, "evaluate", evaluate)
    RUN(compose_cfg([*TINY, *TINY_MOE, "trainer.steps=2", "trainer.val_every=1000",
                     "task.final_segments=1", "task.train_mem_segments=1",
                     "task.eval_mem_segments=3"]), tmp_path)
    assert [c[:2] for c in calls if c[2]] == [("valid", 3), ("test", 3)]


@pytest.mark.parametrize("name,said", [
    ("gpu", "trainer.device=gpu is not a device: use auto, cpu, cuda, cuda:N or mps"),
    ("mps", "trainer.device=mps but no MPS device is available; use cpu"),
    ("cpu:3", "trainer.device=cpu:3 but this machine has 1 CPU device(s): use cpu:0 .. cpu:0"),
])


def test_a_device_this_machine_lacks_is_a_config_error(name, said, monkeypatch):
    """Before: a traceback from the first `.to(device)`, after config.yaml was written."""
    from sigma_moe.framework.runtime import resolve_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError) as e:
        resolve_device(name)
    assert str(e.value) == said
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda") == resolve_device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"has 2 CUDA device\(s\): use cuda:0 .. cuda:1$"):
        resolve_device("cuda:2")


def test_a_log_file_gets_lines_not_a_bar_and_validation_is_shown(tmp_path, capsys):
    """Into a file (Slurm, nohup) the redrawn bar was one ever-growing line; periodic
    validation went to metrics.jsonl only, and its time into the next tokens/s."""
    cfg = compose_cfg([*TINY, "trainer.steps=4", "trainer.log_every=2", "trainer.val_every=2",
                       "task.val_segments=1", "task.final_segments=1", "trainer.progress=true"])
    RUN(cfg, tmp_path / "run")  # pytest's captured stderr is no terminal
    out, err = capsys.readouterr()
    assert "\r" not in err and "\r" not in out
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert lines[1].endswith("00:00 left") and " tok/s | " in lines[0]
    valid = [r for r in metrics(tmp_path / "run") if "valid/bpc" in r][0]
    assert f"step 2 | valid loss {valid['valid/loss']:.4f} | bpc {valid['valid/bpc']:.4f}" in out


def test_grad_accum_gives_the_gradient_of_the_whole_batch(tmp_path):
    """Micro-batch losses are averaged, not summed: the first step's gradient (its norm, before
    clipping) is the same with 1 or 2 micro-batches (no regularizer or dropout, which see
    each micro-batch on its own)."""
    base = [*TINY, *TINY_MOE, "model.dropout=0.0", "ffn.reg_gamma=0.0", "trainer.steps=1",
            "trainer.log_every=1", "trainer.val_every=100", "task.final_segments=1"]
    norms, losses_logged = [], []
    for accum in (1, 2):
        RUN(compose_cfg([*base, f"trainer.grad_accum={accum}"]), tmp_path / str(accum))
        rows = [r for r in metrics(tmp_path / str(accum)) if "train/grad_norm" in r]
        norms += [r["train/grad_norm"] for r in rows]
        losses_logged += [r["train/loss"] for r in rows]  # the mean over micro-batches
    assert len(norms) == 2 and norms[0] == pytest.approx(norms[1], rel=1e-4)
    assert losses_logged[0] == pytest.approx(losses_logged[1], rel=1e-4)


# -- from mutation testing (round 4): the run logger ------------------------------------
class FakeWandbRun:
    def __init__(self, **kwargs):
        self.kwargs, self.logged, self.summary = kwargs, [], {}

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        pass


def test_wandb_resumes_the_same_run_and_gets_metrics_by_step(tmp_path, monkeypatch):
    """Mutants: a new wandb id at every start (a resumed run became a second wandb run), and
    the step logged as a metric too (wandb charted "step" against itself)."""
    import sys

    from sigma_moe.framework.loggers import LoggerConfig, RunLogger

    runs = []
    fake = type(sys)("wandb")
    fake.init = lambda **k: runs.append(FakeWandbRun(**k)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for _ in range(2):  # the run, then its resume
        logger = RunLogger(LoggerConfig(kind="wandb"), tmp_path, {"ffn": {"kind": "dense"}}, "r")
        logger.log({"train/loss": torch.tensor(2.5)}, step=3)
        logger.close()
    ids = [r.kwargs["id"] for r in runs]
    assert ids[0] == ids[1] == (tmp_path / "wandb_id.txt").read_text()
    assert runs[0].kwargs["resume"] == "allow" and runs[0].kwargs["tags"] == ["dense"]
    assert runs[0].logged == [(3, {"train/loss": 2.5})]


def test_metrics_file_truncates_to_a_checkpoints_size_even_zero(tmp_path):
    """Mutant `size is not None` -> `size` (truthy): a checkpoint written before the first
    row (metrics_bytes 0) kept the rows a resume then logs again."""
    from sigma_moe.framework.loggers import LoggerConfig, RunLogger

    logger = RunLogger(LoggerConfig(), tmp_path, {}, "r")
    assert logger.size() == 0
    logger.log({"train/loss": 1.0}, step=5)
    logger.truncate(0)
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_metrics_file_is_strict_json_with_nan_and_inf(tmp_path):
    """Mutant: non-finite values written as bare NaN / Infinity (not JSON: jq and other
    readers of metrics.jsonl refuse the line)."""
    from sigma_moe.framework.loggers import LoggerConfig, RunLogger

    logger = RunLogger(LoggerConfig(), tmp_path, {}, "r")
    logger.log({"train/loss": float("nan"), "train/grad_norm": torch.tensor(float("inf"))}, 1)

    def refuse(name):
        raise ValueError(name)

    row = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=refuse)
    assert (row["train/loss"], row["train/grad_norm"]) == ("nan", "inf")


def test_on_a_gpu_the_task_precompiles_before_the_first_step(capsys):
    """Trainer._precompile: on CUDA, with steps left, it asks the task to compile its
    kernels ahead (at the micro-batch count and the autocast dtype) and shows what it said
    on the main process, and a failure from any process; an error is a note, never the
    run's end; elsewhere, for a finished run or a task without the hook, nothing."""
    from types import SimpleNamespace as NS

    asked, said = [], [("precompile: compiled in 1.0 s", False)]

    class Task:
        def precompile(self, n_micro, dtype):
            asked.append((n_micro, dtype))
            if said is None:
                raise RuntimeError("no GPU memory")
            return said

    trainer = NS(device=torch.device("cuda"), task=Task(), cfg=NS(grad_accum=2, steps=10),
                 step=3, amp_dtype=torch.bfloat16, is_main=True, dist=NS(rank=0))

    def run(**changes):
        Trainer._precompile(NS(**{**vars(trainer), **changes}))
        return capsys.readouterr().err

    assert run() == "precompile: compiled in 1.0 s\n" and asked == [(2, torch.bfloat16)]
    assert run(is_main=False, dist=NS(rank=3)) == ""  # another process: quiet
    said = [("precompile: failed (OSError: disk full)", True)]
    assert run(is_main=False, dist=NS(rank=3)) == (
        "rank 3: precompile: failed (OSError: disk full)\n")
    said = None
    assert run(is_main=False, dist=NS(rank=3)) == (
        "rank 3: precompile: failed (RuntimeError: no GPU memory)\n")
    assert len(asked) == 4
    assert run(device=torch.device("cpu")) == run(task=object()) == run(step=10) == ""
    assert len(asked) == 4
