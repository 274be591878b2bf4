"""Never lose a run: each fault is injected and the outcome checked (issue 8).

Kill -9 (at a random step and in the middle of a checkpoint write), SIGTERM preemption,
corrupt checkpoints, an unwritable or full disk, and rerunning a finished run (NaN:
tests/test_divergence.py; the checkpoint module alone: tests/test_checkpoints.py).
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framework.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from framework.config import ConfigError
from framework.trainer import Trainer
from tasks import TASKS
from tests.helpers import TINY, TINY_MOE, compose_cfg, metrics

ROOT = Path(__file__).resolve().parent.parent
RUN = TASKS.get("lm")
OVERRIDES = [*TINY, *TINY_MOE, "trainer.steps=10", "trainer.ckpt_every=2",
             "trainer.log_every=1", "trainer.val_every=100", "task.final_segments=2",
             "model.dropout=0.1", "ffn.expert_dropout=0.1"]

# Runs run.py in a subprocess; FAULT (python code) is executed first to install the fault.
DRIVER = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
{fault}
sys.argv = ["run.py", *{args!r}]
runpy.run_path({run_py!r}, run_name="__main__")
"""

KILL_IN_SAVE = """
import framework.checkpoint as ck
real_save, calls = ck.torch.save, [0]
def save(obj, f, *a, **k):
    calls[0] += 1
    if calls[0] == 2:  # the second checkpoint: write part of it, then die
        f.write(b"partial checkpoint bytes"); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *a, **k)
ck.torch.save = save
"""

# Steps of 0.2 s: a signal sent after step 3 (or 8) lands before step 10 however fast the machine
# (the tiny model's steps take milliseconds; the test polls every 50 ms)
SLOW_STEPS = """
import time
from framework.trainer import Trainer
real_step = Trainer.train_step
def train_step(self):
    time.sleep(0.2)
    return real_step(self)
Trainer.train_step = train_step
"""


def sigint_as_from_a_terminal() -> None:
    # A shell starts background jobs with SIGINT ignored, and children inherit that (Python
    # then installs no KeyboardInterrupt handler): pytest run as `... &` made the Ctrl-C
    # test's run ignore its SIGINT and finish (rc 0). The run gets SIGINT as a terminal's.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(run_dir, *extra, fault="", wait=True):
    args = [*OVERRIDES, f"hydra.run.dir={run_dir}", *extra]
    code = DRIVER.format(root=str(ROOT), fault=fault, args=args, run_py=str(ROOT / "run.py"))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=sigint_as_from_a_terminal)
    if wait:
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err
    return proc


def wait_for_step(run_dir: Path, step: int, proc, timeout=120) -> None:
    start = time.time()
    while time.time() - start < timeout:
        path = run_dir / "metrics.jsonl"
        if path.exists() and sum(1 for _ in open(path)) >= step:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the same command."""
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    rc, out, err = cli(run_dir)
    assert rc == 0, err
    return {**json.loads((run_dir / "results.json").read_text()), "rows": logged(run_dir),
            "out": out}


def test_a_run_names_its_data(reference):
    """The start line and results.json say which tokens a run read (sizes, passes, sha256)."""
    from framework.data import DATASETS
    from framework.data.enwik_mini import EnwikMiniConfig

    data = DATASETS.get("enwik_mini").load(EnwikMiniConfig())
    n = {s: len(a) for s, a in data.splits.items()}
    epochs = 10 / ((n["train"] // 4 - 1) // 32)  # TINY: batch 4, context 32
    assert reference["data"] == {"name": "enwik_mini", "tokens": n,
                                 "train_epochs": float(f"{epochs:.4g}"), **data.origin}
    assert set(data.origin["sha256"]) == {"train", "valid", "test"}
    assert (f"data enwik_mini: train/valid/test {n['train']:,}/{n['valid']:,}/{n['test']:,} "
            f"tokens, {float(f'{epochs:.4g}'):g} epochs of train | embedded\n") in reference["out"]


def logged(run_dir: Path) -> list[dict]:
    """metrics.jsonl without wall-clock values."""
    return [{k: v for k, v in r.items() if k not in ("time", "train/tokens_per_s")}
            for r in metrics(run_dir)]


def same_results(run_dir: Path, reference: dict) -> None:
    got = json.loads((run_dir / "results.json").read_text())
    # equal up to MKL's last-bit reduction noise (it reaches the weights through clipping)
    for split in ("valid", "test"):
        assert got[split] == pytest.approx(reference[split], rel=1e-6)
    assert got["steps"] == 10 and not list(run_dir.glob(".*.tmp"))
    # the steps redone after the checkpoint are logged once, with the same numbers (up to
    # the last bits of MKL's threaded reductions, e.g. of the gradient norm)
    got, want = logged(run_dir), reference["rows"]
    assert [(r["step"], sorted(r)) for r in got] == [(r["step"], sorted(r)) for r in want]
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-6)


def test_kill9_at_random_step_then_rerun_matches(tmp_path, reference):
    step = random.Random(os.getpid()).randint(3, 8)
    proc = cli(tmp_path / "run", fault=SLOW_STEPS, wait=False)
    wait_for_step(tmp_path / "run", step, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    rc, out, err = cli(tmp_path / "run")
    assert rc == 0, f"killed after step {step}: {err}"
    assert "resumed from step" in out + err, f"killed after step {step}"
    same_results(tmp_path / "run", reference)


def test_kill9_during_checkpoint_write_then_rerun_matches(tmp_path, reference):
    rc, _, _ = cli(tmp_path / "run", fault=KILL_IN_SAVE)
    assert rc == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint_00000002.pt"]
    rc, out, err = cli(tmp_path / "run")
    assert rc == 0, err
    assert "resumed from step 2" in out + err
    same_results(tmp_path / "run", reference)


def rerun_resumes(run_dir: Path) -> None:
    """An interrupt at step >= 3 left one checkpoint; rerunning resumes from it, and the
    run's training time counts both processes (the throughput tables divide by it)."""
    (ckpt,) = list_checkpoints(run_dir)
    assert 3 <= int(ckpt.stem.split("_")[1]) < 10
    trained = load_checkpoint(ckpt)["train_seconds"]
    assert trained > 0
    rc, out, err = cli(run_dir, "trainer.ckpt_every=1000")
    assert rc == 0 and "resumed from step" in out + err, err
    # unrounded in the last checkpoint (a tiny run trains ~0.1 s: results.json's 0.1 s
    # rounding could hide the second process)
    total = load_checkpoint(list_checkpoints(run_dir)[-1])["train_seconds"]
    assert total > trained
    assert json.loads((run_dir / "results.json").read_text())["train_seconds"] == round(total, 1)


def test_sigterm_checkpoints_and_rerun_resumes(tmp_path, reference):
    proc = cli(tmp_path / "run", "trainer.ckpt_every=1000", fault=SLOW_STEPS, wait=False)
    wait_for_step(tmp_path / "run", 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err
    assert "SIGTERM at step" in out + err and "rerun the same command" in out + err
    rerun_resumes(tmp_path / "run")


def test_ctrl_c_checkpoints_after_the_step_and_rerun_resumes(tmp_path, reference):
    """SIGINT before the first periodic checkpoint: the steps done are not lost."""
    proc = cli(tmp_path / "run", "trainer.ckpt_every=1000", fault=SLOW_STEPS, wait=False)
    wait_for_step(tmp_path / "run", 3, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted: stopping after this step with a checkpoint" in out + err
    assert "SIGINT at step" in out + err
    rerun_resumes(tmp_path / "run")
    same_results(tmp_path / "run", reference)


def test_no_loadable_checkpoint_stops_eval_and_training_until_the_user_decides(tmp_path,
                                                                               capsys):
    """Every checkpoint broken: mode=eval stops; training stops too (not a silent start from
    step 0 over the run's record), and so does every rerun, until one is repaired or
    fresh=true starts over beside it."""
    from framework.checkpoint import CheckpointError
    from framework.cli import choose_run_dir

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    RUN(cfg, tmp_path)
    (tmp_path / "results.json").unlink()
    (ckpt,) = list_checkpoints(tmp_path)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    log = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="mode=eval: none of the 1 checkpoints in .* loads"):
        RUN({**cfg, "mode": "eval"}, tmp_path)
    with pytest.raises(CheckpointError) as e:
        RUN(cfg, tmp_path)
    assert str(e.value) == (f"none of the 1 checkpoints in {tmp_path} loads (moved aside as "
                            "*.pt.bad); to resume, repair one and rename it back to *.pt; to "
                            "start over, pass fresh=true (a new sibling directory)")
    assert (tmp_path / "checkpoint_00000002.pt.bad").exists()
    assert (tmp_path / "metrics.jsonl").read_bytes() == log
    with pytest.raises(ConfigError, match=r"its checkpoints do not load \(checkpoint_00000002"
                                          r"\.pt\.bad; .*rename it back to \*\.pt; pass "
                                          r"fresh=true"):
        choose_run_dir(cfg, tmp_path)
    fresh = tmp_path.with_name(tmp_path.name + "-2")
    assert choose_run_dir({**cfg, "fresh": True}, tmp_path) == fresh
    # the same in that fresh=true sibling: its rerun stops too, fresh=true goes past it
    RUN(cfg, fresh)
    (fresh / "results.json").unlink()
    (ckpt,) = list_checkpoints(fresh)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="none of the 1 checkpoints"):
        RUN(cfg, fresh)
    with pytest.raises(CheckpointError, match="none of the 1 checkpoints"):
        RUN(cfg, fresh)  # (Trainer.resume: the *.pt.bad alone, whoever chose the directory)
    assert choose_run_dir({**cfg, "fresh": True}, tmp_path) == tmp_path.with_name(
        tmp_path.name + "-3")


def test_a_directory_another_run_started_in_is_not_taken_over(tmp_path):
    """No checkpoint yet, but a config.yaml of another config (or a metrics.jsonl without
    one): refused, nothing rewritten; an earlier start of this same config (stopped before
    its first checkpoint) is started over, its metrics.jsonl rows replaced, not appended."""
    from omegaconf import OmegaConf

    from framework.cli import choose_run_dir

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    other = {**cfg, "trainer": {**cfg["trainer"], "lr": 0.5}}
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(OmegaConf.create(other), run / "config.yaml")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(ConfigError, match=r"holds the start of a run with another config "
                                          r"\(its config.yaml, which has trainer.lr=0.5; this "
                                          r"config: 0.002; no checkpoint, so deleting the "
                                          r"directory loses nothing\); pass fresh=true"):
        choose_run_dir(cfg, run)
    (run / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="holds the metrics.jsonl of another run"):
        choose_run_dir(cfg, run)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == {"metrics.jsonl": before[
        "metrics.jsonl"]}
    assert choose_run_dir({**cfg, "fresh": True}, run) == tmp_path / "run-2"
    # an earlier start of this config: its rows go, the new run's are the record
    OmegaConf.save(OmegaConf.create(cfg), run / "config.yaml")
    assert choose_run_dir(cfg, run) == run
    RUN(cfg, run)
    rows = metrics(run)
    assert all("time" in row for row in rows)  # the stale {"step": 1} row is gone
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2]


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, capsys):
    cfg = compose_cfg([*OVERRIDES, "trainer.steps=4"])
    RUN(cfg, tmp_path)
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    (tmp_path / "results.json").unlink()
    loaded = []
    real = Trainer.load_state_dict
    orig = lambda self, state: (loaded.append(state["step"]), real(self, state))  # noqa: E731
    Trainer.load_state_dict = orig
    try:
        RUN(cfg, tmp_path)
    finally:
        Trainer.load_state_dict = real
    assert loaded == [2]
    lines = [x for x in capsys.readouterr().err.splitlines() if "skipping checkpoint" in x]
    assert lines == ["warning: skipping checkpoint checkpoint_00000004.pt: checksum mismatch "
                     "(truncated or corrupt) (moved to checkpoint_00000004.pt.bad); trying "
                     "the previous one"]


def test_unwritable_or_full_run_dir_fails_before_training(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not writable"):
        RUN(compose_cfg(OVERRIDES), tmp_path / "file" / "run")
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=10 * 2**20))
    with pytest.raises(ConfigError, match="only 10 MB free"):
        RUN(compose_cfg(OVERRIDES), tmp_path / "full")
    assert not list((tmp_path / "full").glob("checkpoint_*"))


def test_disk_full_during_a_checkpoint_stops_with_one_line(tmp_path, monkeypatch):
    import errno

    import framework.checkpoint as ck

    real_save = ck.torch.save

    def save(obj, f, *a, **k):
        if obj["step"] == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ck.torch, "save", save)
    with pytest.raises(ck.CheckpointError) as err:
        RUN(compose_cfg(OVERRIDES), tmp_path)
    assert "step-4 checkpoint" in str(err.value) and "No space left" in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_finished_run_is_not_retrained_and_fresh_starts_anew(tmp_path, reference):
    run_dir = tmp_path / "run"
    assert cli(run_dir)[0] == 0
    before = (run_dir / "results.json").stat().st_mtime_ns
    rc, out, _ = cli(run_dir)
    assert rc == 0 and "already finished" in out and str(run_dir / "results.json") in out
    assert (run_dir / "results.json").stat().st_mtime_ns == before
    rc, out, _ = cli(run_dir, "fresh=true")
    assert rc == 0 and (tmp_path / "run-2" / "results.json").exists()
    # a results.json without the numbers (edited by hand) still marks the run finished
    res = json.loads((tmp_path / "run-2" / "results.json").read_text())
    (tmp_path / "run-2" / "results.json").write_text(json.dumps({**res, "test": {}}))
    from framework.cli import choose_run_dir

    assert choose_run_dir(compose_cfg(OVERRIDES), tmp_path / "run-2") is None
    assert (run_dir / "results.json").stat().st_mtime_ns == before


def test_fresh_resumes_its_own_unfinished_run(tmp_path):
    """An interrupted (or requeued) fresh=true command resumes the sibling it started, as
    the interrupt message says; a finished sibling or one of another config gets a new one."""
    from omegaconf import OmegaConf

    from framework.cli import choose_run_dir
    from framework.experiment import config_hash, write_results

    cfg = {**compose_cfg([*OVERRIDES, "trainer.steps=2"]), "fresh": True}
    run = tmp_path / "run"
    done = {"config_hash": config_hash(cfg), "metric": "bpc", "valid": {"bpc": 1.0},
            "test": {"bpc": 1.0}}
    run.mkdir()
    write_results(run, done)
    assert choose_run_dir(cfg, run) == tmp_path / "run-2"  # created, empty
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "run-2" / "config.yaml")  # as lm_run
    assert choose_run_dir(cfg, run) == tmp_path / "run-2"  # unfinished: resumed
    other = {**cfg, "trainer": {**cfg["trainer"], "lr": 0.01}}
    assert choose_run_dir(other, run) == tmp_path / "run-3"  # another config: a new run
    OmegaConf.save(OmegaConf.create(other), tmp_path / "run-3" / "config.yaml")
    write_results(tmp_path / "run-3", done)
    (tmp_path / "run-2").rename(tmp_path / "run-2-old")
    assert choose_run_dir(cfg, run) == tmp_path / "run-4"  # the newest finished: after it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-2-old", "run-3",
                                                          "run-4"]


def test_same_seed_same_losses(tmp_path):
    cfg = compose_cfg([*OVERRIDES, "trainer.steps=3"])
    RUN(cfg, tmp_path / "a")
    RUN(cfg, tmp_path / "b")
    a, b = ((tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in "ab")
    strip = lambda rows: [{k: v for k, v in json.loads(r).items() if "time" not in k and  # noqa
                           "tokens_per_s" not in k} for r in rows]
    assert strip(a) == strip(b)


@pytest.mark.parametrize("earlier", [0, 1])
def test_runs_hashed_by_an_earlier_version_are_still_this_run(tmp_path, earlier):
    """nan_policy, then grad_accum left the run identity later: runs started before keep
    their old hash and must still resume, and count as finished."""
    from framework.cli import choose_run_dir
    from framework.experiment import EARLIER_VOLATILE_TRAINER, config_hash

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    RUN(cfg, tmp_path)
    old = config_hash(cfg, EARLIER_VOLATILE_TRAINER[earlier])
    assert old != config_hash(cfg)
    (tmp_path / "results.json").unlink()
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    save_checkpoint(tmp_path, 2, {**state, "config_hash": old})
    assert RUN(cfg, tmp_path)["steps"] == 2  # resumed (another config would be refused)
    res = json.loads((tmp_path / "results.json").read_text())
    (tmp_path / "results.json").write_text(json.dumps({**res, "config_hash": old}))
    assert choose_run_dir(cfg, tmp_path) is None  # finished


def test_a_run_resumes_with_another_grad_accum(tmp_path):
    """Out of memory: rerun with trainer.grad_accum=2, the same run (same batch per step)."""
    from framework.cli import choose_run_dir

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=3", "trainer.ckpt_every=2"])
    RUN(cfg, tmp_path)
    (tmp_path / "results.json").unlink()  # as if killed after the step-2 checkpoint
    for p in tmp_path.glob("checkpoint_00000003.pt*"):
        p.unlink()
    split = {**cfg, "trainer": {**cfg["trainer"], "grad_accum": 2}}
    assert choose_run_dir(split, tmp_path) == tmp_path
    assert RUN(split, tmp_path)["steps"] == 3
    assert choose_run_dir(cfg, tmp_path) is None  # finished, for either split


def test_a_batch_that_does_not_split_stops_before_training(tmp_path):
    from tasks.lm import check_batch_split

    cfg = compose_cfg([*OVERRIDES, "trainer.grad_accum=3"])  # task.batch_size=4
    with pytest.raises(ConfigError, match=r"^trainer.grad_accum=3 does not divide "
                                          r"task.batch_size=4$"):
        RUN(cfg, tmp_path)
    assert not list_checkpoints(tmp_path) and not (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match=r"^trainer.grad_accum=3 does not divide"):
        RUN({**cfg, "mode": "params"}, tmp_path)  # a sweep's dry run says so too
    wiki = compose_cfg(["dataset=wikitext_mini", "dataset.vocab_size=10"])
    with pytest.raises(ConfigError, match=r"^dataset.vocab_size=10: use 16..65535"):
        RUN({**wiki, "mode": "params"}, tmp_path)  # and a vocabulary training would refuse
    with pytest.raises(ConfigError, match=r"^task.batch_size=16 \(the global batch\) does "
                                          r"not divide by the 3 processes of this run"):
        check_batch_split(16, 3, 1)
    with pytest.raises(ConfigError, match=r"^trainer.grad_accum=3 does not divide the 8 "
                                          r"sequences of each process \(task.batch_size=16 "
                                          r"over 2 processes\)$"):
        check_batch_split(16, 2, 3)
    check_batch_split(24, 2, 3)


def test_checkpoints_of_another_config_are_not_resumed(tmp_path):
    RUN(compose_cfg([*OVERRIDES, "trainer.steps=2"]), tmp_path)
    (tmp_path / "results.json").unlink()  # as if interrupted after its last checkpoint
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="holds checkpoints of another config.*fresh=true"):
        RUN(compose_cfg([*OVERRIDES, "trainer.steps=2", "trainer.lr=0.01"]), tmp_path)
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir() if p.name in before}
    assert {k: v for k, v in before.items() if k.startswith("checkpoint")} == {
        k: v for k, v in after.items() if k.startswith("checkpoint")}


def test_volatile_keys_leave_the_config_hash_alone():
    """Mutant: "paper" dropped from VOLATILE (correcting a paper number in an exp file would
    make every finished run of it stale)."""
    from framework.experiment import config_hash

    cfg = {"model": {"d_model": 16}, "trainer": {"seed": 0, "lr": 1e-3}, "paper": {"a": 1}}
    for key, value in (("paper", {"a": 2}), ("logger", "wandb"), ("fresh", True),
                       ("mode", "eval"), ("sweep_name", "moe")):
        assert config_hash({**cfg, key: value}) == config_hash(cfg), key
    assert config_hash({**cfg, "model": {"d_model": 32}}) != config_hash(cfg)


def test_fresh_dir_goes_above_the_highest_sibling(tmp_path):
    """Mutant `max(...)` -> `min(...)` in _newest_fresh_sibling: with -2 and -3 present,
    fresh=true would pick -3 again (a finished run's directory)."""
    from framework.experiment import fresh_dir

    run = tmp_path / "exp" / "trainer.seed=0"
    for d in (run, run.with_name(run.name + "-3"), run.with_name(run.name + "-2")):
        d.mkdir(parents=True)
    assert fresh_dir(run) == run.with_name(run.name + "-4")


def test_a_directory_with_checkpoints_or_another_finished_run(tmp_path):
    """fresh=true starts anew beside a run that has checkpoints but no results yet; without
    it, a finished run of another config is refused (not trained over), and a results.json
    cut short is no finished run; mode=params and mode=eval use the directory as it is."""
    from framework.cli import choose_run_dir, prepare_run_dir
    from framework.experiment import write_results

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run, 2, {"step": 2})
    assert choose_run_dir({**cfg, "fresh": True}, run) == tmp_path / "run-2"
    write_results(run, {"config_hash": "another"})
    with pytest.raises(ConfigError, match="holds a finished run with another config; pass "
                                          "fresh=true"):
        choose_run_dir(cfg, run)
    for mode in ("params", "eval"):
        assert prepare_run_dir({**cfg, "mode": mode}, run) == run
    (run / "results.json").write_text('{"config_hash": ')
    assert choose_run_dir(cfg, run) == run


def test_eval_with_evaluation_settings_finds_the_trained_run(tmp_path, monkeypatch, capsys):
    """Evaluation settings on the command line (task.final_segments=2) name Hydra's
    directory too: mode=eval evaluates the run of the same command without them (Hydra's
    own name for the rest; leaving out as few as find a run, the training command may have
    set some too), if it trained this config, and removes the empty directory Hydra made."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from framework import cli

    exclude = ["exp", "mode"]
    trained = ["+exp=mini_moe", "trainer.steps=30", "dataset.source=/d/x", "task.val_segments=1"]
    evaluated = [*trained, "mode=eval", "task.final_segments=2"]
    hydra_name = get_overrides_dirname(OverridesParser.create().parse_overrides(trained),
                                       exclude, ",", "=")
    one_out, both_out = cli.names_without_eval_settings(evaluated, exclude)
    assert cli.dirname(hydra_name) in one_out and len(one_out) == 2 and len(both_out) == 1
    assert cli.names_without_eval_settings(["+exp=mini_moe", "task.final_segments=2"],
                                           exclude) == [[""]]
    assert cli.names_without_eval_settings(trained[:3], exclude) == []

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    evaluate = {**cfg, "mode": "eval", "task": {**cfg["task"], "final_segments": 5}}
    base = tmp_path / "runs" / "exp"  # the default run lives here itself: no overrides

    def train(d, c=cfg):
        d.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(c), d / "config.yaml")
        save_checkpoint(d, 2, {"step": 2})

    train(base)
    train(base / "task.val_segments=4")  # a run nested in it, another evaluation setting
    train(base / "trainer.steps=3", {**cfg, "trainer": {**cfg["trainer"], "steps": 3}})
    assert cli.pick_trained(evaluate, base, [[""]]) == base
    assert cli.pick_trained(evaluate, base, [["trainer.steps=3"]]) is None  # trained else
    assert cli.pick_trained(evaluate, base, [["nothing", ""], ["task.val_segments=4"]]) == base
    assert cli.pick_trained(evaluate, base, [["", "task.val_segments=4"]]) is None  # no guess

    asked = base / "task.final_segments=5"
    asked.mkdir()
    monkeypatch.chdir(tmp_path)  # removable_up_to: a single run's empty parents up to here
    monkeypatch.setattr(cli, "trained_run_dir", lambda c, d: cli.pick_trained(c, base, [[""]]))
    assert cli.prepare_run_dir(evaluate, asked) == base and not asked.exists()
    assert f"mode=eval: evaluating the run in {base}" in capsys.readouterr().out
    asked.mkdir()
    (asked / "checkpoint_00000002.pt.bad").write_bytes(b"x")  # its own run, broken: said so
    assert cli.prepare_run_dir(evaluate, asked) == asked


def test_fresh_twice_after_a_finished_fresh_run_starts_a_third(tmp_path):
    """The newest sibling finished (same config): fresh=true starts a new one, it does not
    take that finished run up again."""
    from omegaconf import OmegaConf

    from framework.cli import choose_run_dir
    from framework.experiment import config_hash, write_results

    cfg = {**compose_cfg([*OVERRIDES, "trainer.steps=2"]), "fresh": True}
    run = tmp_path / "run"
    run.mkdir()
    write_results(run, {"config_hash": config_hash(cfg)})
    assert choose_run_dir(cfg, run) == tmp_path / "run-2"
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "run-2" / "config.yaml")  # as lm_run
    write_results(tmp_path / "run-2", {"config_hash": config_hash(cfg)})
    assert choose_run_dir(cfg, run) == tmp_path / "run-3"
