"""What a user's mistake or the machine's trouble prints (sigma_moe/framework/cli.py handle_errors):
one line, exit 1, said once under torchrun; and which disk errors are the user's to fix."""

import pytest

from sigma_moe.framework.config import ConfigError


def test_a_full_or_read_only_disk_is_one_line(monkeypatch, capsys):
    """An OSError the user fixes outside the code (a read-only or full disk, a quota, a
    permission) is one line; any other OSError keeps its traceback (it may be a bug)."""
    import errno

    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "_sweep_job", lambda: None)
    with pytest.raises(SystemExit) as e:
        with cli.handle_errors():
            raise OSError(errno.ENOSPC, "No space left on device", "/scratch/cache/wt103")
    assert e.value.code == 1
    assert capsys.readouterr().err == (
        "error: [Errno 28] No space left on device: '/scratch/cache/wt103'\n")
    with pytest.raises(FileNotFoundError):
        with cli.handle_errors():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")


def test_a_job_out_of_requeues_says_how_to_go_on(monkeypatch, capsys):
    """submitit's SIGUSR2 handler (which the trainer calls after its checkpoint) raises this
    at the last time limit: a traceback and "(traceback above)" said "a bug"."""
    from submitit.core.utils import UncompletedJobError

    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "_sweep_job", lambda: None)
    with pytest.raises(SystemExit) as e:
        with cli.handle_errors():
            raise UncompletedJobError("Job not requeued because: timed-out too many times.")
    assert e.value.code == 1
    assert capsys.readouterr().err == (
        "error: Job not requeued because: timed-out too many times: the run's last checkpoint "
        "is kept, and relaunching the same command resumes it (more requeues: "
        "hydra.launcher.max_num_timeout, or a longer timeout_min)\n")


def test_under_torchrun_rank_0_says_what_every_rank_found(monkeypatch, capsys):
    """Every rank reaches the same config verdict: rank 0 prints it, the others exit 1
    silently (their copies came out glued to it); an error of a rank's own names its rank."""
    from sigma_moe.framework import cli
    from sigma_moe.framework.checkpoint import CheckpointError
    from sigma_moe.framework.data import DataError

    monkeypatch.setattr(cli, "_sweep_job", lambda: None)
    for rank, local, error, said in (
            ("1", "1", ConfigError("bad batch"), ""),
            ("0", "0", ConfigError("bad batch"), "error: bad batch\n"),
            ("1", "1", CheckpointError("disk"), "rank 1: error: disk\n"),
            # rank 0's verdict, broadcast: every rank raises it
            ("1", "1", CheckpointError("cannot write", shared=True), ""),
            # the data lives on each node: its first rank says what is missing there
            ("1", "1", DataError("no wt103"), ""),
            ("2", "0", DataError("no wt103"), "rank 2: error: no wt103\n")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local)
        with pytest.raises(SystemExit) as e:
            with cli.handle_errors():
                raise error
        assert e.value.code == 1 and capsys.readouterr().err == said


@pytest.mark.parametrize("rank,said", [("0", "interrupted; rerunning the same command "
                                        "resumes from the last checkpoint, if one was "
                                        "written\n"), ("1", "")])
def test_a_ctrl_c_before_training_is_said_once(monkeypatch, capsys, rank, said):
    from sigma_moe.framework import cli

    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as e:
        with cli.handle_errors():
            raise KeyboardInterrupt
    assert e.value.code == 130 and capsys.readouterr().err == said


@pytest.mark.parametrize("env,said", [({}, True), ({"RANK": "0"}, True),
                                      ({"RANK": "1"}, False), ({"SLURM_PROCID": "1"}, False)])
def test_a_bad_command_line_is_said_by_rank_0(monkeypatch, capsys, env, said):
    """Every rank parses the same argv, before the process group exists."""
    from sigma_moe.framework.cli import prepare_argv

    for k in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        prepare_argv(["run.py", "ffn.n_expert=3"])
    assert e.value.code == 1
    assert bool(capsys.readouterr().err) == said


def test_code_without_its_configs_says_how_to_install(monkeypatch, capsys, tmp_path):
    """A plain `pip install .` copies the packages, not configs/ (nor run.py)."""
    from sigma_moe.framework import cli

    monkeypatch.setattr(cli, "CONFIGS", tmp_path / "site-packages" / "configs")
    with pytest.raises(SystemExit) as e:
        cli.prepare_argv(["run.py"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1
    assert "no configs/ at" in err and "pip install -e ." in err


@pytest.mark.parametrize("code", ["EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT"])
def test_which_os_errors_the_user_fixes_outside_the_code(code):
    import errno

    from sigma_moe.framework.config import is_environment_error

    assert is_environment_error(OSError(getattr(errno, code), "x"))
    assert not is_environment_error(OSError(errno.ENOENT, "x"))
    assert not is_environment_error(ValueError("x"))
