"""hydra-submitit-launcher's Slurm and local launchers, reporting each failed job in one line.

The plugin waits for the jobs in submission order and re-raises the first failure as
submitit's exception: about 26 lines of traceback with the job's own one-line error at the
end, and the later jobs' outcomes never read. These launchers wait for every job, print one
`error: ... [job <overrides>; log <its stderr file>]` line per failed job, and leave the exit
code to run.py (`framework.cli.exit_if_jobs_failed`), as a sweep under the basic launcher
does. Hydra instantiates launchers from the `hydra_plugins` namespace package only, hence
this package; it registers their configs as `slurm_base` and `local_base`, which
configs/hydra/launcher/{slurm,local}.yaml extend.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

from framework.cli import report_failed_job


def last_line(text: str) -> str | None:
    """The last non-blank line of a job's stderr: its `error: ...` line (framework.cli's
    handle_errors prints it, then exits 1) or the exception line of its traceback."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


class _Settled:
    """A submitted job as the plugin reads it (`job.results()[0]`), except that a failure is
    reported (and None returned) instead of raised: the plugin then reads every job."""

    def __init__(self, job: Any, overrides: Sequence[str]):
        self.job, self.label = job, " ".join(filter_overrides(overrides))

    def results(self) -> list[JobReturn | None]:
        from submitit.core.utils import UncompletedJobError

        self.job.wait()
        said = last_line(self.job.stderr() or "")
        if said is None or not said.startswith("error: "):
            # no error line of ours: a result is coming (submitit waits up to 15 s for the
            # file, which is why a job that said why it failed is not asked for one)
            try:
                ret = self.job.results()[0]
            except UncompletedJobError:  # a traceback, killed, or failed before its task
                last = last_line(self.job.stderr() or "")
                said = "stopped without a result" + (f"; its stderr ends: {last}" if last else "")
            else:
                if ret.status != JobStatus.FAILED:
                    return [ret]
                e = ret._return_value  # return_value would raise it
                said = f"{type(e).__name__}: {e}"
        report_failed_job(said.removeprefix("error: "), self.label,
                          f"log {self.job.paths.stderr}")
        return [None]


class _ReportEachJob(plugin.BaseSubmititLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        # The plugin builds the executor, submits and reads the results in one method; its
        # jobs are wrapped as they are submitted (map_array's first iterable: the overrides).
        submit = submitit.AutoExecutor.map_array

        def map_array(executor, fn, *iterables):
            return [_Settled(job, overrides)
                    for job, overrides in zip(submit(executor, fn, *iterables), iterables[0])]

        submitit.AutoExecutor.map_array = map_array
        try:
            returns = super().launch(job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = submit
        return [r for r in returns if r is not None]  # Hydra's sweeper re-raises failures


class SlurmLauncher(_ReportEachJob, plugin.SlurmLauncher):
    pass


class LocalLauncher(_ReportEachJob, plugin.LocalLauncher):
    pass


for name, conf in (("slurm_base", SlurmQueueConf(_target_=f"{__name__}.SlurmLauncher")),
                   ("local_base", LocalQueueConf(_target_=f"{__name__}.LocalLauncher"))):
    ConfigStore.instance().store(group="hydra/launcher", name=name, node=conf,
                                 provider="sigma_moe")
