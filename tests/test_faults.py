"""Never lose a run: each fault is injected and the outcome checked (issue 8).

Kill -9 (at a random step and in the middle of a checkpoint write), SIGTERM preemption,
corrupt checkpoints, an unwritable or full disk, and rerunning a finished run (NaN:
tests/test_divergence.py; the checkpoint module alone: tests/test_checkpoints.py).
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sigma_moe.framework.checkpoint import list_checkpoints, load_checkpoint
from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.trainer import Trainer
from sigma_moe.tasks import TASKS
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
import sigma_moe.framework.checkpoint as ck
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
from sigma_moe.framework.trainer import Trainer
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
    from sigma_moe.framework.data import DATASETS
    from sigma_moe.framework.data.enwik_mini import EnwikMiniConfig

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


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_eval_of_a_run_that_has_not_checkpointed_yet(tmp_path):
    """Its directory locked by the run training there: 'train this run first' would be
    wrong (and so would training it)."""
    import fcntl

    from sigma_moe.framework.run_dirs import hold_run_dir

    cfg = {**compose_cfg([*OVERRIDES, "trainer.steps=2"]), "mode": "eval"}
    with pytest.raises(ConfigError, match="; train this run first$"):
        RUN(cfg, tmp_path)
    # the ranks of one evaluation asking at once (a shared lock held) are no training run
    (tmp_path / ".lock").touch()  # as a training run leaves it
    fd = os.open(tmp_path / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        with pytest.raises(ConfigError, match="; train this run first$"):
            RUN(cfg, tmp_path)
    finally:
        os.close(fd)
    with hold_run_dir(tmp_path), pytest.raises(ConfigError) as e:  # as another process would
        RUN(cfg, tmp_path)
    assert re.fullmatch(
        rf"mode=eval: no checkpoint in {re.escape(str(tmp_path))} yet: a run trains there "
        r"\(pid \d+ on .+ since .+\); evaluate it once it has written one \(every "
        r"trainer.ckpt_every steps\)", str(e.value))


def test_no_loadable_checkpoint_stops_eval_and_training_until_the_user_decides(tmp_path,
                                                                               capsys):
    """Every checkpoint broken: mode=eval stops; training stops too (not a silent start from
    step 0 over the run's record), and so does every rerun, until one is repaired or
    fresh=true starts over beside it."""
    from sigma_moe.framework.checkpoint import CheckpointError
    from sigma_moe.framework.run_dirs import choose_run_dir

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
    with pytest.raises(ConfigError) as e:  # not "train this run first"
        RUN({**cfg, "mode": "eval"}, tmp_path)
    assert str(e.value) == (f"mode=eval: none of the 1 checkpoints in {tmp_path} loads (moved "
                            "aside as *.pt.bad); repair one and rename it back to *.pt")
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

    import sigma_moe.framework.checkpoint as ck

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
    from sigma_moe.framework.run_dirs import choose_run_dir

    assert choose_run_dir(compose_cfg(OVERRIDES), tmp_path / "run-2") is None
    assert (run_dir / "results.json").stat().st_mtime_ns == before


def test_same_seed_same_losses(tmp_path):
    cfg = compose_cfg([*OVERRIDES, "trainer.steps=3"])
    RUN(cfg, tmp_path / "a")
    RUN(cfg, tmp_path / "b")
    a, b = ((tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in "ab")
    strip = lambda rows: [{k: v for k, v in json.loads(r).items() if "time" not in k and  # noqa
                           "tokens_per_s" not in k} for r in rows]
    assert strip(a) == strip(b)


def test_a_run_resumes_with_another_grad_accum(tmp_path):
    """Out of memory: rerun with trainer.grad_accum=2, the same run (same batch per step)."""
    from sigma_moe.framework.run_dirs import choose_run_dir

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
    from sigma_moe.tasks.lm import check_batch_split

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
