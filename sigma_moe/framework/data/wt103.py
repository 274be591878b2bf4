"""`wt103`: WikiText-103 with an 8000-piece SentencePiece BPE vocabulary (paper: the
WikiText-103 rows of its tables; docs/REFERENCE.md "Datasets" and "Metrics": subword perplexity).

Source: the tokenized v1 release (wiki.train.tokens / wiki.valid.tokens / wiki.test.tokens,
with its `<unk>` and `@-@` left as text) as a directory, its `wikitext-103/` parent, or
wikitext-103-v1.zip; with `source: ""` a prepared cache, else <cache_dir>/raw/wikitext-103,
else the same lines streamed from the Hugging Face hub (Salesforce/wikitext).
Each line is encoded separately and the pieces are concatenated with no separator, as the
reference does; blank lines (every other line of the release) contribute nothing.
"""
from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.data import DATASETS
from sigma_moe.framework.data.base import DataError, TokenData, reading
from sigma_moe.framework.data.cache import Entry, Source, files_fingerprint, load_or_prepare
from sigma_moe.framework.data.subword import (
    SpmSettings,
    build_subword,
    check_vocab_size,
    resolve_num_proc,
    subword_data,
)

FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
HF_REPO, HF_CONFIG = "Salesforce/wikitext", "wikitext-103-v1"
# WikiText-2's files have the same names: its train file is 11 MB, WikiText-103's 539 MB
MIN_TRAIN_BYTES = 100_000_000
log = logging.getLogger(__name__)


def check_train_size(where: str, n_bytes: int) -> None:
    if n_bytes < MIN_TRAIN_BYTES:
        log.warning("%s: wiki.train.tokens has %.1f MB, WikiText-103's has 539 MB (WikiText-2's "
                    "11 MB, with the same file names): is this the WikiText-103 release?",
                    where, n_bytes / 1e6)


@dataclass(frozen=True)
class Wt103Config:
    source: str = ""  # directory / zip of the v1 release; "" = prepared cache or default
    cache_dir: str = ""  # "" = $SIGMA_MOE_CACHE or ~/.cache/sigma_moe
    vocab_size: int = 8000  # REFERENCE: BPE 8000
    split_digits: bool = True  # REFERENCE: split_digits on
    spm_train_lines: int = 0  # lines sampled to train the BPE; 0 = the whole train file
    num_proc: int = 0  # encoding processes; 0 = all cores (does not change the result)

    def __post_init__(self) -> None:
        check_vocab_size(self.vocab_size)
        if self.spm_train_lines < 0 or self.num_proc < 0:
            raise ConfigError("dataset.spm_train_lines and dataset.num_proc must be >= 0 "
                              "(0 = every line / all cores)")
        if 0 < self.spm_train_lines <= 100:  # SentencePiece refuses it, after reading them all
            raise ConfigError(f"dataset.spm_train_lines={self.spm_train_lines}: SentencePiece "
                              f"samples more than 100 lines (or 0: every line)")

    def spm(self) -> SpmSettings:
        return SpmSettings(self.vocab_size, self.split_digits, train_texts=self.spm_train_lines)


LineReader = Callable[[str], Iterator[str]]


def _zip_reader(path: Path) -> LineReader | None:
    with zipfile.ZipFile(path) as z:
        members = {Path(n).name: n for n in z.namelist()}
        if not all(f in members for f in FILES.values()):
            return None
        check_train_size(str(path), z.getinfo(members[FILES["train"]]).file_size)

    def lines(split: str) -> Iterator[str]:
        with reading(f"{path} ({members[FILES[split]]})"), zipfile.ZipFile(path) as z, \
                z.open(members[FILES[split]]) as f:
            yield from io.TextIOWrapper(f, encoding="utf-8")

    return lines


def locate(path: Path) -> Source | None:
    """The release at `path`: a zip, a directory of the three files, or its parent."""
    if path.is_file():
        if path.suffix == ".zip" and not zipfile.is_zipfile(path):  # not "no release here"
            raise DataError(f"{path}: not a complete zip archive; is the download complete? "
                            f"(download it again)")
        reader = _zip_reader(path) if zipfile.is_zipfile(path) else None
        return Source(files_fingerprint([path]), reader) if reader else None
    for d in (path, path / "wikitext-103"):
        files = [d / f for f in FILES.values()]
        if all(f.is_file() for f in files):
            check_train_size(str(d), files[0].stat().st_size)
            def lines(split: str, d: Path = d) -> Iterator[str]:
                with reading(d / FILES[split]), open(d / FILES[split], encoding="utf-8") as f:
                    yield from f

            return Source(files_fingerprint(files), lines)
    return None


def online(prepare: str) -> Source:
    from sigma_moe.framework.data.hf_stream import hf_texts

    hf_split = {"valid": "validation"}

    def lines(split: str) -> Iterator[str]:
        # the hub repo holds parquet files; a local copy is the v1 release (locate above)
        return hf_texts("wt103", HF_REPO, prepare, split=hf_split.get(split, split),
                        config=HF_CONFIG)

    return Source({"hf": f"{HF_REPO}/{HF_CONFIG}"}, lines)


def settings(cfg: Wt103Config) -> dict:
    return {"dataset": "wt103", "spm": asdict(cfg.spm()), "lines": "non-blank, no separator"}


def nonblank(lines: Iterator[str]) -> Iterator[str]:
    return (s for line in lines if (s := line.strip()))


@DATASETS.register("wt103")
class Wt103:
    Config = Wt103Config

    @staticmethod
    def entry(cfg: Wt103Config) -> Entry:
        def build(src: Source, out: Path, previous: Entry | None) -> dict:
            read: LineReader = src.handle
            splits = {s: (lambda s=s: nonblank(read(s))) for s in FILES}
            return build_subword(out, splits, splits["train"], cfg.spm(),
                                 resolve_num_proc(cfg.num_proc), eos=False, desc="wt103")

        return load_or_prepare("wt103", cfg, settings(cfg), "WikiText-103 v1 release "
                               "(wiki.{train,valid,test}.tokens)", locate, build,
                               ("wikitext-103", "wikitext-103-v1.zip"), online)

    @staticmethod
    def load(cfg: Wt103Config) -> TokenData:
        e = Wt103.entry(cfg)
        return subword_data("wt103", e, {s: e.array(s) for s in FILES})
