"""The prepared-data cache of the downloaded datasets (docs/REFERENCE.md, "Datasets": "token ids
cached as a uint16 memmap keyed by a hash of the settings").

Layout, one directory per (settings, source) pair:

    <cache_dir>/<dataset>/<settings_hash>-<source_hash>/
        manifest.json      written last: its presence marks the entry complete
        <split>.bin        raw token ids (dtype, length and sha256 in the manifest), read as
                           np.memmap
        spm.model          the SentencePiece model (subword datasets; sha256 in the manifest)
    <cache_dir>/<dataset>/<settings_hash>-<source_hash>.lock     flock'ed while building
    <cache_dir>/<dataset>/.tmp-<settings_hash>-<source_hash>-*/  an entry being built

An entry is built in a temporary directory that is renamed into place only after its
manifest is written, so a crash never leaves something that looks complete. Two jobs of a
sweep preparing the same entry serialize on the lock: the second waits, then reuses it.
The source hash lets a run that names no source (`source: ""`) reuse whatever
`scripts/prepare_data.py` prepared with the same settings (`find_prepared`).

Loading checks each array's size only (hashing a C4 train split reads GBs); the checksums
are what a run records of its data (`Entry.origin`, results.json) and what
`scripts/prepare_data.py --verify` re-reads the files against (`Entry.verify`).
"""
from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: no flock (see file_lock)
    fcntl = None

from sigma_moe.framework.checkpoint import file_sha256
from sigma_moe.framework.data.base import DataError

ENV_CACHE = "SIGMA_MOE_CACHE"
MANIFEST = "manifest.json"
FORMAT = 1  # bump when the on-disk layout changes: old entries then stop matching
log = logging.getLogger(__name__)


def resolve_cache_dir(cache_dir: str = "") -> Path:
    """`cache_dir`, else $SIGMA_MOE_CACHE, else ~/.cache/sigma_moe."""
    chosen = cache_dir or os.environ.get(ENV_CACHE) or str(Path.home() / ".cache" / "sigma_moe")
    return Path(chosen).expanduser().resolve()


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able object (dict key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def files_fingerprint(paths: list[Path]) -> list[list[Any]]:
    """Name, size and mtime of each source file: cheap (no reading) and changes when a file
    is replaced; a moved directory keeps it, a copy without `cp -p` does not."""
    out = []
    for p in sorted(paths):
        st = p.stat()
        out.append([p.name, st.st_size, st.st_mtime_ns])
    return out


class ArrayWriter:
    """Appends 1-D token chunks to `<dir>/<name>.bin`, stopping at `limit` tokens; hashes
    the bytes as it writes them (the manifest's sha256, at no extra read)."""

    def __init__(self, directory: Path, name: str, dtype: type, limit: int = 0):
        self.name, self.dtype, self.limit = name, np.dtype(dtype), limit
        self.length = 0
        self._f = open(directory / f"{name}.bin", "wb")
        self._sha = hashlib.sha256()

    @property
    def full(self) -> bool:
        return bool(self.limit) and self.length >= self.limit

    def append(self, ids: np.ndarray) -> int:
        """Writes `ids` (truncated at the limit); returns how many were written."""
        if self.limit:
            ids = ids[: self.limit - self.length]
        info = np.iinfo(self.dtype)
        if ids.dtype != self.dtype and len(ids) and (ids.min() < info.min or ids.max() > info.max):
            raise DataError(f"token id out of {self.dtype} range in {self.name}")
        block = np.ascontiguousarray(ids, dtype=self.dtype)
        self._sha.update(block.data)
        block.tofile(self._f)
        self.length += len(ids)
        return len(ids)

    def abort(self) -> None:
        self._f.close()  # the caller's temporary directory is removed with the file

    def close(self) -> dict[str, Any]:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        return {"file": f"{self.name}.bin", "dtype": self.dtype.name, "length": self.length,
                "sha256": self._sha.hexdigest()}


@dataclass
class Entry:
    path: Path
    manifest: dict[str, Any]

    def array(self, name: str) -> np.ndarray:
        """A read-only memmap of one stored array, checked against the manifest."""
        info = self.manifest["arrays"][name]
        file, dtype = self.path / info["file"], np.dtype(info["dtype"])
        expect = info["length"] * dtype.itemsize
        if not file.exists() or file.stat().st_size != expect:
            raise DataError(
                f"cache entry {self.path} is damaged ({file.name} should hold {expect} bytes); "
                f"delete that directory and prepare again"
            )
        if info["length"] == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(file, dtype=dtype, mode="r", shape=(info["length"],))

    def checksums(self) -> dict[str, str | None]:
        """file -> the sha256 the manifest records (None: prepared before checksums)."""
        return {**{info["file"]: info.get("sha256") for info in self.manifest["arrays"].values()},
                **self.manifest.get("sha256", {})}

    def origin(self) -> dict[str, Any]:
        """What a run records of the data it read (results.json): this entry, its source (a
        long list of shards as its count and digest), when it was prepared, and the sha256
        of each array (by name: train, ...) and other file (spm.model)."""
        names = {info["file"]: name for name, info in self.manifest["arrays"].items()}
        source = self.manifest["source"]
        if isinstance(source, list) and len(source) > 4:
            source = {"files": len(source), "digest": digest(source)}
        return {"cache_entry": str(self.path), "source": source,
                "prepared": datetime.fromtimestamp(self.manifest["created"]).isoformat(
                    timespec="seconds"),
                "sha256": {names.get(f, f): sha for f, sha in self.checksums().items()}}

    def verify(self) -> list[str]:
        """Re-reads every file with a recorded checksum; what is wrong (empty: intact)."""
        problems = []
        for name, want in self.checksums().items():
            file = self.path / name
            if want is None:
                problems.append(f"{name}: no checksum recorded (prepared before checksums "
                                f"existed)")
            elif not file.is_file():
                problems.append(f"{name}: missing")
            elif file_sha256(file, f"verify {name}") != want:
                problems.append(f"{name}: sha256 differs from the manifest's (damaged)")
        return problems


def _read_entry(path: Path) -> Entry | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return Entry(path, manifest) if manifest.get("format") == FORMAT else None


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock; the lock file itself is never deleted (deleting it would let a
    third process lock a fresh inode while the second still holds the old one). Without
    flock (Windows) nothing is locked: prepare an entry (scripts/prepare_data.py) before
    starting several processes that read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_prepared(root: Path, settings: dict[str, Any],
                  accept: Callable[[Entry], bool] = lambda e: True) -> Entry | None:
    """The newest complete entry with these settings, whatever its source."""
    found = [e for p in root.glob(f"{digest(settings)}-*") if p.is_dir()
             if (e := _read_entry(p)) is not None and accept(e)]
    return max(found, key=lambda e: e.manifest["created"], default=None)


_MAY_BUILD = contextvars.ContextVar("may_build", default=True)


@contextmanager
def prepared_only() -> Iterator[None]:
    """Within it, `prepare` fails (DataError) where it would build an entry: for commands
    that look at what is prepared (`prepare_data.py --verify`), never downloading."""
    token = _MAY_BUILD.set(False)
    try:
        yield
    finally:
        _MAY_BUILD.reset(token)


def prepare(root: Path, settings: dict[str, Any], source: Any,
            build: Callable[[Path, Entry | None], dict[str, Any]],
            accept: Callable[[Entry], bool] = lambda e: True) -> Entry:
    """The entry for (settings, source): reused when complete and accepted, else built.

    `build(tmp_dir, previous)` writes its files into `tmp_dir` and returns the manifest
    fields it adds (at least "arrays"); `previous` is an existing entry of the same key that
    `accept` refused (e.g. too few tokens), so that a rebuild can reuse parts of it.
    """
    key = f"{digest(settings)}-{digest(source)}"
    final = root / key
    entry = _read_entry(final)
    if entry is not None and (accept(entry) or not _MAY_BUILD.get()):
        return entry  # prepared_only: as it is (a C4 entry with fewer tokens than the default)
    if not _MAY_BUILD.get():
        raise DataError(f"{root.name}: nothing prepared with these settings under {root}")
    with file_lock(root / f"{key}.lock"):
        entry = _read_entry(final)  # another job may have finished it while we waited
        if entry is not None and accept(entry):
            return entry
        for stale in root.glob(f".tmp-{key}-*"):  # left by a killed job; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            t0 = time.time()
            manifest = {"format": FORMAT, "settings": settings, "source": source,
                        **build(tmp, entry)}
            manifest.update(created=time.time(), build_seconds=round(time.time() - t0, 2),
                            built_by_pid=os.getpid())
            (tmp / f"{MANIFEST}.part").write_text(json.dumps(manifest, indent=1, default=str))
            os.replace(tmp / f"{MANIFEST}.part", tmp / MANIFEST)
            if final.exists():  # a refused entry: move it aside (open memmaps stay valid)
                old = root / f".tmp-{key}-old-{uuid.uuid4().hex[:8]}"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("prepared %s in %.1f s", final, manifest["build_seconds"])
    entry = _read_entry(final)
    assert entry is not None
    return entry


@dataclass
class Source:
    """A located original: what identifies it in the cache key, and what reads it."""

    fingerprint: Any
    handle: Any


def prepare_command(name: str, source_hint: str, cfg: Any = None) -> str:
    """The prepare_data.py command that builds what a run with dataset config `cfg` looks
    for: its fields that differ from the defaults (which configs/dataset/NAME.yaml states)
    as key=value, and its cache directory; quoted for a shell."""
    words = ["python", "scripts/prepare_data.py", name]
    if cfg is not None:
        default = type(cfg)()
        words += [f"{f.name}={json.dumps(value)}"  # JSON is YAML: prepare_data.py reads it
                  for f in dataclasses.fields(cfg)
                  if f.name not in ("source", "cache_dir", "num_proc")
                  and (value := getattr(cfg, f.name)) != getattr(default, f.name)]
    words += ["--source", source_hint]
    if cfg is not None and cfg.cache_dir:
        words += ["--cache-dir", cfg.cache_dir]
    return shlex.join(words)


def load_or_prepare(name: str, cfg: Any, settings: dict[str, Any], what: str,
                    locate: Callable[[Path], Source | None],
                    build: Callable[[Source, Path, Entry | None], dict[str, Any]],
                    default_names: tuple[str, ...],
                    online: Callable[[str], Source] | None = None,
                    accept: Callable[[Entry], bool] = lambda e: True,
                    complete: Callable[[Entry], bool] | None = None) -> Entry:
    """The common path of the downloaded datasets.

    An explicit `cfg.source` must exist and is used (keyed by its fingerprint). With
    `source: ""`: a `complete` entry prepared earlier with these settings (from any source),
    else a copy at `<cache_dir>/raw/<default name>`, else an `accept`ed entry (one whose
    source ran dry: `accept` holds for its own source only, and a grown copy must be
    re-read), else `online(the prepare command)` (a Hugging Face stream, for the datasets
    that have one); failing all, a one-line DataError with the prepare command.
    """
    cache = resolve_cache_dir(cfg.cache_dir)
    root = cache / name
    hint = prepare_command(name, f"/path/to/{default_names[0]}", cfg)
    if not _MAY_BUILD.get() and not cfg.source:  # prepared_only: any entry of the settings
        if (entry := find_prepared(root, settings)) is None:
            raise DataError(f"{name}: nothing prepared with these settings under {root}")
        return entry
    if cfg.source:
        path = Path(cfg.source).expanduser()
        src = locate(path) if path.exists() else None
        if src is None:
            raise DataError(f"{name}: no {what} at {path}; prepare it with `{hint}`")
    else:
        defaults = [cache / "raw" / n for n in default_names]
        src = None
        entry = find_prepared(root, settings, complete or accept)
        if entry is None:
            src = next((s for p in defaults if p.exists() and (s := locate(p))), None)
            if src is None:
                entry = find_prepared(root, settings, accept)
        if entry is not None:  # the run's start line names it (sigma_moe/tasks/lm_run.py)
            return entry
        if src is None and online is not None:
            src = online(hint)
        if src is None:
            raise DataError(
                f"{name}: no prepared cache under {root} and no {what} at "
                f"{' or '.join(map(str, defaults))}; prepare it with `{hint}`"
            )
    return prepare(root, settings, src.fingerprint, lambda tmp, prev: build(src, tmp, prev),
                   accept)
