"""`enwik_mini`: enwik8-style byte-level data that runs anywhere (docs/DESIGN.md, "Embedded data").

The bytes of the shortened Wikipedia XML dump that the `gensim` wheel ships as test data
(6.1 MB decompressed, the same kind of bytes as enwik8), split 90/5/5 contiguously like
enwik8 (paper: bits per character).
"""
from __future__ import annotations

import bz2
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from sigma_moe.framework.code_version import installed_version
from sigma_moe.framework.data import DATASETS
from sigma_moe.framework.data.base import (
    DataError,
    TokenData,
    bytes_to_ids,
    check_fractions,
    split_contiguous,
)

WIKI_XML = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def embedded_source() -> dict[str, str]:
    """The embedded file, identified by its name and the gensim release that ships it."""
    # "missing": embedded_wiki_xml() then says how to install it
    return {"file": WIKI_XML, "gensim": installed_version("gensim") or "missing"}


def embedded_wiki_xml() -> bytes:
    """Decompressed bytes of gensim's Wikipedia XML test file. The package is found, not
    imported: its __init__ imports scipy and more, a second per run start."""
    spec = importlib.util.find_spec("gensim")
    try:
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("no module named 'gensim'")
        folder = Path(next(iter(spec.submodule_search_locations)))
        return bz2.decompress((folder / "test" / "test_data" / WIKI_XML).read_bytes())
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise DataError(
            f"embedded corpus not found ({e}): `pip install gensim` provides {WIKI_XML}"
        ) from None


@dataclass(frozen=True)
class EnwikMiniConfig:
    fractions: tuple[float, ...] = (0.9, 0.05, 0.05)  # decompressing per run takes < 1 s

    def __post_init__(self) -> None:
        check_fractions(self.fractions)


@DATASETS.register("enwik_mini")
class EnwikMini:
    Config = EnwikMiniConfig

    @staticmethod
    def load(cfg: EnwikMiniConfig) -> TokenData:
        ids, vocab = bytes_to_ids(embedded_wiki_xml())
        splits = split_contiguous(ids, cfg.fractions)
        # what a cache entry's manifest records, computed here (6 MB: milliseconds)
        sha = {s: hashlib.sha256(a.tobytes()).hexdigest() for s, a in splits.items()}
        return TokenData("enwik_mini", splits, vocab, "bpc",
                         {"source": embedded_source(), "sha256": sha})
