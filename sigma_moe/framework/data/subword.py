"""The SentencePiece pipeline shared by the subword datasets (docs/REFERENCE.md, "Datasets" and
"Metrics": BPE with 8000 pieces, split_digits on, trained on the train split; perplexity is
per SentencePiece token).

Texts (lines of WikiText, documents of C4/peS2o) are encoded one by one and concatenated
into one stream. Whether a text ends with a separator is the caller's choice: WikiText
lines get none (the reference encodes each line and glues the pieces, so a line break is
only the word boundary SentencePiece's dummy prefix already marks; blank lines encode to
nothing), documents of C4/peS2o end with the model's </s> id.
Encoding runs over `num_proc` worker processes, each fed chunks of texts.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from sigma_moe.framework.config import ConfigError, first_line
from sigma_moe.framework.data.base import DataError, TokenData
from sigma_moe.framework.data.cache import ArrayWriter, Entry

CHUNK_TEXTS = 2000  # texts per worker task: big enough to amortize pickling, small for memory
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpmSettings:
    """What decides the tokenizer (and so the cache key); built from a dataset's Config."""

    vocab_size: int = 8000
    split_digits: bool = True
    model_type: str = "bpe"
    train_texts: int = 0  # sample this many texts for training (0 = all of them)
    seed: int = 0  # SentencePiece's sampling seed, so the same data gives the same model


def check_vocab_size(vocab_size: int) -> None:
    if not 16 <= vocab_size <= 65535:
        raise ConfigError(f"dataset.vocab_size={vocab_size}: use 16..65535 (ids are uint16)")


def train_spm(texts: Iterable[str], s: SpmSettings, out: Path, desc: str = "") -> None:
    """Trains the model on `texts` (blank ones skipped) and writes it to `out`."""
    import sentencepiece as spm

    spm.set_random_generator_seed(s.seed)
    failed: list[DataError] = []

    def nonblank(texts):  # remembers a failure of the source (SentencePiece rewraps it)
        n = 0
        try:
            for t in texts:
                if t.strip():
                    n += 1
                    yield t
        except DataError as e:
            failed.append(e)
            raise
        if not n:  # SentencePiece's own answer: "INTERNAL: ... [!sentences_.empty()]"
            failed.append(DataError(f"{desc}: no text to train the SentencePiece model on "
                                    f"in the source's train split (an empty file?)"))
            raise failed[-1]
        # SentencePiece trains once it has read everything: minutes on WikiText-103, and its
        # own log is off (minloglevel), so say what the wait is
        log.info("%s: training the SentencePiece %s model (vocab %d) on %d texts ...", desc,
                 s.model_type, s.vocab_size, n)
        started.append(time.time())

    texts = nonblank(texts)
    model = io.BytesIO()
    started = [time.time()]  # then: when the reading ended and the training began
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(tqdm(texts, desc=f"{desc} spm texts", unit="text",
                                        disable=None, leave=False)),
            model_writer=model, vocab_size=s.vocab_size, model_type=s.model_type,
            split_digits=s.split_digits, input_sentence_size=s.train_texts,
            shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
            # tiny corpora (tests, toy data) may not support the requested size: take what
            # there is rather than fail; the vocab size is read back from the model
            hard_vocab_limit=False, minloglevel=2,
        )
    # SentencePiece raises what the iterator raised as "INTERNAL" (a RuntimeError); < 0.2.2
    # as a SystemError ("returned a result with an exception set")
    except (RuntimeError, SystemError) as e:
        if failed:  # the source failed (e.g. offline), not SentencePiece
            raise failed[0] from None
        raise DataError(f"{desc}: SentencePiece training failed: {e}") from None
    log.info("%s: SentencePiece model trained in %.1f s", desc, time.time() - started[-1])
    proto = without_thread_count(model.getvalue())
    pieces = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
    if pieces < s.vocab_size:  # hard_vocab_limit=False: what the text supports, silently
        log.warning("%s: the train text gives only %d of the dataset.vocab_size=%d pieces "
                    "asked; the model uses those (more text, or a smaller vocab_size, to "
                    "match)", desc, pieces, s.vocab_size)
    out.write_bytes(proto)


def without_thread_count(model: bytes) -> bytes:
    """The model records the threads it trained with: the same pieces built on machines
    with other core counts would be other files, so other data versions of the same tokens.
    sentencepiece's generated protobuf module needs a protobuf runtime at least as new as
    the one it was generated with: with an older one the model stays as trained."""
    try:
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(model)
    except Exception as e:  # ImportError, protobuf's VersionError: not the data's fault
        # the tokens are right; only the data version would differ between machines
        log.warning("the SentencePiece model keeps its thread count, so its data version "
                    "depends on this machine's core count: sentencepiece's model module does "
                    "not load (%s); a newer protobuf fixes it", first_line(e))
        return model
    proto.trainer_spec.ClearField("num_threads")
    return proto.SerializeToString(deterministic=True)


_SP: Any = None  # the worker's processor, loaded once by _init


def _init(model: bytes) -> None:
    import sentencepiece as spm

    global _SP
    _SP = spm.SentencePieceProcessor(model_proto=model)


def _init_worker(model: bytes) -> None:
    # a Ctrl-C is the parent's to handle (it ends the pool): each worker would print its
    # own traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init(model)


def _encode_chunk(texts: list[str], eos: bool, threads: int = 1) -> np.ndarray:
    pieces = _SP.encode(texts, num_threads=threads)
    if eos:
        end = [_SP.eos_id()]
        pieces = [p + end for p in pieces]
    return np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.uint16)


def _chunks(texts: Iterable[str]) -> Iterator[list[str]]:
    it = iter(texts)
    while chunk := list(itertools.islice(it, CHUNK_TEXTS)):
        yield chunk


def encode_texts(texts: Iterable[str], model: bytes, eos: bool,
                 num_proc: int = 1) -> Iterator[np.ndarray]:
    """Token ids of `texts` in order, as one uint16 array per chunk of texts.

    At most 2 chunks per worker are in flight, so a consumer that stops early (enough
    training tokens) stops the reading of the source as well; `Pool.imap` would read ahead
    without bound.
    """
    chunks = _chunks(texts)
    if num_proc <= 1:
        _init(model)
        for chunk in chunks:
            yield _encode_chunk(chunk, eos, threads=os.cpu_count() or 1)
        return
    with get_context().Pool(num_proc, initializer=_init_worker, initargs=(model,)) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_chunk, (chunk, eos)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def resolve_num_proc(num_proc: int) -> int:
    return num_proc if num_proc > 0 else (os.cpu_count() or 1)


def write_split(out_dir: Path, split: str, texts: Iterable[str], model: bytes, eos: bool,
                num_proc: int, limit: int = 0, desc: str = "") -> dict[str, Any]:
    """Encodes `texts` into `<out_dir>/<split>.bin` (at most `limit` tokens if > 0)."""
    writer = ArrayWriter(out_dir, split, np.uint16, limit)
    bar = tqdm(desc=f"{desc} {split}", unit="tok", unit_scale=True, disable=None,
               total=limit or None)
    stream = encode_texts(texts, model, eos, num_proc)
    try:
        for ids in stream:
            bar.update(writer.append(ids))
            if writer.full:
                break
    except BaseException:
        writer.abort()
        raise
    finally:
        stream.close()  # stops the worker pool when we leave early
        bar.close()
    return writer.close()


def word_starts(entry_path: Path) -> np.ndarray:
    """bool [vocab]: the pieces that start a word, for word-level perplexity
    (sigma_moe/tasks/lm.py).

    SentencePiece marks the start of every whitespace-separated word with "▁" (its
    defaults: a dummy prefix, whitespace split), so the "▁" pieces among some tokens
    count exactly the words they encode; the EOS token, which ends each document of C4 and
    peS2o and which the model predicts, counts as one as well.
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(entry_path / "spm.model"))
    starts = np.array([sp.id_to_piece(i).startswith("\u2581")  # "▁"
                       for i in range(sp.get_piece_size())])
    starts[sp.eos_id()] = True
    return starts


def subword_data(name: str, entry: Entry, splits: dict[str, np.ndarray],
                 origin: dict[str, Any] | None = None, **kwargs: Any) -> TokenData:
    """The TokenData of a prepared subword entry (build_subword): its vocabulary,
    perplexity, where it came from, and which tokens start a word (word-level perplexity)."""
    return TokenData(name, splits, entry.manifest["vocab_size"], "ppl",
                     entry.origin() if origin is None else origin,
                     word_start=word_starts(entry.path), **kwargs)


def reusable_model(previous: Entry | None) -> bytes | None:
    """The SentencePiece model of an entry being rebuilt (e.g. extended to more training
    tokens), unless it is missing or damaged (not its recorded sha256, or unreadable): then
    None, and the caller trains it anew rather than encode with a broken model."""
    import sentencepiece as spm

    path = previous.path / "spm.model" if previous is not None else None
    if path is None or not path.is_file():
        return None
    model = path.read_bytes()
    want = previous.checksums().get("spm.model")
    try:
        if want not in (None, hashlib.sha256(model).hexdigest()):
            raise ValueError("its sha256 differs from the manifest's")
        spm.SentencePieceProcessor(model_proto=model)
    except (ValueError, RuntimeError) as e:
        log.warning("%s is damaged (%s): training the model again", path, first_line(e))
        return None
    return model


def build_subword(out: Path, splits: dict[str, Callable[[], Iterable[str]]],
                  spm_texts: Callable[[], Iterable[str]], s: SpmSettings, num_proc: int,
                  eos: bool, desc: str, limits: dict[str, int] | None = None,
                  previous: Entry | None = None) -> dict[str, Any]:
    """Trains (or reuses `previous`'s) model, then encodes every split into `out`.

    Returns the manifest fields: arrays, vocab_size, metric, spm settings, the model's sha256.
    """
    import sentencepiece as spm

    model_path = out / "spm.model"
    if (model := reusable_model(previous)) is not None:
        model_path.write_bytes(model)
    else:
        train_spm(spm_texts(), s, model_path, desc)
        model = model_path.read_bytes()
    vocab = spm.SentencePieceProcessor(model_proto=model).get_piece_size()
    arrays = {name: write_split(out, name, texts(), model, eos, num_proc,
                                (limits or {}).get(name, 0), desc)
              for name, texts in splits.items()}
    if empty := [name for name, info in arrays.items() if not info["length"]]:
        raise DataError(f"{desc}: no text for the {' and '.join(empty)} split(s) in the "
                        f"source (an empty file?)")
    return {"arrays": arrays, "vocab_size": vocab, "metric": "ppl", "spm": asdict(s),
            "sha256": {"spm.model": hashlib.sha256(model).hexdigest()}}
