"""The local sweep jobs' controller (hydra_plugins/sigma_moe_launchers/local_controller.py):
each Ctrl-C the launcher passes on reaches a job's task exactly once, one before the task
starts stops the job there (without a traceback), and a launcher that dies stops its jobs
(once: not again after a Ctrl-C it passed on). A stand-in task counts the SIGINTs it gets
(tests/test_sweeps.py: real training jobs). POSIX only (process groups, signal masks)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from submitit.local import local

from hydra_plugins.sigma_moe_launchers import _ControllerStarter

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
ROOT = Path(__file__).resolve().parent.parent
# a job's task: says it is up, then counts the SIGINTs that come within 2.5 s of the first
# (longer than the controller takes to see its launcher gone)
TASK = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
got = []
signal.signal(signal.SIGINT, lambda *a: got.append(1))
out.with_suffix(".up").write_text("")
while not got:
    time.sleep(0.05)
time.sleep(2.5)
out.write_text(str(len(got)))
"""


# the launcher's `setup` lines: none, or some (submitit then starts the controller in a shell)
SETUPS = [(), ("true", "export SETUP_RAN=1")]


def start(folder: Path, starter: _ControllerStarter, setup: tuple[str, ...] = ()
          ) -> subprocess.Popen:
    """A job as the local launcher starts it: submitit's start_controller, our controller."""
    command = subprocess.list2cmdline([sys.executable, "-c", TASK, str(folder / "count")])
    with mock.patch.object(local, "subprocess", starter):
        return local.start_controller(folder=folder, command=command, timeout_min=5,
                                      setup=setup)


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)


@pytest.mark.parametrize("setup", SETUPS)
def test_each_ctrl_c_reaches_the_task_once(tmp_path, setup):
    """submitit's own controller would send a second SIGINT and then SIGKILL."""
    starter = _ControllerStarter(n_jobs=1)
    job = start(tmp_path, starter, setup)
    wait_for(tmp_path / "count.up")
    assert starter.interrupt() == [job]
    assert job.wait(timeout=30) == 0
    assert (tmp_path / "count").read_text() == "1"
    assert (tmp_path / f"{job.pid}_0_log.out").exists()  # the job's id names its logs


@pytest.mark.parametrize("setup", [*SETUPS, ("touch {up}", "sleep 1")])
def test_a_ctrl_c_before_the_task_starts_stops_the_job_quietly(tmp_path, capfd, setup):
    """The controller starts with SIGINT blocked: a Ctrl-C at once is no traceback of
    Python's start, and no task starts after it; nor after one during the setup lines."""
    starter = _ControllerStarter(n_jobs=1)
    up = tmp_path / "setup.up"
    job = start(tmp_path, starter, tuple(line.format(up=up) for line in setup))
    if "sleep 1" in setup:
        wait_for(up)
    starter.interrupt()
    assert job.wait(timeout=30) == 128 + signal.SIGINT
    assert not (tmp_path / "count.up").exists()
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(("ctrl_c_first", "setup"), [(False, ()), (True, ()),
                                                     (False, SETUPS[1])])
def test_a_job_whose_launcher_dies_is_stopped_once(tmp_path, ctrl_c_first, setup):
    """A launcher that dies (after passing on a Ctrl-C, or not) leaves its job one SIGINT:
    a second would stop it before its checkpoint."""
    launcher = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from tests.test_local_controller import _ControllerStarter, start, wait_for
folder = Path({str(tmp_path)!r})
starter = _ControllerStarter(n_jobs=1)
print(start(folder, starter, {setup!r}).pid, flush=True)
wait_for(folder / "count.up")
if {ctrl_c_first}:
    starter.interrupt()
"""  # and dies, leaving its job
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    wait_for(tmp_path / "count")
    assert (tmp_path / "count").read_text() == "1"
    deadline = time.monotonic() + 30
    while alive(int(out.stdout)):  # the controller ends with its task
        assert time.monotonic() < deadline, "the controller runs on"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Running (not a zombie that no one reaps: PID 1 of a container may not)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.parent.parent.joinpath("self").exists():  # no /proc (macOS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_the_jobs_share_the_cores():
    cores = _ControllerStarter(n_jobs=1).threads
    assert int(cores) == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else os.cpu_count())
    assert _ControllerStarter(n_jobs=10 * int(cores)).threads == "1"
