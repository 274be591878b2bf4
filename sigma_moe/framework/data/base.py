"""Token data and the Transformer-XL batching of docs/REFERENCE.md ("Batching").

A split's token stream is cut into `batch_size` contiguous streams read sequentially in
segments (no shuffling), so the model's memory carries across steps. Under data
parallelism each rank reads its own slice of the streams: the union over ranks is exactly
the single-process batch, which makes DDP and one process agree.
"""
from __future__ import annotations

import gzip
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from sigma_moe.framework.config import ConfigError, first_line


class DataError(RuntimeError):
    """Missing/corrupt dataset; the message says what was looked for and how to fix it."""


@contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """A damaged source file (truncated archive, bytes that are not UTF-8) becomes a
    one-line DataError naming it, not a traceback without the file (a line that is not JSON:
    hf_stream.local_texts, which knows the line)."""
    try:
        yield
    except (UnicodeDecodeError, EOFError, zlib.error, zipfile.BadZipFile,
            gzip.BadGzipFile) as e:
        raise DataError(f"{path}: {type(e).__name__}: {first_line(e)}; is the file complete "
                        f"and in its original format? (download it again)") from None


@dataclass
class TokenData:
    name: str
    splits: dict[str, np.ndarray]  # split -> 1-D array of token ids (may be a memmap)
    vocab_size: int
    metric: Literal["bpc", "ppl"]  # bits/char for byte data, perplexity for subword data
    # where the tokens came from (cache entry, source, sha256s: Entry.origin), for results.json
    origin: dict[str, Any] = field(default_factory=dict)
    # for a corpus the paper reads once (C4, peS2o): the config key that sets how many
    # training tokens there are; a run that would read them twice is warned (sigma_moe/tasks/lm.py)
    one_pass_key: str = ""
    # bool [vocab_size]: the tokens that start a word (subword data: evaluation then adds
    # word-level perplexity, sigma_moe/tasks/lm.py; docs/REFERENCE.md "Metrics"); None: not known
    word_start: np.ndarray | None = None

    def split(self, name: str) -> np.ndarray:
        if name not in self.splits:
            raise DataError(f"dataset {self.name!r} has no split {name!r} ({list(self.splits)})")
        return self.splits[name]


def bytes_to_ids(data: bytes) -> tuple[np.ndarray, int]:
    """Bytes -> ids over the distinct bytes present (REFERENCE: enwik8 vocab ~205)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    present = np.unique(raw)
    lut = np.zeros(256, dtype=np.uint8)
    lut[present] = np.arange(len(present), dtype=np.uint8)
    return lut[raw], len(present)


def check_fractions(fractions: tuple[float, ...]) -> None:
    """dataset.fractions: the train / valid / test shares of an embedded corpus."""
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
        raise ConfigError(f"dataset.fractions={list(fractions)}: give 3 positive numbers "
                          f"summing to 1")


def split_contiguous(ids: np.ndarray, fractions: tuple[float, float, float]
                     ) -> dict[str, np.ndarray]:
    """First / next / last parts, like enwik8's 90M / 5M / 5M."""
    n = len(ids)
    a = int(n * fractions[0])
    b = a + int(n * fractions[1])
    return {"train": ids[:a], "valid": ids[a:b], "test": ids[b:]}


def train_tokens_for(steps: int, batch_size: int, context: int) -> int:
    """Tokens that `steps` training segments read without wrapping: every stream needs one
    more than steps x context, the target of its last input."""
    return batch_size * (steps * context + 1)


class StreamBatcher:
    """Yields (input_BT, target_BT) segments of `batch_size` contiguous streams.

    `batch_size` is the global batch; rank r of `world_size` reads streams
    [r*B/W, (r+1)*B/W). Training wraps around at the end of an epoch (the caller resets
    memory when `epoch_start` is set) and reads whole segments only: the last
    (stream_len - 1) % seq_len targets of each stream wait for no epoch (19 x 16 = 304 of
    enwik_mini's 5.48M at the main job's shape); evaluation (`segments()`) reads each token
    once, with a shorter last segment. The len(tokens) % batch_size tokens past the last
    stream are read by neither.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int,
                 rank: int = 0, world_size: int = 1):
        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} is not divisible by {world_size} ranks")
        self.stream_len = len(tokens) // batch_size
        if self.stream_len < 2:
            raise DataError(f"{len(tokens)} tokens are too few for {batch_size} streams")
        per_rank = batch_size // world_size
        full = tokens[: self.stream_len * batch_size].reshape(batch_size, self.stream_len)
        self.streams_BN = full[rank * per_rank : (rank + 1) * per_rank]
        self.seq_len = seq_len
        self.steps_per_epoch = max(1, (self.stream_len - 1) // seq_len)
        self.epoch, self.step_in_epoch = 0, 0

    def _segment(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = np.asarray(self.streams_BN[:, start : start + length + 1], dtype=np.int64)
        chunk_t = torch.from_numpy(chunk)
        return chunk_t[:, :-1], chunk_t[:, 1:]

    def next(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The next training segment and whether it starts an epoch (reset memory then)."""
        epoch_start = self.step_in_epoch == 0
        x, y = self._segment(self.step_in_epoch * self.seq_len, self.seq_len)
        self.step_in_epoch += 1
        if self.step_in_epoch == self.steps_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return x, y, epoch_start

    def segments(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every target token of the streams exactly once (evaluation)."""
        for start in range(0, self.stream_len - 1, self.seq_len):
            yield self._segment(start, min(self.seq_len, self.stream_len - 1 - start))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
