"""Where a run goes (issue 8: never lose a run): the directory Hydra named for the command,
a fresh=true sibling, or, for mode=eval with evaluation settings on the command line, the
directory the same command without them trained in. What a directory holds decides
(sigma_moe/framework/experiment.py): a finished run is not retrained, another config's run is not
trained over. While a run trains, its directory is locked (`hold_run_dir`): a second
process started on it (the same command in another terminal, a resubmitted Slurm job) stops
instead of writing checkpoints and metrics.jsonl into the same directory."""
from __future__ import annotations

import errno
import functools
import itertools
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

try:
    import fcntl
except ImportError:  # Windows: no flock, runs are not locked
    fcntl = None

from sigma_moe.framework.checkpoint import atomic_write_bytes, list_broken, list_checkpoints
from sigma_moe.framework.cli import OVERRIDES, dirname, removable_up_to
from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.distributed import main_process
from sigma_moe.framework.experiment import (
    EVAL_SETTINGS,
    finished_as,
    fresh_dir,
    read_results,
    start_blocker,
    trained_as,
    under,
    unfinished_fresh_run,
)

LOCK = ".lock"  # in a run directory: flock'ed while a run trains there (hold_run_dir)


class RunDirInUse(ConfigError):
    """Another process holds the run directory's lock: a run trains there now."""


REQUEUE_WAIT_S = 300.0  # how long a requeued Slurm job waits for its run directory's lock
LOCK_POLL_S = 5.0


@functools.cache
def _note_unlocked(why: str) -> None:
    print(f"note: run directories are not locked here ({why}): nothing stops a second run "
          f"of the same command from training in the same directory", file=sys.stderr)


@functools.cache
def _note_waiting(run_dir: Path) -> None:
    print(f"note: {run_dir} is locked, by this requeued job's previous run on a lost node if "
          f"the lock is stale; waiting up to {REQUEUE_WAIT_S:.0f} s for it", file=sys.stderr)


@contextmanager
def hold_run_dir(run_dir: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold run_dir's lock (an exclusive flock on run_dir/.lock, whose text names the
    holder) until the block ends; RunDirInUse if another process holds it. Where there is no
    flock (Windows; a network file system without it, e.g. Lustre without -o flock) the run
    goes on unlocked. The lock file stays (but in an empty directory: remove_if_empty):
    removing it would let a third process lock a new file while the second holds the old.
    `wait_s`: how long to wait for a held lock (None: REQUEUE_WAIT_S in a requeued Slurm
    job, else none)."""
    fd = _locked_fd(run_dir, wait_s)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _locked_fd(run_dir: Path, wait_s: float | None) -> int | None:
    """run_dir/.lock, open and flock'ed, its text naming this process; None where it cannot
    be locked."""
    if fcntl is None:
        _note_unlocked("no fcntl.flock on this system")
        return None
    try:
        fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:  # another user's lock file: flock needs no write access
            fd = os.open(run_dir / LOCK, os.O_RDONLY)
        except FileNotFoundError:  # an unwritable directory: check_writable says so
            return None
        except OSError as e:
            _note_unlocked(f"cannot open {LOCK}: {e.strerror}")
            return None
    # A requeued Slurm job may find its own dead node's lock still held: a network file
    # system frees it only when the node's lease expires (NFSv4: 90 s).
    if wait_s is None:
        requeued = os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")
        wait_s = REQUEUE_WAIT_S if requeued else 0.0
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
            if busy and time.monotonic() < deadline:
                _note_waiting(run_dir)
                time.sleep(LOCK_POLL_S)
                continue
            holder = _holder(fd)
            os.close(fd)
            if not busy:
                _note_unlocked(f"flock: {e.strerror}")
                return None
            raise RunDirInUse(f"{run_dir} is in use by another run ({holder}): wait for it "
                              f"to finish or stop it; fresh=true starts a new run beside it"
                              ) from None
    try:
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
    except OSError:  # a full disk, a read-only fd: the lock holds, the error cannot name it
        pass
    return fd


def _take(run_dir: Path, held: ExitStack) -> RunDirInUse | None:
    """Hold run_dir's lock in `held`; or the error naming the run that holds it."""
    try:
        held.enter_context(hold_run_dir(run_dir))
    except RunDirInUse as e:
        return e
    return None


def remove_if_empty(run_dir: Path, up_to: Path | None = None) -> None:
    """Remove a run directory that a failed start left empty (no fake-looking runs), and
    its parents that are empty then, below `up_to` (the ones Hydra made for it). A lock file
    alone is nothing, unless a run holds it (it has just started there)."""
    d, stop = run_dir.resolve(), None if up_to is None else up_to.resolve()
    while True:
        try:
            if not d.is_dir() or {p.name for p in d.iterdir()} - {LOCK}:
                return
            if (d / LOCK).exists():
                with hold_run_dir(d, wait_s=0):  # held: a run has just started there
                    (d / LOCK).unlink()
                    os.rmdir(d)
            else:
                os.rmdir(d)
        except (OSError, RunDirInUse):
            return
        d = d.parent
        if stop is None or stop not in d.parents:
            return


def prepare_run_dir(cfg: dict[str, Any], run_dir: Path, held: ExitStack | None = None
                    ) -> Path | None:
    """The run directory for this config (Hydra's `run_dir`, or a fresh=true sibling), or
    None if this exact run already finished. mode=eval with evaluation settings among the
    overrides (task.final_segments=2, ...): the trained run's directory
    (`trained_run_dir`). Training holds its directory's lock in `held` (choose_run_dir)."""
    mode = cfg.get("mode", "train")
    if mode == "eval" and not list_checkpoints(run_dir) and not list_broken(run_dir):
        trained = trained_run_dir(cfg, run_dir)
        if trained is not None:
            if main_process():  # every rank of an evaluation finds the same run
                print(f"mode=eval: evaluating the run in {trained} (evaluation settings do "
                      f"not name a run)")
            remove_if_empty(run_dir, removable_up_to())  # the one Hydra made for this name
            return trained
    if mode != "train":
        return run_dir
    return choose_run_dir(cfg, run_dir, held)


def nothing_to_evaluate(run_dir: Path, found: int) -> str:
    """Why mode=eval has no checkpoint to load in run_dir (`found`: those that did not
    load), and what to do."""
    if found:
        return (f"mode=eval: none of the {found} checkpoints in {run_dir} loads (see the "
                f"warnings above)")
    if broken := list_broken(run_dir):
        return (f"mode=eval: none of the {len(broken)} checkpoints in {run_dir} loads (moved "
                f"aside as *.pt.bad); repair one and rename it back to *.pt")
    if (holder := training_there(run_dir)) is not None:
        return (f"mode=eval: no checkpoint in {run_dir} yet: a run trains there ({holder}); "
                f"evaluate it once it has written one (every trainer.ckpt_every steps)")
    return f"mode=eval: no checkpoint in {run_dir}; train this run first"


def _holder(fd: int) -> str:
    """What a lock file says of the run holding it (pid, host, since when)."""
    try:
        return os.read(fd, 300).decode(errors="replace").strip() or "it has not said who"
    except OSError:
        return "it has not said who"


def training_there(run_dir: Path) -> str | None:
    """What the lock file of a run training in run_dir says of it (pid, host, since when);
    None when none trains there. A shared lock: the ranks of one evaluation that ask at
    once do not take each other for a training run."""
    if fcntl is None:
        return None
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:  # no lock file: no run has trained here
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None  # no flock here: nothing to tell
        return _holder(fd)
    finally:
        os.close(fd)


def write_overrides(run_dir: Path) -> None:
    """Record the run's command-line overrides (Hydra's list, as Hydra's own
    .hydra/overrides.yaml) and its directory's name uncut: `dirname` cuts a long one to a
    hash, after which the overrides (the seed among them) cannot be read from the name
    (scripts/run_results.py `run_overrides`). Nothing outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    record = {"overrides": list(hc.overrides.task), "dirname": hc.job.override_dirname}
    atomic_write_bytes(run_dir / OVERRIDES, yaml.safe_dump(record, sort_keys=False).encode())


def names_without_eval_settings(overrides: list[str], exclude_keys: list[str],
                                item_sep: str = ",", kv_sep: str = "=") -> list[list[str]]:
    """Run directory names (Hydra's override_dirname, then `dirname`) of these command-line
    overrides with some of their evaluation settings (EVAL_SETTINGS) left out: those
    leaving one out, then those leaving two out, ... The training command may have set
    some of them too (task.val_segments=1), which then name its directory."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    named = [o for o in OverridesParser.create().parse_overrides(overrides)
             if o.key_or_group not in exclude_keys]
    evals = [i for i, o in enumerate(named) if under(o.key_or_group, EVAL_SETTINGS)]
    return [[dirname(item_sep.join(sorted(o.input_line for i, o in enumerate(named)
                                          if i not in left_out)).replace("=", kv_sep))
             for left_out in itertools.combinations(evals, n)]
            for n in range(1, len(evals) + 1)]


def trained_run_dir(cfg: dict[str, Any], run_dir: Path) -> Path | None:
    """mode=eval of a run (single, or a sweep's job) whose directory has no checkpoint: the
    run its command trained, when evaluation settings among the overrides
    (task.final_segments=2) gave Hydra's directory another name. The candidates leaving out
    the fewest settings win; one of them must have trained this config
    (experiment.trained_as), or None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    spec = hc.job.config.override_dirname
    # runs/<name>/<overrides>: with no overrides left, runs/<name> itself
    return pick_trained(cfg, run_dir.parent, names_without_eval_settings(
        list(hc.overrides.task), list(spec.exclude_keys), spec.item_sep, spec.kv_sep))


def pick_trained(cfg: dict[str, Any], base: Path, candidates: list[list[str]]
                 ) -> Path | None:
    """The one directory base/<name> that trained `cfg`, from the first group of candidate
    names that has any (None: none, or two in one group)."""
    for names in candidates:
        found = {base / n for n in names if trained_as(base / n, cfg)}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def choose_run_dir(cfg: dict[str, Any], run_dir: Path, held: ExitStack | None = None
                   ) -> Path | None:
    """Where a training run goes (None: it already finished). Under several processes
    (torchrun, Slurm) rank 0 decides, and creates a fresh=true directory, then tells the
    others: deciding alone, each rank would take the next free sibling for itself. Rank 0
    also locks the directory (hold_run_dir; the ranks share it) until `held` closes
    (run.py: when the run ends); without `held`, on return."""
    from sigma_moe.framework.distributed import broadcast_from_main, init_distributed
    from sigma_moe.framework.runtime import resolve_device

    info = init_distributed(resolve_device(cfg["trainer"]["device"]).type)
    decision: tuple[str | None, str | None] = (None, None)
    if info.is_main:
        try:
            with nullcontext(held) if held is not None else ExitStack() as stack:
                chosen = _choose_run_dir(cfg, run_dir, stack)
            decision = (None if chosen is None else str(chosen), None)
        except Exception as e:  # every rank must stop, not wait for rank 0's answer
            decision = (None, str(e) if isinstance(e, (ConfigError, OSError)) else
                        f"choosing the run directory failed: {type(e).__name__}: {e}")
    chosen, error = broadcast_from_main(decision)
    if error is not None:
        raise ConfigError(error)
    return None if chosen is None else Path(chosen)


def _choose_run_dir(cfg: dict[str, Any], run_dir: Path, held: ExitStack) -> Path | None:
    """choose_run_dir in one process; the lock of the directory it returns goes to `held`."""
    with ExitStack() as mine:
        in_use = _take(run_dir, mine)
        done = read_results(run_dir)
        started = done is not None or list_checkpoints(run_dir)
        # in use: what it holds is the running run's (before its first checkpoint)
        blocker = None if started or in_use else start_blocker(run_dir, cfg)
        if cfg.get("fresh") and (started or blocker or in_use):
            mine.close()  # the new run goes beside it: run_dir stays free to resume
            return _fresh_run_dir(cfg, run_dir, held)
        if finished_as(done, cfg):
            _say_finished(done, run_dir)
            return None
        if done is not None:
            blocker = f"{run_dir} holds a finished run with another config"
        if blocker:
            raise ConfigError(f"{blocker}; pass fresh=true (a new sibling directory) or "
                              f"choose another directory (hydra.run.dir; in a sweep, "
                              f"hydra.sweep.dir)")
        if in_use:
            raise in_use
        held.enter_context(mine.pop_all())
        return run_dir


def _say_finished(done: dict[str, Any], run_dir: Path) -> None:
    metric = done.get("metric", "loss")
    try:
        numbers = (f": valid {metric} {done['valid'][metric]:.4f}, test {metric} "
                   f"{done['test'][metric]:.4f}")
    except (KeyError, TypeError, ValueError):  # an edited or foreign results.json
        numbers = ""
    print(f"this run already finished{numbers}; results in {run_dir / 'results.json'} "
          f"(fresh=true starts a new run)")


def _fresh_run_dir(cfg: dict[str, Any], run_dir: Path, held: ExitStack) -> Path:
    """fresh=true beside run_dir: the unfinished run an earlier fresh=true started, unless
    it trains now; else a new sibling."""
    again = unfinished_fresh_run(run_dir, cfg)
    if again is not None and _take(again, held) is None:
        print(f"fresh=true: {run_dir} is kept; resuming the unfinished run that an earlier "
              f"fresh=true started in {again}")
        return again
    while True:
        new = fresh_dir(run_dir)
        try:
            new.mkdir(parents=True)
            break
        except FileExistsError:  # another fresh=true start took this number meanwhile
            pass
    busy = "" if again is None else f" ({again} is in use by another run)"
    print(f"fresh=true: {run_dir} is kept; starting a new run in {new}{busy}")
    held.enter_context(hold_run_dir(new))
    return new
