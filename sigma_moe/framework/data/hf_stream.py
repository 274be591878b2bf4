"""`c4` and `pes2o`: web text and scientific papers, streamed shard by shard (paper: the C4
and peS2o rows of tab:new_results, trained for 100k steps, not an epoch; docs/REFERENCE.md
"Datasets": each document followed by a separator, BPE 8000 trained on the first shards,
train limited to the tokens that training needs, validation = the first ~0.5% of the
validation split; the paper reports that `valid`).

Source: the dataset's json(.gz) shards, either a local copy of (part of) its Hugging Face
repository (`source`: the repository root; the `train_files` / `valid_files` globs are
relative to it) or, with `source: ""` and nothing prepared or at <cache_dir>/raw/<name>,
streamed from the hub with `datasets` (the same globs as hf:// paths).
Order is the sorted shard order, documents in file order; nothing is shuffled, so the
first `train_tokens` tokens are always the same. The BPE is trained on the lines of the
first `spm_train_docs` training documents (SentencePiece skips over-long sentences, and
C4/peS2o paragraphs are lines). Newlines inside a document become word boundaries (the
SentencePiece normalizer), and every document ends with the model's </s> id.
Splits: `valid` = the first `valid_docs` validation documents (the paper's number); `test`
= the next `valid_docs` (disjoint, so that the task's final valid+test evaluation has a
held-out set that is not the paper's); `train` = the first `train_tokens` training tokens.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import itertools
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sigma_moe.framework.config import ConfigError, first_line
from sigma_moe.framework.data import DATASETS
from sigma_moe.framework.data.base import DataError, TokenData, reading, train_tokens_for
from sigma_moe.framework.data.cache import (
    Entry,
    Source,
    files_fingerprint,
    load_or_prepare,
)
from sigma_moe.framework.data.subword import (
    SpmSettings,
    build_subword,
    check_vocab_size,
    resolve_num_proc,
    subword_data,
)

log = logging.getLogger(__name__)
# 100k steps x batch 64 x context 512: the largest C4/peS2o run of the paper (docs/REFERENCE.md,
# "big" rows); the "small" rows (context 256) need half. Experiment configs set their own.
DEFAULT_TRAIN_TOKENS = train_tokens_for(100_000, 64, 512)


@dataclass(frozen=True)
class StreamConfig:
    source: str = ""  # local copy of the HF repo (root dir); "" = prepared cache / default / hub
    cache_dir: str = ""  # "" = $SIGMA_MOE_CACHE or ~/.cache/sigma_moe
    hf_repo: str = "allenai/c4"
    train_files: str = "en/c4-train.*.json.gz"  # glob relative to the repo root
    valid_files: str = "en/c4-validation.*.json.gz"
    text_field: str = "text"
    vocab_size: int = 8000  # REFERENCE: BPE 8000
    split_digits: bool = True
    spm_train_docs: int = 100_000  # first documents whose lines train the BPE (~1/3 shard)
    # tokens of the train split = batch x (steps x context + 1) (base.train_tokens_for);
    # 0 = DEFAULT_TRAIN_TOKENS. Not in the cache key: a cache with more tokens serves a run
    # that needs fewer (a prefix).
    train_tokens: int = 0
    valid_docs: int = 1823  # first documents of validation: 0.5% of C4-en's 364,608
    num_proc: int = 0  # encoding processes; 0 = all cores (does not change the result)

    def __post_init__(self) -> None:
        check_vocab_size(self.vocab_size)
        for name in ("spm_train_docs", "valid_docs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"dataset.{name}={getattr(self, name)}: set it to >= 1")
        if self.train_tokens < 0 or self.num_proc < 0:
            raise ConfigError("dataset.train_tokens and dataset.num_proc must be >= 0 "
                              "(0 = the default)")

    @property
    def needed_tokens(self) -> int:
        return self.train_tokens or DEFAULT_TRAIN_TOKENS

    def spm(self) -> SpmSettings:
        return SpmSettings(self.vocab_size, self.split_digits)


@dataclass(frozen=True)
class C4Config(StreamConfig):
    pass


@dataclass(frozen=True)
class Pes2oConfig(StreamConfig):
    hf_repo: str = "allenai/peS2o"
    train_files: str = "data/v2/train-*.json.gz"
    valid_files: str = "data/v2/valid-*.json.gz"
    # v2's validation split holds about as many documents as v1's (162,551 = 51,323 s2orc
    # + 111,228 s2ag, from the dataset card): 0.5% of it
    valid_docs: int = 813


@functools.cache
def hub_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be reached, or None: one HEAD request (10 s, through any
    https_proxy). With no network `datasets` retries for ~25 s, a warning per try, before
    failing; this fails at once. Any HTTP answer, even an error status, means reachable."""
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=10)
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:  # URLError, timeouts, a malformed HF_ENDPOINT
        return f"{endpoint} is unreachable: {getattr(e, 'reason', e)}"
    return None


def hf_texts(name: str, repo: str, prepare: str, split: str = "train",
             data_files: str | None = None, config: str | None = None,
             field: str = "text") -> Iterator[str]:
    """Streams `field` of a hub dataset: its `data_files` glob read as json, or `config`.
    `prepare`: the prepare_data.py command an error suggests instead."""
    try:
        from datasets import load_dataset
        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE and (problem := hub_problem(constants.ENDPOINT)):
            raise ConnectionError(problem)
        if data_files is not None:
            ds = load_dataset("json", data_files=f"hf://datasets/{repo}/{data_files}",
                              split="train", streaming=True)
        else:
            ds = load_dataset(repo, config, split=split, streaming=True)
        rows = iter(ds)
        first = next(rows)
    except Exception as e:  # offline, no `datasets`, a renamed repo: one actionable line
        reason = first_line(e)[:200]
        raise DataError(f"{name}: could not stream {repo} from the Hugging Face hub "
                        f"({type(e).__name__}: {reason}); prepare it with `{prepare}`"
                        ) from None
    for row in itertools.chain([first], rows):
        yield row[field]


def local_texts(files: list[Path], field: str) -> Iterator[str]:
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with reading(path), opener(path, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:  # its own position is the line's
                        raise DataError(f"{path}: line {i} is not JSON ({e.msg}, column "
                                        f"{e.colno}); is the file complete and in its "
                                        f"original format? (download it again)") from None
                    if not isinstance(row, dict) or field not in row:
                        has = sorted(row) if isinstance(row, dict) else type(row).__name__
                        raise DataError(f"{path}: line {i} has no field {field!r} (it has "
                                        f"{has}): set dataset.text_field")
                    if not isinstance(row[field], str):
                        raise DataError(f"{path}: line {i}: its {field!r} is "
                                        f"{type(row[field]).__name__}, not text")
                    yield row[field]


def _lines(docs: Iterator[str]) -> Iterator[str]:
    return (line for doc in docs for line in doc.split("\n"))


class HfStream:
    """Shared by `c4` and `pes2o`; subclasses set NAME and Config."""

    NAME = ""
    Config: type[StreamConfig] = StreamConfig

    @classmethod
    def settings(cls, cfg: StreamConfig) -> dict:
        keep = ("hf_repo", "train_files", "valid_files", "text_field", "spm_train_docs",
                "valid_docs")
        return {"dataset": cls.NAME, "spm": asdict(cfg.spm()), "test": "next valid_docs",
                **{k: getattr(cfg, k) for k in keep}}

    @classmethod
    def entry(cls, cfg: StreamConfig) -> Entry:
        name = cls.NAME

        def locate(root: Path) -> Source | None:
            train = sorted(root.glob(cfg.train_files))
            valid = sorted(root.glob(cfg.valid_files))
            if not (train and valid):
                return None
            return Source(files_fingerprint(train + valid),
                          {"train": lambda: local_texts(train, cfg.text_field),
                           "valid": lambda: local_texts(valid, cfg.text_field)})

        def online(prepare: str) -> Source:
            return Source({"hf": cfg.hf_repo}, {
                s: (lambda f=f: hf_texts(name, cfg.hf_repo, prepare, data_files=f,
                                         field=cfg.text_field))
                for s, f in (("train", cfg.train_files), ("valid", cfg.valid_files))})

        def build(src: Source, out: Path, previous: Entry | None) -> dict:
            texts = src.handle
            n = cfg.valid_docs

            def test() -> Iterator[str]:  # the validation shards' documents n..2n
                docs = 0
                for doc in itertools.islice(texts["valid"](), n, 2 * n):
                    docs += 1
                    yield doc
                if docs < n:  # valid and test would be short, silently
                    held = n + docs if docs else f"at most {n}"
                    raise DataError(f"{name}: the validation shards ({cfg.valid_files}) hold "
                                    f"{held} documents, fewer than the 2 x dataset.valid_docs"
                                    f"={n} that valid and test take: lower valid_docs or add "
                                    f"shards")

            splits = {"valid": lambda: itertools.islice(texts["valid"](), n),
                      "test": test, "train": texts["train"]}
            spm_texts = lambda: _lines(itertools.islice(texts["train"](), cfg.spm_train_docs))
            made = build_subword(out, splits, spm_texts, cfg.spm(), resolve_num_proc(cfg.num_proc),
                                 eos=True, desc=name, limits={"train": cfg.needed_tokens},
                                 previous=previous)
            made["exhausted"] = made["arrays"]["train"]["length"] < cfg.needed_tokens
            return made

        def full(e: Entry) -> bool:
            return e.manifest["arrays"]["train"]["length"] >= cfg.needed_tokens

        def enough(e: Entry) -> bool:  # a shorter cache is fine only if its source ran dry
            return full(e) or bool(e.manifest.get("exhausted"))

        what = f"shards matching {cfg.train_files} and {cfg.valid_files}"
        return load_or_prepare(name, cfg, cls.settings(cfg), what, locate, build, (name,),
                               online, enough, full)

    @classmethod
    def load(cls, cfg: StreamConfig) -> TokenData:
        e = cls.entry(cfg)
        train = e.array("train")
        if cfg.train_tokens and len(train) < cfg.train_tokens:  # the default takes what exists
            raise DataError(f"{cls.NAME}: the source holds only {len(train)} training tokens, "
                            f"train_tokens={cfg.train_tokens} requested; lower it or add shards")
        splits = {"train": train[: cfg.needed_tokens], "valid": e.array("valid"),
                  "test": e.array("test")}
        origin = e.origin()
        if len(train) > cfg.needed_tokens:  # the run reads a prefix: record that prefix's
            # sha256 (what an entry of exactly these tokens records), so that runs reading the
            # same tokens agree whichever entry served them (paper_tables' data versions)
            log.info("%s: hashing the %d-token prefix of %s this run reads", cls.NAME,
                     cfg.needed_tokens, e.path)
            origin["sha256"]["train"] = hashlib.sha256(splits["train"].data).hexdigest()
            origin["train_tokens_stored"] = len(train)
        return subword_data(cls.NAME, e, splits, origin, one_pass_key="dataset.train_tokens")


@DATASETS.register("c4")
class C4(HfStream):
    NAME = "c4"
    Config = C4Config


@DATASETS.register("pes2o")
class Pes2o(HfStream):
    NAME = "pes2o"
    Config = Pes2oConfig
