"""Ctrl-C at a local sweep's terminal, end to end: real tiny training jobs under the local
launcher checkpoint and stop, also after the launcher's setup lines; a launcher that dies
stops its jobs the same way (hydra_plugins/sigma_moe_launchers)."""
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from sigma_moe.framework.cli import OVERRIDES, dirname
from tests.helpers import TINY, TINY_MOE
from tests.test_faults import sigint_as_from_a_terminal

ROOT = Path(__file__).resolve().parent.parent


def _start_training_sweep(cwd: Path, started: list[subprocess.Popen], resumed: bool = False,
                          extra: Sequence[str] = ()) -> tuple[subprocess.Popen, Path]:
    """Two tiny training jobs under the local launcher, in a session of their own (as at a
    terminal), that train until stopped; returned once both train (have trained a step, or
    `resumed`: have resumed from their checkpoints). The launcher goes into `started`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "-m", "+exp=mini_moe", "trainer.seed=0,1",
         "hydra/launcher=local", *TINY, *TINY_MOE, "trainer.steps=1000000",
         "trainer.ckpt_every=1000000", "trainer.val_every=1000000", "trainer.log_every=1",
         *extra],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=sigint_as_from_a_terminal)
    started.append(launcher)
    sweep = cwd / "runs" / "sweeps" / "multirun"
    deadline = time.monotonic() + 120

    def training() -> int:
        if resumed:
            return sum("resumed from step" in p.read_text() for p in sweep.rglob("*_log.out"))
        return sum(p.stat().st_size > 0 for p in sweep.glob("mini_moe/*/metrics.jsonl"))

    while training() < 2:
        assert launcher.poll() is None, launcher.communicate(timeout=30)[1][-2000:]
        assert time.monotonic() < deadline, "the jobs have not started training"
        time.sleep(0.5)
    return launcher, sweep


def _steps_checkpointed(sweep: Path) -> list[list[int]]:
    """The steps of each run's checkpoints."""
    return [sorted(int(p.stem.split("_")[1]) for p in run.glob("checkpoint_*.pt"))
            for run in sorted(sweep.glob("mini_moe/*"))]


@pytest.mark.parametrize("setup", [False, True])
def test_ctrl_c_stops_local_jobs_with_a_checkpoint(tmp_path, setup):
    """Ctrl-C at the launcher's terminal: each training job finishes its step, checkpoints
    and stops (submitit's own controller would kill it at once), and the launcher says so;
    also after the launcher's `setup` lines. A launcher that dies stops its
    jobs the same way, once: they do not run on unseen."""
    started: list[subprocess.Popen] = []
    extra = [f"hydra.launcher.setup=[':','echo ran >> {tmp_path}/setup.log']"] if setup else []
    try:
        launcher, sweep = _start_training_sweep(tmp_path, started, extra=extra)
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, err[-2000:]
        assert err.splitlines()[-2:] == [
            "interrupted: the 2 running job(s) finish their step, write a checkpoint and stop "
            "(Ctrl-C again stops them at once, losing their steps since the last checkpoint)",
            "interrupted; rerunning the same command skips the finished runs and resumes the "
            "others from their last checkpoints"]
        steps = _steps_checkpointed(sweep)
        assert len(steps) == 2 and all(len(s) == 1 and s[0] >= 1 for s in steps), steps
        logs = "".join(p.read_text() for p in sweep.rglob("*_log.err"))
        assert logs.count("SIGINT at step ") == 2 and "Traceback" not in logs
        for run in sweep.glob("mini_moe/*"):  # each recorded its overrides, uncut
            recorded = yaml.safe_load((run / OVERRIDES).read_text())
            assert dirname(recorded["dirname"]) == run.name != recorded["dirname"]  # cut
            assert "+exp=mini_moe" in recorded["overrides"]
            assert any(o.startswith("trainer.seed=") for o in recorded["overrides"])
        if setup:
            assert (tmp_path / "setup.log").read_text() == "ran\n" * 2
            return  # the launcher's death below: as without setup lines

        launcher, sweep = _start_training_sweep(tmp_path, started, resumed=True)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while not all(len(s) == 2 for s in _steps_checkpointed(sweep)):  # a newer one each
            assert time.monotonic() < deadline, _steps_checkpointed(sweep)
            time.sleep(0.5)
    finally:  # a failed test leaves nothing training on: the launchers, and the jobs'
        # processes (their command lines name their folder in tmp_path)
        for launcher in started:
            launcher.kill()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if str(tmp_path).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):  # ended meanwhile
                pass
