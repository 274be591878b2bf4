"""Runs away from Linux: README says training and evaluation run on macOS and Windows (the
torch path, no Triton). Linux CI cannot be Windows; tests/windows_like.py takes away what a
Windows Python lacks (fcntl, resource, os.fchmod, SIGUSR1, fork) and each fallback is
checked on its own."""
import enum
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hydra_plugins.sigma_moe_launchers import LocalLauncher
from sigma_moe.framework import trainer_config
from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.trainer import handling
from sigma_moe.framework.trainer_config import TrainerConfig
from sigma_moe.tasks import lm_run

ROOT = Path(__file__).resolve().parent.parent


def test_a_run_trains_and_prepares_data_without_posix_only_modules(tmp_path):
    """The subword corpus built in 2 `spawn` processes into an unlocked cache, checkpoints
    written without fchmod, no SIGUSR1 to handle; the rerun finds the finished run."""
    cmd = [sys.executable, str(ROOT / "tests" / "windows_like.py"), "run.py",
           "+exp=mini_wiki_moe", "trainer.steps=3", "trainer.ckpt_every=2",
           "trainer.val_every=3", "task.final_segments=1", "dataset.num_proc=2",
           f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "SIGMA_MOE_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "run directories are not locked here (no fcntl.flock" in out.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 3 and results["metric"] == "ppl"
    ckpt = tmp_path / "run" / "checkpoint_00000002.pt"
    mask = os.umask(0)
    os.umask(mask)
    assert ckpt.stat().st_mode & 0o777 == 0o666 & ~mask  # chmod in place of fchmod
    assert len(list((tmp_path / "cache" / "wikitext_mini").glob("*/manifest.json"))) == 1
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "this run already finished" in again.stderr + again.stdout


def test_preempt_signals_that_windows_lacks_are_accepted_and_not_handled(monkeypatch):
    """The default (SIGUSR1, SIGUSR2, SIGTERM: Slurm's) is valid where there is no SIGUSR1;
    a name no system has is still refused; only the signals this platform has get the
    handler."""
    windows = enum.IntEnum("Signals", {"SIGINT": 2, "SIGTERM": 15, "SIGBREAK": 21})
    monkeypatch.setattr(trainer_config, "signal", types.SimpleNamespace(Signals=windows))
    TrainerConfig()
    with pytest.raises(ConfigError, match="no signal SIGFOO here"):
        TrainerConfig(preempt_signals=("SIGUSR1", "SIGFOO"))

    monkeypatch.delattr(signal, "SIGUSR1")
    with handling(("SIGUSR1", "SIGTERM"), lambda *a: None) as replaced:
        assert list(replaced) == [signal.SIGTERM]


class _NoProc:  # a Path whose /proc files do not exist (macOS, Windows)
    def __init__(self, *a):
        pass

    def read_text(self):
        raise FileNotFoundError("/proc/self/status")


@pytest.mark.parametrize("platform,maxrss", [("darwin", 3 * 2**30), ("freebsd14", 3 * 2**20)])
def test_peak_memory_without_proc_is_resources_in_its_units(monkeypatch, platform, maxrss):
    """ru_maxrss is in bytes on macOS, in KB on the other Unixes: 3 GB either way."""
    usage = types.SimpleNamespace(ru_maxrss=maxrss)
    fake = types.SimpleNamespace(RUSAGE_SELF=0, getrusage=lambda who: usage)
    monkeypatch.setattr(lm_run, "Path", _NoProc)
    monkeypatch.setitem(sys.modules, "resource", fake)
    monkeypatch.setattr(sys, "platform", platform)
    assert lm_run.peak_rss_mb() == 3 * 1024


def test_peak_memory_is_none_where_nothing_reports_it(monkeypatch):
    monkeypatch.setattr(lm_run, "Path", _NoProc)
    monkeypatch.setitem(sys.modules, "resource", None)
    assert lm_run.peak_rss_mb() is None


def test_the_local_launcher_says_to_leave_it_out_on_windows(monkeypatch, capsys):
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(SystemExit) as stop:
        LocalLauncher._start(object.__new__(LocalLauncher), [["trainer.seed=0"]], 0)
    assert stop.value.code == 1
    assert capsys.readouterr().err == (
        "error: hydra/launcher=local needs Linux or macOS; on Windows leave it out: -m then "
        "runs the sweep's jobs one after another in this process\n")
