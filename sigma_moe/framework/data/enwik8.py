"""`enwik8`: the first 10^8 bytes of an English Wikipedia XML dump, bytes as tokens (paper:
the Enwik8 rows, bits per character; docs/REFERENCE.md "Datasets": first 90M / next 5M / last 5M;
"Metrics": vocabulary = the distinct bytes of the data, about 205).

Source: the `enwik8` file, `enwik8.zip` (http://mattmahoney.net/dc/enwik8.zip), or a
directory holding either; with `source: ""` a prepared cache, else <cache_dir>/raw/enwik8.
The file must be exactly 100,000,000 bytes (any other file is refused, before it is cached:
a wrong --source would otherwise train on it); it is split 0.9 / 0.05 / rest, i.e. at
90M / 5M / 5M. The ids are cached as uint8 so that runs (and data-parallel ranks) share
one memmap.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sigma_moe.framework.data import DATASETS
from sigma_moe.framework.data.base import DataError, TokenData, bytes_to_ids, reading
from sigma_moe.framework.data.cache import (
    ArrayWriter,
    Entry,
    Source,
    files_fingerprint,
    load_or_prepare,
    prepare_command,
)

ENWIK8_BYTES = 100_000_000
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Enwik8Config:
    source: str = ""  # enwik8, enwik8.zip or their directory; "" = prepared cache or default
    cache_dir: str = ""  # "" = $SIGMA_MOE_CACHE or ~/.cache/sigma_moe


def split_sizes(n: int) -> tuple[int, int, int]:
    """(train, valid, test) byte counts: 90M / 5M / 5M for the real file (integer
    arithmetic: exact, and independent of ENWIK8_BYTES, which tests lower)."""
    train, valid = n * 9 // 10, n // 20
    return train, valid, n - train - valid


def check_size(n: int, what: str) -> None:
    """enwik8 has exactly ENWIK8_BYTES bytes: anything else is another file."""
    if n != ENWIK8_BYTES:
        raise DataError(
            f"enwik8: {what} has {n:,} bytes, not the {ENWIK8_BYTES:,} of enwik8; download "
            f"http://mattmahoney.net/dc/enwik8.zip and prepare it with "
            f"`{prepare_command('enwik8', '/path/to/enwik8.zip')}`")


def read_bytes(path: Path) -> bytes:
    if zipfile.is_zipfile(path):
        with reading(path), zipfile.ZipFile(path) as z:  # a bad CRC: one line naming it
            names = z.namelist()
            member = "enwik8" if "enwik8" in names else names[0] if len(names) == 1 else None
            if member is None:
                raise DataError(f"enwik8: {path} holds {names}, none of them named enwik8")
            check_size(z.getinfo(member).file_size, f"{path}:{member}")  # before unpacking
            return z.read(member)
    check_size(path.stat().st_size, str(path))
    return path.read_bytes()


def locate(path: Path) -> Source | None:
    if path.is_dir():
        path = next((p for p in (path / "enwik8", path / "enwik8.zip") if p.is_file()), path)
    return Source(files_fingerprint([path]), path) if path.is_file() else None


def build(src: Source, out: Path, previous: Entry | None) -> dict:
    ids, vocab = bytes_to_ids(read_bytes(src.handle))
    bounds = np.cumsum((0, *split_sizes(len(ids))))
    arrays = {}
    for i, split in enumerate(SPLITS):
        writer = ArrayWriter(out, split, np.uint8)
        writer.append(ids[bounds[i]:bounds[i + 1]])
        arrays[split] = writer.close()
    return {"arrays": arrays, "vocab_size": vocab, "metric": "bpc", "bytes": len(ids)}


@DATASETS.register("enwik8")
class Enwik8:
    nominal_vocab_size = 205  # distinct bytes of enwik8, for `mode=params` without the data
    Config = Enwik8Config

    @staticmethod
    def entry(cfg: Enwik8Config) -> Entry:
        e = load_or_prepare("enwik8", cfg, {"dataset": "enwik8", "split": "90M/5M/5M"},
                            "enwik8 file or enwik8.zip", locate, build, ("enwik8",
                            "enwik8.zip"))
        # a cache prepared from another file before the size check existed
        check_size(e.manifest["bytes"], f"the cache {e.path}")
        return e

    @staticmethod
    def load(cfg: Enwik8Config) -> TokenData:
        e = Enwik8.entry(cfg)
        return TokenData("enwik8", {s: e.array(s) for s in SPLITS}, e.manifest["vocab_size"],
                         "bpc", e.origin())
