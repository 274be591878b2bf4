"""hydra-submitit-launcher's Slurm and local launchers, reporting each failed job in one line.

The plugin waits for the jobs in submission order and re-raises the first failure as
submitit's exception: about 26 lines of traceback with the job's own one-line error at the
end, and the later jobs' outcomes never read. These launchers wait for every job, print one
`error: ... [job <overrides>; log <its log file>]` line per failed job as it fails, and leave
the exit code to run.py (`sigma_moe.framework.cli.exit_if_jobs_failed`), as a sweep under
the basic launcher does. A job that fails ends its log with such a line
(sigma_moe.framework.cli's handle_errors). While they wait they show the sweep's progress: a
bar on a terminal, a `done i/N: <overrides>` line per finished job in a log file. A Ctrl-C
stops the local jobs with a checkpoint (local_controller.py says how). A relaunched sweep
submits only the runs that have not finished (`finished_run`).

Hydra instantiates launchers from the `hydra_plugins` namespace package only, hence this
package; it registers their configs as `slurm_base` and `local_base`, which
configs/hydra/launcher/{slurm,local}.yaml extend. Hydra imports it on every start (plugin
discovery), so it imports nothing heavy at the top.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

from hydra_plugins.sigma_moe_launchers.local_controller import LAUNCHER_PID

TAIL_BYTES = 1 << 16  # of a log, enough for its last lines (training logs can be long)


def log_tail(job: Any) -> tuple[Path, str]:
    """(the job's log file, its last TAIL_BYTES): stderr, or stdout under stderr_to_stdout."""
    path = job.paths.stderr if job.paths.stderr.exists() else job.paths.stdout
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            return path, f.read().decode(errors="replace")
    except OSError:  # not written (yet: a file system that lags)
        return path, ""


def said(log: str, prefix: str = "error: ") -> str | None:
    """The job's last non-blank line starting with `prefix` (its `error: ...` line), without
    it; None when there is none. Lines split at carriage returns too: a progress bar redraws
    its line with them; srun appends its own `srun: error: ...` lines after the job's."""
    lines = (ln.strip() for ln in reversed(log.splitlines()))
    return next((ln.removeprefix(prefix) for ln in lines if ln and ln.startswith(prefix)), None)


class _Settled:
    """A submitted job as the plugin reads it (`job.results()[0]`), except that a failure is
    reported (and None returned) instead of raised: the plugin then reads every job."""

    def __init__(self, job: Any, overrides: Sequence[str], sweep: _Sweep):
        self.job, self.label, self.sweep = job, " ".join(filter_overrides(overrides)), sweep
        self.outcome: list[JobReturn | None] | None = None  # set once it has finished

    def results(self) -> list[JobReturn | None]:
        self.sweep.wait_for(self)
        return self.outcome

    def settle(self) -> bool:
        """Read the finished job's outcome; report it if it failed. -> whether it did."""
        from submitit.core.utils import UncompletedJobError
        from tqdm import tqdm

        from sigma_moe.framework.cli import report_failed_job
        from sigma_moe.framework.config import first_line

        path, log = log_tail(self.job)
        line = said(log)
        # A job with a result file finished (or submitit caught its exception). One without
        # and with an error line exited 1 after it: no result will come, and submitit would
        # wait 15 s for one (the file may lag on a network file system: without an error
        # line, that wait is worth it).
        if self.job.paths.result_pickle.exists() or line is None:
            try:
                ret = self.job.results()[0]
            except UncompletedJobError:  # killed, timed out, or failed outside its task
                path, log = log_tail(self.job)
                last = said(log, prefix="")
                setup = " (did a hydra.launcher.setup line fail?)" if self.sweep.setup else ""
                line = said(log) or ("stopped without a result" + (
                    f"; its log ends: {last}" if last else "" if path.exists() else
                    f" before it started (no log){setup}"))
            else:
                if ret.status != JobStatus.FAILED:
                    self.outcome = [ret]
                    return False
                e = ret._return_value  # return_value would raise it
                line = f"{type(e).__name__}: {first_line(e)}"
        with tqdm.external_write_mode(file=sys.stderr):  # the sweep's bar out of the way
            report_failed_job(line, self.label, f"log {path}")
        self.outcome = [None]
        return True


class _Sweep:
    """The submitted jobs, settled as they finish (in any order: a failure is reported when
    it happens, not after the jobs submitted before it), with the sweep's progress on stderr.
    `job.done()` is cheap: a stat of the result file, and submitit's own rate-limited sacct."""

    def __init__(self, poll_s: float, setup: bool = False):
        self.jobs: list[_Settled] = []
        self.poll_s, self.finished, self.failed, self.bar = poll_s, 0, 0, None
        self.setup = setup  # the jobs run the launcher's setup lines first

    def add(self, job: Any, overrides: Sequence[str]) -> _Settled:
        self.jobs.append(_Settled(job, overrides, self))
        return self.jobs[-1]

    def wait_for(self, job: _Settled) -> None:
        from tqdm import tqdm

        if self.bar is None:  # a bar on a terminal; into a log file, a line per job (below)
            self.bar = tqdm(total=len(self.jobs), desc="sweep", unit="job", file=sys.stderr,
                            dynamic_ncols=True, disable=not sys.stderr.isatty())
        while job.outcome is None:
            done = [j for j in self.jobs if j.outcome is None and j.job.done()]
            for j in done:
                failed = j.settle()  # a failure says so itself, in one line
                self.finished, self.failed = self.finished + 1, self.failed + failed
                self.bar.set_postfix_str(f"{self.failed} failed" if self.failed else "",
                                         refresh=False)
                self.bar.update()
                if self.bar.disable and not failed:
                    print(f"done {self.finished}/{len(self.jobs)}: {j.label}", file=sys.stderr)
            if not done:
                time.sleep(self.poll_s)
        if self.finished == len(self.jobs):
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def finished_run(hydra_context: Any, sweep_config: Any, overrides: Sequence[str]) -> bool:
    """Whether the run these overrides train already finished with this config: the job
    would only say so (run.py), after its allocation and start. Read here, as the job would
    read it: its run directory (Hydra's sweep.dir/sweep.subdir) and config hash. A fresh=true
    or mode=eval job, or one whose config does not compose here, is left to the job."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict, read_write

    from sigma_moe.framework.experiment import finished_as, read_results

    hydra_config = HydraConfig.instance()
    launcher_cfg = hydra_config.cfg
    try:
        cfg = hydra_context.config_loader.load_sweep_config(sweep_config, list(overrides))
        hydra_config.set_config(cfg)  # the sweep subdir and ${hydra:...} resolve from it
        run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        task_cfg = copy.deepcopy(cfg)  # as run_job hands it to run.py's main
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        plain = OmegaConf.to_container(task_cfg, resolve=True)
    except Exception:  # the job reports it in its one line
        return False
    finally:
        hydra_config.cfg = launcher_cfg
    if plain.get("mode", "train") != "train" or plain.get("fresh"):
        return False
    return finished_as(read_results(run_dir), plain)


class _ReportEachJob(plugin.BaseSubmititLauncher):
    POLL_S = 1.0  # between looks at the jobs that are still running

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        """The jobs whose runs have not finished: a relaunched sweep (after a failure or a
        Ctrl-C) submits only those, not an allocation for each finished run to find so."""
        from tqdm import tqdm

        # ~0.1 s a job (Hydra composes its config): a bar for a large sweep on a terminal
        pending = [o for o in tqdm(job_overrides, desc="finished runs", unit="run",
                                   leave=False, disable=not sys.stderr.isatty())
                   if not finished_run(self.hydra_context, self.config, o)]
        if len(pending) < len(job_overrides):
            print(f"{len(job_overrides) - len(pending)} of {len(job_overrides)} runs already "
                  f"finished: not launched (fresh=true reruns them)", file=sys.stderr)
        return self._start(pending, initial_job_idx) if pending else []

    def _start(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        return self._launch(job_overrides, initial_job_idx, stop_jobs=lambda: None)

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
                stop_jobs: Callable[[], None]) -> Sequence[JobReturn]:
        """The plugin's launch; after a Ctrl-C, `stop_jobs()` (Slurm's keep running).
        Nothing of it is kept on `self`: submitit pickles the launcher into every job."""
        from unittest import mock

        import submitit

        # The plugin (tested with 1.2.0) builds the executor, submits and reads the results
        # in one method; its jobs are wrapped as they are submitted (map_array's first
        # iterable: the overrides).
        submit = submitit.AutoExecutor.map_array
        sweep = _Sweep(poll_s=self.POLL_S, setup=bool(self.params.get("setup")))

        def map_array(executor, fn, *iterables):
            settled = [sweep.add(job, overrides) for job, overrides
                       in zip(submit(executor, fn, *iterables), iterables[0])]
            if settled:  # a sweep that says nothing for an hour looks hung
                print(f"launched {len(settled)} {self._EXECUTOR} jobs; their logs: "
                      f"{executor.folder} (%j: the job id)", file=sys.stderr)
            return settled

        try:
            with mock.patch.object(submitit.AutoExecutor, "map_array", map_array):
                returns = super().launch(job_overrides, initial_job_idx)
        except KeyboardInterrupt:  # one line, not the traceback of submitit's wait loop
            sweep.close()
            stop_jobs()
            ids = sorted({str(s.job.job_id).split("_")[0] for s in sweep.jobs})
            running = (f"the Slurm jobs keep running (scancel {' '.join(ids)} stops them); "
                       if self._EXECUTOR == "slurm" and ids else "")
            print(f"interrupted; {running}rerunning the same command skips the finished runs "
                  f"and resumes the others from their last checkpoints", file=sys.stderr)
            sys.exit(130)
        return [r for r in returns if r is not None]  # Hydra's sweeper re-raises failures


class SlurmLauncher(_ReportEachJob, plugin.SlurmLauncher):
    POLL_S = 10.0  # a look is a stat of each job's result file, on a network file system


class _ControllerStarter:
    """`subprocess` as submitit.local.local's start_controller sees it while the local
    launcher submits: a job's controller is local_controller.py, in a session of its own
    (with SIGINT blocked until it can take one), also after the launcher's `setup` lines.
    A command it does not know (another submitit) starts as before.

    Each job gets the CPU cores split between the jobs (OMP_NUM_THREADS, unless set): with
    a thread a core each, jobs that share the cores run many times slower than alone."""

    COMMAND = ["-m", "submitit.local._local"]  # [python, *COMMAND, folder] (submitit 1.5)

    def __init__(self, n_jobs: int):
        self.started: list[subprocess.Popen] = []
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.threads = str(max(1, cores // max(1, n_jobs)))

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def controller(self, cmd: Any, shell: bool = False) -> list[str] | str | None:
        """Our controller's command for submitit's `cmd`; None for another command. With
        `setup` lines, submitit runs `setup && ... && <controller>` in a shell: the shell
        then execs ours, so that the process started is the controller (its parent the
        launcher), and a Ctrl-C during the setup lines stays pending for it (SIGINT is
        blocked in the shell and its commands, if the shell is bash: dash unblocks it;
        a pending signal survives exec)."""
        script = str(Path(__file__).with_name("local_controller.py"))
        if not shell:
            ok = isinstance(cmd, list) and len(cmd) == 4 and cmd[1:3] == self.COMMAND
            return [cmd[0], script, cmd[3]] if ok else None
        setup, _, last = cmd.rpartition(" && ") if isinstance(cmd, str) else ("", "", "")
        try:
            ours = self.controller(shlex.split(last)) if setup else None
        except ValueError:  # " && " inside a quoted word: not submitit's command
            return None
        return f"{setup} && exec {shlex.join(ours)}" if ours else None

    def Popen(self, cmd: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802 (subprocess's)
        ours = self.controller(cmd, kwargs.get("shell", False))
        if ours is None:
            return subprocess.Popen(cmd, **kwargs)
        env = {"OMP_NUM_THREADS": self.threads, **(kwargs.pop("env", None) or os.environ),
               LAUNCHER_PID: str(os.getpid())}
        if kwargs.get("shell"):  # bash, as the Slurm jobs' setup lines run in (sbatch script)
            kwargs["executable"] = shutil.which("bash") or kwargs.get("executable")
            # the controller is the shell's process, not its child: its job id (the
            # Popen's pid, which names the logs) is its own pid, not its parent's
            env["SUBMITIT_LOCAL_WITH_SHELL"] = ""
        # The child inherits this thread's mask: SIGINT blocked. A Ctrl-C meanwhile (which
        # another thread, torch's, may take) is raised once the job is in `started`, to be
        # passed on.
        caught: list[int] = []
        handler = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc = subprocess.Popen(ours, env=env, start_new_session=True, **kwargs)
            self.started.append(proc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            signal.signal(signal.SIGINT, handler)
        if caught:
            raise KeyboardInterrupt
        return proc

    def interrupt(self) -> list[subprocess.Popen]:
        """SIGINT to every running job's processes. -> those jobs."""
        running = [p for p in self.started if p.poll() is None]
        for proc in running:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # ended meanwhile
                pass
        return running

    def stop(self) -> None:
        """After a Ctrl-C: pass it on to the running jobs and wait for them to checkpoint and
        stop; a second Ctrl-C passes on too (they stop at once), and ends the wait."""
        try:
            running = self.interrupt()
            if not running:
                return
            print(f"interrupted: the {len(running)} running job(s) finish their step, write "
                  f"a checkpoint and stop (Ctrl-C again stops them at once, losing their "
                  f"steps since the last checkpoint)", file=sys.stderr)
            while any(p.poll() is None for p in running):
                time.sleep(0.2)
        except KeyboardInterrupt:
            self.interrupt()


class LocalLauncher(_ReportEachJob, plugin.LocalLauncher):
    def _start(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        if sys.platform == "win32":  # process groups and POSIX signals, here and in submitit
            print("error: hydra/launcher=local needs Linux or macOS; on Windows leave it out: "
                  "-m then runs the sweep's jobs one after another in this process",
                  file=sys.stderr)
            sys.exit(1)
        from unittest import mock

        from submitit.local import local

        controllers = _ControllerStarter(len(job_overrides))
        with mock.patch.object(local, "subprocess", controllers):
            return self._launch(job_overrides, initial_job_idx, stop_jobs=controllers.stop)


@dataclass
class LocalConf(LocalQueueConf):
    # shell lines (bash) run before each job, as Slurm's `setup` runs before srun; the
    # plugin's local config has no such key, though submitit's local executor takes one
    setup: list[str] | None = None


for name, conf in (("slurm_base", SlurmQueueConf(_target_=f"{__name__}.SlurmLauncher")),
                   ("local_base", LocalConf(_target_=f"{__name__}.LocalLauncher"))):
    ConfigStore.instance().store(group="hydra/launcher", name=name, node=conf,
                                 provider="sigma_moe")
