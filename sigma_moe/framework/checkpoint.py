"""Atomic, verified checkpoints ("never lose a run").

A checkpoint is written to a temp file in the run directory, fsynced, then renamed, so a
kill at any moment leaves either the old or the new file, never half of one. A sha256
sidecar (written the same way, after the checkpoint) lets `load_latest` detect a
truncated/corrupt file and fall back to the previous one with a one-line warning. A
checkpoint without its sidecar (killed between the two renames, or copied alone) is whole
by the same argument and loads unverified.
"""
from __future__ import annotations

import codecs
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from tqdm import tqdm

from sigma_moe.framework.config import first_line

# Checkpoints load with weights_only=True: unpickling builds tensors and plain containers
# and runs no code from the file, so a run someone shared is safe to open (load_trained).
# Beyond those, a checkpoint holds numpy's RNG state, whose key array needs these. Its raw
# bytes pickle (torch.save's protocol 2) as a call to _codecs.encode, which recent torch
# allows by default and torch 2.4 does not.
torch.serialization.add_safe_globals([np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                                      type(np.dtype(np.uint32)), codecs.encode])

CKPT_RE = re.compile(r"^checkpoint_(\d{8})\.pt$")


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def _atomic_open(path: Path) -> Iterator[BinaryIO]:
    """A file that appears at `path` only whole: temp file, fsync, rename (else removed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, _umask_mode())  # mkstemp makes 0600: the usual permissions (no fchmod
        # on Windows before Python 3.13)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (a power loss could otherwise undo it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the rename stays atomic
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with _atomic_open(path) as f:
        f.write(data)


def file_sha256(path: Path, desc: str = "") -> str:
    """sha256 of a file, read in 16 MB blocks; with `desc`, a progress bar (GBs of a cache)."""
    sha = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=desc, disable=None if desc else True,
                                     leave=False) as bar:
        while block := f.read(1 << 24):
            sha.update(block)
            bar.update(len(block))
    return sha.hexdigest()


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint_{step:08d}.pt"


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint_<step>.pt atomically, then its checksum; prune to `keep` newest."""
    path = checkpoint_path(run_dir, step)
    with _atomic_open(path) as f:
        torch.save(state, f)
    atomic_write_bytes(path.with_suffix(".pt.sha256"), file_sha256(path).encode())
    others = [p for p in list_checkpoints(run_dir) if p != path]  # never the new one
    for old in others[:max(0, len(others) - (keep - 1))] if keep > 0 else []:
        old.unlink(missing_ok=True)
        old.with_suffix(".pt.sha256").unlink(missing_ok=True)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run directory, oldest first."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if CKPT_RE.match(p.name))


def list_broken(run_dir: Path) -> list[Path]:
    """Checkpoints that failed to load, moved aside by `load_latest(repair=True)`."""
    return sorted(run_dir.glob("checkpoint_*.pt.bad")) if run_dir.is_dir() else []


class CheckpointError(RuntimeError):
    """`shared`: every rank raises it with rank 0's message (the CLI says it once)."""

    def __init__(self, message: str, shared: bool = False):
        super().__init__(message)
        self.shared = shared


class CheckpointUnloadable(CheckpointError):
    """A checkpoint that is whole (its sha256 matches, or the failure is not the file's:
    memory, a missing package, I/O) but does not load here: set aside, it would cost the
    steps since the one before."""


# torch.load(weights_only=True)'s refusal of a global (a function or class) in the file; a
# builtin is named without its module by recent torch (print), with it by torch 2.4
# (builtins.print)
_REFUSED = re.compile(r"GLOBAL (?:builtins\.)?(\S+) was not an allowed global")


def load_checkpoint(path: Path) -> dict[str, Any]:
    sidecar = path.with_suffix(".pt.sha256")
    verified = sidecar.exists()
    if verified and file_sha256(path) != sidecar.read_text().strip():
        raise CheckpointError(f"{path.name}: checksum mismatch (truncated or corrupt)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        if code := _REFUSED.search(str(e)):  # not damage: the file asks to run code
            raise CheckpointUnloadable(
                f"{path} holds a pickled {code[1]}, which loading would call: not "
                f"loaded (this framework's checkpoints hold tensors and plain values only); "
                f"if you trust the file, load it with torch.load(weights_only=False)"
            ) from None
        what = ": ".join(x for x in (type(e).__name__, first_line(e)) if x)
        if verified or isinstance(e, (MemoryError, ImportError, OSError)):
            raise CheckpointUnloadable(
                f"{path} cannot be loaded here ({what}), though "
                + ("its sha256 matches: the file is whole" if verified else
                   "that is no sign of a damaged file")
                + "; fix the cause (memory, a package version, the file system) and rerun"
            ) from e
        raise CheckpointError(f"{path.name}: cannot be loaded ({what})") from e


def load_latest(run_dir: Path, warn=print, repair: bool = False) -> dict[str, Any] | None:
    """The newest checkpoint that verifies and loads (None if none does); bad ones are
    reported and skipped.

    repair: for the one process that writes this run directory (training, rank 0). It
    removes temp files of killed writes and moves checkpoints that fail to load aside
    (`*.pt.bad`, kept for inspection): left in place, a newer broken file would count as
    the newest when pruning, which could delete the good ones. Without it nothing in the
    directory changes (an evaluation may run beside a training that is writing there)."""
    if repair and run_dir.is_dir():  # temp files of a write that was killed are never whole
        for tmp in run_dir.glob(".checkpoint_*.tmp"):
            tmp.unlink(missing_ok=True)
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return load_checkpoint(path)
        except CheckpointUnloadable:  # not the file's fault: neither set aside nor passed over
            raise
        except CheckpointError as e:
            aside = ""
            if repair:
                path.replace(path.with_suffix(".pt.bad"))
                path.with_suffix(".pt.sha256").unlink(missing_ok=True)
                aside = f" (moved to {path.name}.bad)"
            warn(f"warning: skipping checkpoint {e}{aside}; trying the previous one")
    return None
