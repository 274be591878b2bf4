"""Sweep configs (configs/sweep/<table>.yaml, issue 6; docs/cluster.md).

Every sweep composes under the Slurm launcher and under the local one, expands (with
Hydra's own BasicSweeper) to exactly the experiments whose `paper:` block names its table
x seeds 0, 1, 2, and is what scripts/make_sweeps.py writes. The Slurm settings reach the
sbatch script, and the signal submitit sends before the time limit is one the trainer
checkpoints on. Real multiruns go through the local launcher end to end, one with a failing job.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit
import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from omegaconf import OmegaConf
from submitit.slurm.slurm import SlurmJobEnvironment

from scripts import make_sweeps
from sigma_moe.framework.config import ConfigError
from tests.helpers import TINY, TINY_MOE, compose_cfg, compose_sweep, jobs

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
TABLES = ["dense", "moe", "ablation", "pkm", "topk", "c4_pes2o"]
SLURM = "hydra_plugins.sigma_moe_launchers.SlurmLauncher"
LOCAL = "hydra_plugins.sigma_moe_launchers.LocalLauncher"


def paper_tables() -> dict[str, set[str]]:
    """table -> experiments naming it, read straight from configs/exp (not the generator)."""
    out: dict[str, set[str]] = {t: set() for t in TABLES}
    for path in (CONFIGS / "exp").glob("*.yaml"):
        for entry in (yaml.safe_load(path.read_text()).get("paper") or {}).get("entries", []):
            out.setdefault(entry["table"], set()).add(path.stem)
    return out


def test_sweep_files_are_up_to_date():
    assert make_sweeps.main(["--check"]) == 0, "run python scripts/make_sweeps.py"
    assert sorted(p.stem for p in make_sweeps.expected_files()) == sorted(TABLES)


@pytest.mark.parametrize("table", TABLES)
def test_sweep_runs_its_table_under_the_local_launcher(table):
    cfg = compose_sweep(table, "hydra/launcher=local")
    assert cfg.hydra.launcher._target_ == LOCAL
    assert cfg.hydra.launcher.timeout_min >= 60 * 24 * 365  # no limit: no timed-out runs
    assert cfg.sweep_name == table
    assert OmegaConf.select(cfg, "hydra.sweep.dir") == f"runs/sweeps/{table}"
    expected = paper_tables()[table]
    got = [(j["+exp"], j["trainer.seed"]) for j in jobs(cfg)]
    assert expected and len(got) == len(set(got)) == 3 * len(expected)
    assert set(got) == {(e, s) for e in expected for s in "012"}
    assert {e for e, _ in got} <= {p.stem for p in (CONFIGS / "exp").glob("*.yaml")}


def test_command_line_replaces_seeds_and_experiments():
    cfg = compose_sweep("moe", "hydra/launcher=local")
    got = jobs(cfg, "trainer.seed=range(5)", "+exp=e8_moe,wt103_small_moe")
    assert sorted((j["+exp"], j["trainer.seed"]) for j in got) == [
        (e, str(s)) for e in ("e8_moe", "wt103_small_moe") for s in range(5)]


@pytest.fixture
def srun_here(tmp_path, monkeypatch):
    """A stub srun on PATH (submitit insists on finding one), and tmp_path as the cwd."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)


def test_slurm_settings_reach_sbatch(tmp_path, monkeypatch, srun_here):
    cfg = compose_sweep("moe", "hydra.launcher.tasks_per_node=4",
                        "hydra.launcher.gpus_per_node=4", "hydra.job.name=run")
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_ == SLURM
    assert launcher_cfg.max_num_timeout > 0  # requeued after a time limit
    # the signal submitit sends signal_delay_s before the limit makes the trainer checkpoint
    assert f"SIG{SlurmJobEnvironment.USR_SIG}" in cfg.trainer.preempt_signals

    seen = {}

    class Submitted(Exception):
        pass

    def map_array(executor, fn, *args):
        seen["executor"], seen["n"] = executor, len(args[0])
        raise Submitted

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", map_array)
    launcher = instantiate(launcher_cfg)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(Submitted):
        launcher.launch([["+exp=e8_moe", "trainer.seed=0"], ["+exp=e8_moe", "trainer.seed=1"]],
                        initial_job_idx=0)
    slurm = seen["executor"]._executor
    assert seen["n"] == 2 and slurm.max_num_timeout == launcher_cfg.max_num_timeout
    sbatch = slurm._make_submission_file_text("CMD", "0").splitlines()
    for flag in (f"--signal=USR2@{launcher_cfg.signal_delay_s}",
                 f"--time={launcher_cfg.timeout_min}", "--ntasks-per-node=4",
                 "--gpus-per-node=4", f"--cpus-per-task={launcher_cfg.cpus_per_task}",
                 f"--mem={launcher_cfg.mem_gb}GB"):
        assert f"#SBATCH {flag}" in sbatch
    assert (tmp_path / "runs" / "sweeps" / "moe").is_dir()


def test_the_slurm_launcher_submits_only_the_unfinished_runs(tmp_path, monkeypatch, capsys,
                                                           srun_here):
    """A finished run where docs/cluster.md says a sweep writes it, with the config hash
    run.py gives it: not submitted again (it would take an allocation only to say so)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from sigma_moe.framework.experiment import config_hash

    run_dir = tmp_path / "runs" / "sweeps" / "moe" / "e8_moe" / "trainer.seed=0"
    run_dir.mkdir(parents=True)
    finished = compose_cfg(["+sweep=moe", "trainer.seed=0"], exp="e8_moe")
    (run_dir / "results.json").write_text(json.dumps({"config_hash": config_hash(finished)}))
    submitted = []
    monkeypatch.setattr(submitit.AutoExecutor, "map_array",
                        lambda executor, fn, *args: submitted.extend(args[0]) or [])
    # as BasicSweeper hands them over: the command line's overrides are every job's
    jobs = [["+sweep=moe", "+exp=e8_moe", f"trainer.seed={seed}"] for seed in (0, 1)]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["+sweep=moe"], return_hydra_config=True)
        launcher = instantiate(cfg.hydra.launcher)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                               callbacks=None)
        launcher.setup(hydra_context=context, task_function=None, config=cfg)
        assert launcher.launch(jobs, initial_job_idx=0) == []
        assert submitted == [jobs[1]]
        assert "1 of 2 runs already finished: not launched" in capsys.readouterr().err
        for extra in ("fresh=true", "mode=eval"):  # a new run beside it; its evaluation
            submitted.clear()
            launcher.launch([[*job, extra] for job in jobs], initial_job_idx=0)
            assert submitted == [[*job, extra] for job in jobs]
        # another config in that directory: the job is submitted (and says so itself)
        (run_dir / "results.json").write_text(json.dumps({"config_hash": "0" * 12}))
        submitted.clear()
        launcher.launch(jobs, initial_job_idx=0)
        assert submitted == jobs


def test_multirun_through_the_local_launcher(tmp_path):
    """The documented local command, restricted to one run; mode=params allocates nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "1"}
    run = [sys.executable, str(ROOT / "run.py")]
    out = subprocess.run(
        [*run, "-m", "+sweep=moe", "hydra/launcher=local", "+exp=e8_moe",
         "trainer.seed=1", "mode=params"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    sweep = tmp_path / "runs" / "sweeps" / "moe"
    # mode=params writes nothing, so its (empty) run directory is removed again
    assert not [p for p in sweep.glob("*/*") if not p.parts[-2].startswith(".")]
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.out"))
    assert "e8_moe [trainer.seed=1]: 41.24M parameters" in logs  # names the job

    # --cfg cannot go with -m in Hydra 1.3; without it, it shows the sweep's settings
    out = subprocess.run([*run, "+sweep=moe", "hydra/launcher=local", "--cfg", "hydra",
                          "-p", "hydra.sweeper.params"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    params = yaml.safe_load(out.stdout)
    assert {e.strip() for e in params["+exp"].split(",")} == paper_tables()["moe"]


def test_a_failing_job_does_not_end_a_local_sweep(tmp_path):
    """mini_moe (K=4) cannot have 2 experts, the Switch variant (K=1) can: the sweep runs
    both, names the failed job, and exits 1 at the end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "+exp=mini_moe,mini_enwik_switch",
         "ffn.n_experts=2", "mode=params"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    # the job after the failed one ran
    assert "mini_enwik_switch [ffn.n_experts=2]: 0.65M parameters" in out.stdout
    assert out.stderr.strip().splitlines() == [
        "error: ffn.k=4 must be between 1 and ffn.n_experts=2: lower ffn.k or raise "
        "ffn.n_experts [job +exp=mini_moe ffn.n_experts=2 mode=params; the sweep goes on]",
        "error: 1 job(s) of the sweep failed (see above): +exp=mini_moe ffn.n_experts=2 "
        "mode=params"]
    # neither job wrote anything: no empty directories are left in the sweep's
    assert [p.name for p in (tmp_path / "runs").rglob("*")] == ["sweeps", "multirun",
                                                                "multirun.yaml"]


def test_a_failing_job_is_one_line_under_the_local_launcher(tmp_path):
    """The same sweep through submitit (hydra_plugins/sigma_moe_launchers): every job is
    waited for, the failed one is one line naming its log (not submitit's traceback)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "+exp=mini_moe,mini_enwik_switch",
         "ffn.n_experts=2", "mode=params", "hydra/launcher=local"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    sweep = tmp_path / "runs" / "sweeps" / "multirun"
    logs = {p.parent.name: p.read_text() for p in (sweep / ".submitit").rglob("*_log.out")}
    assert len(logs) == 2
    assert any("mini_enwik_switch [ffn.n_experts=2]: 0.65M parameters" in t
               for t in logs.values())
    # the jobs are reported as they finish (either may be first), the failed one only once
    launched, *finished, summary = out.stderr.strip().splitlines()
    assert launched.startswith("launched 2 local jobs; their logs: ") and \
        launched.endswith("/.submitit/%j (%j: the job id)")
    done, error = sorted(finished)
    assert done == "done 2/2: +exp=mini_enwik_switch ffn.n_experts=2 mode=params" or \
        done == "done 1/2: +exp=mini_enwik_switch ffn.n_experts=2 mode=params"
    failed = re.fullmatch(
        r"error: ffn.k=4 must be between 1 and ffn.n_experts=2: lower ffn.k or raise "
        r"ffn.n_experts \[job \+exp=mini_moe ffn.n_experts=2 mode=params; log (\S+)\]", error)
    assert failed, error
    assert Path(tmp_path / failed[1]).read_text().strip() == error.split(" [job")[0]
    assert summary == ("error: 1 job(s) of the sweep failed (see above): +exp=mini_moe "
                       "ffn.n_experts=2 mode=params")


def test_a_relaunched_sweep_launches_only_its_unfinished_runs(tmp_path):
    """Finished runs are not started again, new ones are (fresh=true and mode=eval: the
    Slurm test below)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tiny = ["+exp=mini_moe", *TINY, *TINY_MOE, "trainer.steps=2", "trainer.val_every=2",
            "task.val_segments=1", "task.final_segments=1", "hydra/launcher=local"]

    def sweep(*overrides):
        out = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", *tiny, *overrides],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr

    assert "already finished" not in sweep("trainer.seed=0")
    assert len(list((tmp_path / "runs" / "sweeps").rglob("results.json"))) == 1
    err = sweep("trainer.seed=0,1")
    assert "1 of 2 runs already finished: not launched (fresh=true reruns them)" in err
    assert "launched 1 local jobs" in err and "done 1/1: " in err and "trainer.seed=1" in err
    assert len(list((tmp_path / "runs" / "sweeps").rglob("results.json"))) == 2


class FakeJob:
    """A finished submitit job: its log files, whether it left a result, and what submitit's
    results() would give."""

    def __init__(self, folder: Path, stderr: str | None, result=None,
                 raises: Exception | None = None, stdout: str = ""):
        folder.mkdir()
        self.paths = SimpleNamespace(stderr=folder / "7_0_log.err",
                                     stdout=folder / "7_0_log.out",
                                     result_pickle=folder / "7_0_result.pkl")
        if stderr is not None:  # None: stderr_to_stdout
            self.paths.stderr.write_text(stderr)
        self.paths.stdout.write_text(stdout)
        if raises is None:
            self.paths.result_pickle.write_bytes(b"")
        self.result, self.raises, self.asked = result, raises, False

    def done(self):
        return True

    def results(self):
        self.asked = True
        if self.raises is not None:
            raise self.raises
        return [self.result]


def test_the_launchers_report_each_kind_of_failure(tmp_path, monkeypatch, capsys):
    from submitit.core.utils import UncompletedJobError

    from hydra_plugins.sigma_moe_launchers import _Sweep
    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "FAILED_JOBS", [])

    def settled(job, overrides):  # what the plugin reads of a sweep of this one job
        return _Sweep(poll_s=0).add(job, overrides).results()

    def job_return(status, value):
        ret = JobReturn()
        ret.status, ret.return_value = status, value
        return ret

    done = job_return(JobStatus.COMPLETED, 3.5)
    for i, log in enumerate(["some warning\n", "error: printed, but the job finished\n"]):
        assert settled(FakeJob(tmp_path / f"ok{i}", log, done), ["+exp=a"]) == [done]
    assert capsys.readouterr().err == "done 1/1: +exp=a\n" * 2  # (stderr is no terminal)
    no_result = AssertionError("not asked: no result comes after an error line")
    bar = "train:   0%|          | 2/900 [00:01<09:00]"
    cases = [  # job, what its line says, its log file
        (FakeJob(tmp_path / "0", "warning\nerror: no dataset wt103: run prepare_data.py\n\n",
                 raises=no_result), "no dataset wt103: run prepare_data.py", "err"),
        # a progress bar redrawn with carriage returns, then srun's own line (Slurm)
        (FakeJob(tmp_path / "1", f"\r{bar}\r{bar}\nerror: diverged at step 3\n\r{bar}\n"
                 "srun: error: node01: task 0: Exited with exit code 1\n", raises=no_result),
         "diverged at step 3", "err"),
        (FakeJob(tmp_path / "2", None, raises=no_result, stdout="x\nerror: bad value\n"),
         "bad value", "out"),  # stderr_to_stdout
        (FakeJob(tmp_path / "3", "Traceback (most recent call last):\n  ...\nRuntimeError: a "
                 "bug\n", raises=UncompletedJobError("no output")),
         "stopped without a result; its log ends: RuntimeError: a bug", "err"),
        (FakeJob(tmp_path / "4", "", raises=UncompletedJobError("killed")),
         "stopped without a result", "err"),
        (FakeJob(tmp_path / "5", "", job_return(JobStatus.FAILED, ValueError("bad value"))),
         "ValueError: bad value", "err"),
        (FakeJob(tmp_path / "6", "", raises=UncompletedJobError("no log")),  # deleted below
         "stopped without a result before it started (no log)", "out"),
    ]
    for log in (tmp_path / "6").iterdir():  # a job that never started (Slurm: cancelled)
        log.unlink()
    for i, (job, line, log) in enumerate(cases):
        assert settled(job, [f"+exp=e{i}", "trainer.seed=0"]) == [None]
        assert capsys.readouterr().err == (
            f"error: {line} [job +exp=e{i} trainer.seed=0; log {tmp_path / str(i)}/7_0_log."
            f"{log}]\n")
    assert cli.FAILED_JOBS == [f"+exp=e{i} trainer.seed=0" for i in range(len(cases))]
    # with the launcher's setup lines (a local job whose setup failed leaves no log)
    job = FakeJob(tmp_path / "7", "", raises=UncompletedJobError("no log"))
    for log in (tmp_path / "7").iterdir():
        log.unlink()
    assert _Sweep(poll_s=0, setup=True).add(job, ["+exp=e"]).results() == [None]
    assert capsys.readouterr().err.startswith(
        "error: stopped without a result before it started (no log) (did a "
        "hydra.launcher.setup line fail?) [job +exp=e; log ")


@pytest.mark.parametrize("terminal", [False, True])
def test_a_sweep_reports_each_job_as_it_finishes(tmp_path, monkeypatch, capsys, terminal):
    """A failure is reported when it happens, not after the jobs submitted before it; the
    sweep's progress is a bar on a terminal, a `done i/N` line per finished job in a log."""
    from hydra_plugins.sigma_moe_launchers import _Sweep
    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "FAILED_JOBS", [])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    ok = JobReturn()
    ok.status, ok.return_value = JobStatus.COMPLETED, 1.0
    slow = FakeJob(tmp_path / "slow", "", ok)
    looks = iter([False, False, True])  # still running at the first two looks
    slow.done = lambda: next(looks)
    fails = FakeJob(tmp_path / "fails", "error: diverged at step 3\n",
                    raises=AssertionError("no result comes after an error line"))
    sweep = _Sweep(poll_s=0)
    jobs = [sweep.add(slow, ["+exp=a"]), sweep.add(fails, ["+exp=b"])]
    assert jobs[0].results() == [ok]  # the plugin reads them in submission order
    err = capsys.readouterr().err
    assert jobs[1].results() == [None] and capsys.readouterr().err == ""
    error = f"error: diverged at step 3 [job +exp=b; log {tmp_path}/fails/7_0_log.err]"
    if terminal:
        assert error in err and "sweep: 100%" in err and "2/2" in err and "1 failed" in err
        assert err.index(error) < err.index("sweep: 100%") and "done" not in err
    else:
        assert err.splitlines() == [error, "done 2/2: +exp=a"]
    assert cli.FAILED_JOBS == ["+exp=b"]


def test_a_sweep_counts_its_finished_jobs(tmp_path, monkeypatch, capsys):
    """In a log file, `done i/N`: i counts the jobs finished so far."""
    from hydra_plugins.sigma_moe_launchers import _Sweep
    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "FAILED_JOBS", [])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    ok = JobReturn()
    ok.status, ok.return_value = JobStatus.COMPLETED, 1.0
    sweep = _Sweep(poll_s=0)
    jobs = [sweep.add(FakeJob(tmp_path / n, "", ok), [f"+exp={n}"]) for n in "ab"]
    assert [j.results() for j in jobs] == [[ok], [ok]]
    assert capsys.readouterr().err.splitlines() == ["done 1/2: +exp=a", "done 2/2: +exp=b"]


def test_ctrl_c_while_waiting_for_slurm_jobs_is_one_line(monkeypatch, capsys, srun_here):
    cfg = compose_sweep("moe", "hydra.job.name=run")

    class Waiting:  # a submitted job; Ctrl-C comes while the launcher waits for it
        def __init__(self, job_id):
            self.job_id = job_id

        def done(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(submitit.AutoExecutor, "map_array",
                        lambda executor, fn, *args: [Waiting(f"123_{i}") for i in range(2)])
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(SystemExit) as e:
        launcher.launch([["+exp=e8_moe", "trainer.seed=0"], ["+exp=e8_moe", "trainer.seed=1"]],
                        initial_job_idx=0)
    assert e.value.code == 130
    launched, interrupted = capsys.readouterr().err.splitlines(keepends=True)
    assert launched.startswith("launched 2 slurm jobs; their logs: ")
    assert interrupted == (
        "interrupted; the Slurm jobs keep running (scancel 123 stops them); rerunning the "
        "same command skips the finished runs and resumes the others from their last "
        "checkpoints\n")


def test_a_submitit_job_logs_the_traceback_of_a_bug_and_exits_1(monkeypatch, capsys):
    from hydra_plugins.sigma_moe_launchers import said
    from sigma_moe.framework import cli

    for in_process in (False, True):
        monkeypatch.setattr(cli, "_sweep_job", lambda p=in_process: ("+exp=e8_moe", p))
        with pytest.raises(SystemExit if not in_process else RuntimeError) as e:
            with cli.handle_errors():
                raise RuntimeError("a bug\nin two lines")
        err = capsys.readouterr().err
        if not in_process:  # its launcher reads the last error line of its log
            assert e.value.code == 1 and err.startswith("Traceback")
            assert said(err) == "RuntimeError: a bug (traceback above)"
        else:  # the basic launcher's process sees the exception itself
            assert err == ""


def test_unknown_sweep_or_slurm_without_slurm_is_one_line(monkeypatch, capsys):
    from sigma_moe.framework import cli

    with pytest.raises(ConfigError, match=r"unknown sweep 'mni'. Did you mean mini\?"):
        cli.check_sweep("mni")
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)  # no srun here
    for args, sweep in ((["+exp=e8_dense"], "dense"), (["+exp=e8_moe", "hydra/launcher=slurm"],
                                                       None)):
        with pytest.raises(ConfigError, match="srun is not on this machine.*hydra/launcher=local"):
            cli.check_launcher(args, sweep)
    for args, sweep in ((["hydra/launcher=basic"], "dense"), ([], "mini"), ([], None),
                        (["hydra/launcher=local"], "moe"), (["hydra/launcher=joblib"], "moe")):
        cli.check_launcher(args, sweep)  # launchers that need no Slurm (or another plugin's)
    with pytest.raises(ConfigError) as e:
        cli.check_launcher(["hydra/launcher=lcoal"], "moe")
    assert str(e.value) == ("unknown launcher 'lcoal'. Did you mean local? Choose "
                            "hydra/launcher=local, slurm or basic (docs/cluster.md).")
    argv = ["run.py", "-m", "+sweep=dense", "+exp=e8_dense", "trainer.seed=0"]
    with pytest.raises(SystemExit) as e:
        cli.prepare_argv(argv)
    assert e.value.code == 1
    assert capsys.readouterr().err.count("\n") == 1  # one line
    with pytest.raises(SystemExit):  # Hydra refuses --cfg with -m, with a traceback
        cli.prepare_argv(["run.py", "-m", "+sweep=moe", "--cfg", "job"])
    assert "--cfg cannot go with -m" in capsys.readouterr().err


def test_ctrl_c_while_waiting_for_local_jobs_is_one_line(tmp_path, monkeypatch, capsys):
    """No Slurm jobs to scancel under the local launcher."""
    monkeypatch.chdir(tmp_path)
    cfg = compose_sweep("moe", "hydra/launcher=local", "hydra.job.name=run")

    class Waiting:  # a submitted job; Ctrl-C comes while the launcher waits for it
        job_id = "4242"

        def done(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(submitit.AutoExecutor, "map_array",
                        lambda executor, fn, *args: [Waiting() for _ in args[0]])
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(SystemExit) as e:
        launcher.launch([["+exp=e8_moe", "trainer.seed=0"]], initial_job_idx=0)
    assert e.value.code == 130
    launched, interrupted = capsys.readouterr().err.splitlines(keepends=True)
    assert launched.startswith("launched 1 local jobs; their logs: ")
    assert interrupted == ("interrupted; rerunning the same command skips the finished runs "
                           "and resumes the others from their last checkpoints\n")
