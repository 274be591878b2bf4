"""Run directories (issue 8: never lose a run): which directory a command trains or
evaluates in, and what it refuses. A finished run is not retrained; fresh=true starts a
sibling and its rerun resumes that one; checkpoints or a start of another config are not
trained over; an earlier version's config hash is still this run's; mode=eval finds the run
its command trained; a directory a run trains in now is locked (tests/test_faults.py: the
faults themselves)."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sigma_moe.framework.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.experiment import run_hashes
from tests.helpers import compose_cfg, metrics
from tests.test_faults import OVERRIDES, RUN


def test_a_directory_another_run_started_in_is_not_taken_over(tmp_path):
    """No checkpoint yet, but a config.yaml of another config (or a metrics.jsonl without
    one): refused, nothing rewritten; an earlier start of this same config (stopped before
    its first checkpoint) is started over, its metrics.jsonl rows replaced, not appended."""
    from omegaconf import OmegaConf

    from sigma_moe.framework.run_dirs import choose_run_dir

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
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == {
        "metrics.jsonl": before["metrics.jsonl"]}  # (.lock: hold_run_dir's, while it chose)
    assert choose_run_dir({**cfg, "fresh": True}, run) == tmp_path / "run-2"
    # an earlier start of this config: its rows go, the new run's are the record
    OmegaConf.save(OmegaConf.create(cfg), run / "config.yaml")
    assert choose_run_dir(cfg, run) == run
    RUN(cfg, run)
    rows = metrics(run)
    assert all("time" in row for row in rows)  # the stale {"step": 1} row is gone
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2]


def test_fresh_resumes_its_own_unfinished_run(tmp_path):
    """An interrupted (or requeued) fresh=true command resumes the sibling it started, as
    the interrupt message says; a finished sibling or one of another config gets a new one."""
    from omegaconf import OmegaConf

    from sigma_moe.framework.experiment import config_hash, write_results
    from sigma_moe.framework.run_dirs import choose_run_dir

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


@pytest.mark.parametrize("earlier", [0, 1])
def test_runs_hashed_by_an_earlier_version_are_still_this_run(tmp_path, earlier):
    """nan_policy, then grad_accum left the run identity later: runs started before keep
    their old hash and must still resume, and count as finished."""
    from sigma_moe.framework.experiment import EARLIER_VOLATILE_TRAINER, config_hash
    from sigma_moe.framework.run_dirs import choose_run_dir

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


def test_checkpoints_of_another_config_are_not_resumed(tmp_path):
    RUN(compose_cfg([*OVERRIDES, "trainer.steps=2"]), tmp_path)
    (tmp_path / "results.json").unlink()  # as if interrupted after its last checkpoint
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    other = compose_cfg([*OVERRIDES, "trainer.steps=2", "trainer.lr=0.01"])
    with pytest.raises(ConfigError, match=r"^checkpoint_00000002.pt in .* is a checkpoint of "
                                          r"another config .*fresh=true"):
        RUN(other, tmp_path)
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir() if p.name in before}
    assert {k: v for k, v in before.items() if k.startswith("checkpoint")} == {
        k: v for k, v in after.items() if k.startswith("checkpoint")}
    # mode=eval of a checkpoint copied in from another config: its numbers would be filed
    # under this run
    own = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    save_checkpoint(tmp_path, 3, {**state, "step": 3, "config_hash": "0123456789ab"})
    trained = run_hashes(own)[0]
    with pytest.raises(ConfigError) as e:  # evaluated with other evaluation settings
        RUN({**own, "mode": "eval", "task": {**own["task"], "final_segments": 1}}, tmp_path)
    assert re.fullmatch(r"checkpoint_00000003.pt in .* is a checkpoint of another config \(hash "
                        rf"0123456789ab, not {trained}\); move it away to evaluate the run's "
                        r"own checkpoints", str(e.value))
    assert not (tmp_path / "eval_results.json").exists()
    (tmp_path / "checkpoint_00000003.pt").unlink()
    # another shape (a copied checkpoint from before runs recorded their hash): one line,
    # not torch's list of size mismatches
    RUN(compose_cfg([*OVERRIDES, "trainer.steps=2", "ffn.n_experts=8"]), tmp_path / "w")
    state = load_checkpoint(list_checkpoints(tmp_path / "w")[-1])
    save_checkpoint(tmp_path, 2, {**state, "config_hash": None})
    with pytest.raises(ConfigError, match=r"^mode=eval: the step-2 checkpoint in .* does not "
                                          r"fit this model \(Error\(s\) in loading"):
        RUN({**own, "mode": "eval"}, tmp_path)


def test_volatile_keys_leave_the_config_hash_alone():
    """Mutant: "paper" dropped from VOLATILE (correcting a paper number in an exp file would
    make every finished run of it stale)."""
    from sigma_moe.framework.experiment import config_hash

    cfg = {"model": {"d_model": 16}, "trainer": {"seed": 0, "lr": 1e-3}, "paper": {"a": 1}}
    for key, value in (("paper", {"a": 2}), ("logger", "wandb"), ("fresh", True),
                       ("mode", "eval"), ("sweep_name", "moe")):
        assert config_hash({**cfg, key: value}) == config_hash(cfg), key
    assert config_hash({**cfg, "model": {"d_model": 32}}) != config_hash(cfg)


def test_fresh_dir_goes_above_the_highest_sibling(tmp_path):
    """Mutant `max(...)` -> `min(...)` in _newest_fresh_sibling: with -2 and -3 present,
    fresh=true would pick -3 again (a finished run's directory)."""
    from sigma_moe.framework.experiment import fresh_dir

    run = tmp_path / "exp" / "trainer.seed=0"
    for d in (run, run.with_name(run.name + "-3"), run.with_name(run.name + "-2")):
        d.mkdir(parents=True)
    assert fresh_dir(run) == run.with_name(run.name + "-4")


def test_a_directory_with_checkpoints_or_another_finished_run(tmp_path):
    """fresh=true starts anew beside a run that has checkpoints but no results yet; without
    it, a finished run of another config is refused (not trained over), and a results.json
    cut short is no finished run; mode=params and mode=eval use the directory as it is."""
    from sigma_moe.framework.experiment import write_results
    from sigma_moe.framework.run_dirs import choose_run_dir, prepare_run_dir

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

    from sigma_moe.framework import cli, run_dirs

    exclude = ["exp", "mode"]
    trained = ["+exp=mini_moe", "trainer.steps=30", "dataset.source=/d/x", "task.val_segments=1"]
    evaluated = [*trained, "mode=eval", "task.final_segments=2"]
    hydra_name = get_overrides_dirname(OverridesParser.create().parse_overrides(trained),
                                       exclude, ",", "=")
    one_out, both_out = run_dirs.names_without_eval_settings(evaluated, exclude)
    assert cli.dirname(hydra_name) in one_out and len(one_out) == 2 and len(both_out) == 1
    assert run_dirs.names_without_eval_settings(["+exp=mini_moe", "task.final_segments=2"],
                                           exclude) == [[""]]
    assert run_dirs.names_without_eval_settings(trained[:3], exclude) == []

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
    assert run_dirs.pick_trained(evaluate, base, [[""]]) == base
    assert run_dirs.pick_trained(evaluate, base, [["trainer.steps=3"]]) is None  # trained else
    assert run_dirs.pick_trained(evaluate, base, [["nothing", ""], ["task.val_segments=4"]]) == base
    assert run_dirs.pick_trained(evaluate, base, [["", "task.val_segments=4"]]) is None  # no guess

    asked = base / "task.final_segments=5"
    asked.mkdir()
    monkeypatch.chdir(tmp_path)  # removable_up_to: a single run's empty parents up to here
    monkeypatch.setattr(run_dirs, "trained_run_dir",
                        lambda c, d: run_dirs.pick_trained(c, base, [[""]]))
    assert run_dirs.prepare_run_dir(evaluate, asked) == base and not asked.exists()
    assert f"mode=eval: evaluating the run in {base}" in capsys.readouterr().out
    asked.mkdir()
    (asked / "checkpoint_00000002.pt.bad").write_bytes(b"x")  # its own run, broken: said so
    assert run_dirs.prepare_run_dir(evaluate, asked) == asked


@pytest.mark.parametrize("mode", ["RUN", "MULTIRUN"])
def test_eval_settings_find_the_trained_run_in_a_sweep_too(tmp_path, monkeypatch, mode):
    """`-m +sweep=mini mode=eval task.final_segments=0` (each run again on whole splits):
    a sweep job's directory is named as a single run's, one level under the sweep's."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from sigma_moe.framework import run_dirs

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    trained = tmp_path / "sweeps" / "mini" / "mini_moe" / "trainer.seed=0"
    trained.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(cfg), trained / "config.yaml")
    save_checkpoint(trained, 2, {"step": 2})
    spec = SimpleNamespace(exclude_keys=["exp", "sweep", "mode"], item_sep=",", kv_sep="=")
    hc = SimpleNamespace(mode=getattr(RunMode, mode),
                         job=SimpleNamespace(config=SimpleNamespace(override_dirname=spec)),
                         overrides=SimpleNamespace(task=["+exp=mini_moe", "trainer.seed=0",
                                                         "mode=eval", "task.final_segments=0"]))
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))
    evaluate = {**cfg, "mode": "eval", "task": {**cfg["task"], "final_segments": 0}}
    asked = trained.with_name("task.final_segments=0,trainer.seed=0")
    assert run_dirs.trained_run_dir(evaluate, asked) == trained


def test_fresh_twice_after_a_finished_fresh_run_starts_a_third(tmp_path):
    """The newest sibling finished (same config): fresh=true starts a new one, it does not
    take that finished run up again."""
    from omegaconf import OmegaConf

    from sigma_moe.framework.experiment import config_hash, write_results
    from sigma_moe.framework.run_dirs import choose_run_dir

    cfg = {**compose_cfg([*OVERRIDES, "trainer.steps=2"]), "fresh": True}
    run = tmp_path / "run"
    run.mkdir()
    write_results(run, {"config_hash": config_hash(cfg)})
    assert choose_run_dir(cfg, run) == tmp_path / "run-2"
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "run-2" / "config.yaml")  # as lm_run
    write_results(tmp_path / "run-2", {"config_hash": config_hash(cfg)})
    assert choose_run_dir(cfg, run) == tmp_path / "run-3"


ROOT = Path(__file__).resolve().parent.parent
# Another process that holds a run directory's lock (as a run training there) until its
# stdin closes.
HOLDER = """
import sys
from pathlib import Path
from sigma_moe.framework.run_dirs import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_elsewhere(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=ROOT,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == "held\n", proc.communicate()
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_a_directory_a_run_trains_in_now_is_not_trained_in_twice(tmp_path, capsys):
    """A second process on a run directory whose run trains now (its config.yaml, no
    checkpoint yet) stops with one line naming the holder, and leaves the directory; fresh=true
    goes beside it, and past a fresh=true sibling that trains now too. The lock is held
    until the caller's `held` closes, then another process takes it."""
    from contextlib import ExitStack

    from omegaconf import OmegaConf

    from sigma_moe.framework.run_dirs import choose_run_dir, remove_if_empty

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(OmegaConf.create(cfg), run / "config.yaml")  # as lm_run, at its start
    other = hold_elsewhere(run)
    try:
        with pytest.raises(ConfigError, match=(
                rf"^{re.escape(str(run))} is in use by another run \(pid {other.pid} on \S+ since "
                rf"\d{{4}}-\S+\+00:00\): wait for it to finish or stop it; fresh=true starts "
                rf"a new run beside it$")):
            choose_run_dir(cfg, run)
        with ExitStack() as held:
            assert choose_run_dir({**cfg, "fresh": True}, run, held) == tmp_path / "run-2"
            OmegaConf.save(OmegaConf.create(cfg), tmp_path / "run-2" / "config.yaml")
            assert choose_run_dir({**cfg, "fresh": True}, run) == tmp_path / "run-3"
            assert "(" + str(tmp_path / "run-2") + " is in use by another run)" in (
                capsys.readouterr().out)
        remove_if_empty(tmp_path / "run-3")  # a .lock no run holds: an empty directory
        assert not (tmp_path / "run-3").exists()
        # the failed start's cleanup (run.py) must not take the directory from under it
        (run / "config.yaml").unlink()
        remove_if_empty(run)
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
        after = hold_elsewhere(tmp_path / "run-2")  # released when `held` closed
        release(after)
    finally:
        release(other)
    assert choose_run_dir(cfg, run) == run
    remove_if_empty(run)
    assert not run.exists()


def test_runs_are_not_locked_where_flock_is_not_supported(tmp_path, monkeypatch, capsys):
    """A network file system without flock (ENOLCK, ENOTSUP): the run goes on unlocked, with
    one note however many directories it locks."""
    import errno

    from sigma_moe.framework import run_dirs

    def unsupported(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_dirs.fcntl, "flock", unsupported)
    run_dirs._note_unlocked.cache_clear()
    for _ in range(2):
        with run_dirs.hold_run_dir(tmp_path):
            pass
    assert capsys.readouterr().err.count("note: run directories are not locked here") == 1
    run_dirs._note_unlocked.cache_clear()


def test_each_job_of_a_sweep_in_one_process_releases_its_lock(tmp_path):
    """The basic launcher runs the jobs one after another in one process: a job that fails
    after taking its directory's lock releases it, or the next job in that directory would
    find it "in use"."""
    args = ["-m", "+exp=mini_moe", *OVERRIDES, "hydra/launcher=basic",
            f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=same", "task.context=0,-1"]
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("task.batch_size, task.context and task.eval_batch_size must "
                             "be >= 1") == 2, proc.stderr
    assert "in use" not in proc.stderr and not (tmp_path / "same").exists()


def test_fresh_true_starts_that_meet_take_one_sibling_each(tmp_path, monkeypatch):
    """Two fresh=true starts at once: the one whose new sibling the other created meanwhile
    takes the next (not `error: File exists`)."""
    from sigma_moe.framework import run_dirs
    from sigma_moe.framework.experiment import config_hash, write_results

    cfg = compose_cfg([*OVERRIDES, "trainer.steps=2"])
    run = tmp_path / "run"
    run.mkdir()
    write_results(run, {"config_hash": config_hash(cfg)})
    real, calls = run_dirs.fresh_dir, []

    def raced(run_dir):  # the other start makes run-2 between our pick and our mkdir
        calls.append(run_dir)
        if len(calls) == 1:
            (tmp_path / "run-2").mkdir()
            return tmp_path / "run-2"
        return real(run_dir)

    monkeypatch.setattr(run_dirs, "fresh_dir", raced)
    assert run_dirs.choose_run_dir({**cfg, "fresh": True}, run) == tmp_path / "run-3"


def test_a_lock_file_this_user_cannot_write_still_locks(tmp_path, monkeypatch):
    """Another user's .lock (0644) in a shared directory: flock needs no write access."""
    from types import SimpleNamespace

    from sigma_moe.framework import run_dirs

    def read_only(path, flags, *args):
        if flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", str(path))
        return os.open(path, flags, *args)

    other = hold_elsewhere(tmp_path)
    try:  # run_dirs' `os` only
        monkeypatch.setattr(run_dirs, "os", SimpleNamespace(**{**vars(os), "open": read_only}))
        with pytest.raises(run_dirs.RunDirInUse, match=f"pid {other.pid} on "):
            with run_dirs.hold_run_dir(tmp_path):
                pass
    finally:
        release(other)


def test_a_requeued_slurm_job_waits_for_its_lost_runs_lock(tmp_path, monkeypatch, capsys):
    """After a node failure the network file system may hold the dead run's lock until the
    node's lease expires: a requeued job (SLURM_RESTART_COUNT > 0) waits for it, a new one
    does not."""
    from sigma_moe.framework import run_dirs

    monkeypatch.setattr(run_dirs, "LOCK_POLL_S", 0.1)
    monkeypatch.setattr(run_dirs, "REQUEUE_WAIT_S", 0.5)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    other, lease = hold_elsewhere(tmp_path), None
    try:
        with pytest.raises(run_dirs.RunDirInUse):  # not requeued: at once
            with run_dirs.hold_run_dir(tmp_path):
                pass
        assert capsys.readouterr().err == ""
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        t0 = time.monotonic()
        with pytest.raises(run_dirs.RunDirInUse):  # held for longer than the wait
            with run_dirs.hold_run_dir(tmp_path):
                pass
        assert time.monotonic() - t0 >= 0.5
        assert f"note: {tmp_path} is locked" in capsys.readouterr().err
        monkeypatch.setattr(run_dirs, "REQUEUE_WAIT_S", 30.0)
        lease = threading.Timer(0.5, release, args=(other,))  # the lease expires
        lease.start()
        with run_dirs.hold_run_dir(tmp_path):
            assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()} on ")
    finally:
        if lease is not None:
            lease.join()
        if other.returncode is None:
            release(other)
    run_dirs._note_waiting.cache_clear()


def test_a_second_start_of_a_training_run_is_refused(tmp_path):
    """End to end: run.py holds the lock while it trains."""
    args = [sys.executable, "run.py", "+exp=mini_moe", *OVERRIDES, "trainer.steps=1000000",
            "trainer.ckpt_every=1000000", f"hydra.run.dir={tmp_path / 'run'}"]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "metrics.jsonl").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert re.fullmatch(
            rf"error: {re.escape(str(tmp_path / 'run'))} is in use by another run \(pid "
            rf"{first.pid} on \S+ since \S+\): wait for it to finish or stop it; fresh=true "
            rf"starts a new run beside it\n", second.stderr), second.stderr
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("content", [b"{not json", b'{"name": "\xff"}'])
def test_a_results_file_that_does_not_parse_reads_as_unfinished(tmp_path, content):
    """Not JSON, or not UTF-8 (a UnicodeDecodeError, which the JSON error did not cover):
    no traceback from choosing the run directory."""
    from sigma_moe.framework.experiment import read_results

    (tmp_path / "results.json").write_bytes(content)
    assert read_results(tmp_path) is None
