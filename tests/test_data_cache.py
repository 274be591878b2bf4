"""The prepared-data cache (sigma_moe/framework/data/cache.py): reuse, invalidation, interrupted and
concurrent preparation, and the one-line error for missing data. Local fixtures only."""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import random
import time
from pathlib import Path

import numpy as np
import pytest

from sigma_moe.framework.config import first_line
from sigma_moe.framework.data import DataError, cache, subword
from sigma_moe.framework.data.cache import find_prepared
from sigma_moe.framework.data.enwik8 import Enwik8, Enwik8Config
from sigma_moe.framework.data.wt103 import FILES, Wt103, Wt103Config, settings

WORDS = ("the of and in to a is was for on as by with from at that game series season "
         "first one two <unk> @-@ , . ( ) ; 1999 2004 17 ' \" city river").split()


def write_wikitext(d: Path, lines: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A WikiText-103-shaped directory: ` = Title = ` headings, blank lines between."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (lines or {"train": 400, "valid": 40, "test": 40}).items():
        out = [" \n"]
        for i in range(n):
            if i % 10 == 0:
                out += [f" = Heading {rng.choice(WORDS)} {i} = \n", " \n"]
            out += [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 25))) + " \n",
                    " \n"]
        (d / FILES[split]).write_text("".join(out), encoding="utf-8")
    return d


def cfg_for(tmp_path: Path, **kw) -> Wt103Config:
    return Wt103Config(**{"source": str(tmp_path / "wt"), "cache_dir": str(tmp_path / "cache"),
                          "vocab_size": 150, "num_proc": 1, **kw})


def _fail(*a, **k):
    raise AssertionError("re-tokenized although a complete cache exists")


def test_second_load_reuses_cache_and_tokenizer_change_invalidates(tmp_path, monkeypatch):
    write_wikitext(tmp_path / "wt")
    first = Wt103.load(cfg_for(tmp_path))
    monkeypatch.setattr(subword, "train_spm", _fail)
    monkeypatch.setattr(subword, "encode_texts", _fail)
    again = Wt103.load(cfg_for(tmp_path))
    for s in FILES:
        assert isinstance(again.splits[s], np.memmap) and again.splits[s].dtype == np.uint16
        np.testing.assert_array_equal(again.splits[s], first.splits[s])
    # the source can also be left out once prepared: the run finds the cache by settings
    again = Wt103.load(cfg_for(tmp_path, source=""))
    np.testing.assert_array_equal(again.splits["valid"], first.splits["valid"])
    with pytest.raises(AssertionError, match="re-tokenized"):  # a tokenizer setting changed
        Wt103.load(cfg_for(tmp_path, vocab_size=140))
    with pytest.raises(AssertionError, match="re-tokenized"):
        Wt103.load(cfg_for(tmp_path, split_digits=False))
    monkeypatch.undo()
    other = Wt103.load(cfg_for(tmp_path, vocab_size=140))
    assert other.vocab_size == 140 and first.vocab_size == 150
    assert len(list((tmp_path / "cache" / "wt103").glob("*/manifest.json"))) == 2


def test_source_change_invalidates(tmp_path, monkeypatch):
    write_wikitext(tmp_path / "wt")
    Wt103.load(cfg_for(tmp_path))
    write_wikitext(tmp_path / "wt", {"valid": 41}, seed=1)  # a different valid file
    monkeypatch.setattr(subword, "train_spm", _fail)
    with pytest.raises(AssertionError, match="re-tokenized"):
        Wt103.load(cfg_for(tmp_path))


def test_interrupted_preparation_leaves_nothing_complete(tmp_path, monkeypatch):
    write_wikitext(tmp_path / "wt")
    cfg, real = cfg_for(tmp_path), subword.write_split

    def dies_on_valid(out, split, *a, **k):
        if split == "valid":
            raise KeyboardInterrupt  # as if the job were stopped mid-way (after train)
        return real(out, split, *a, **k)

    monkeypatch.setattr(subword, "write_split", dies_on_valid)
    with pytest.raises(KeyboardInterrupt):
        Wt103.load(cfg)
    root = tmp_path / "cache" / "wt103"
    assert find_prepared(root, settings(cfg)) is None
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    # a job killed outright (no cleanup) leaves its temporary directory: never taken as done
    key = next(root.glob("*.lock")).stem
    stale = root / f".tmp-{key}-deadbeef"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    monkeypatch.undo()
    data = Wt103.load(cfg)
    assert not stale.exists()
    fresh = Wt103.load(cfg_for(tmp_path, cache_dir=str(tmp_path / "clean")))
    for s in FILES:
        np.testing.assert_array_equal(data.splits[s], fresh.splits[s])


def _prepare_in_child(source: str, cache: str, out) -> None:
    """Runs in a spawned process: a slow BPE training keeps the lock held for a while."""
    calls = []
    real = subword.train_spm

    def slow_train(*a, **k):
        calls.append(1)
        time.sleep(1.5)
        return real(*a, **k)

    subword.train_spm = slow_train
    data = Wt103.load(Wt103Config(source=source, cache_dir=cache, vocab_size=150, num_proc=1))
    digest = hashlib.sha256(b"".join(data.splits[s].tobytes() for s in FILES)).hexdigest()
    out.put((len(calls), digest, str(Wt103.entry(Wt103Config(
        source=source, cache_dir=cache, vocab_size=150)).path)))


def test_two_processes_prepare_once_and_agree(tmp_path):
    write_wikitext(tmp_path / "wt")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_child,
                         args=(str(tmp_path / "wt"), str(tmp_path / "cache"), q))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == [0, 1]  # one built, the other waited and reused
    assert results[0][1:] == results[1][1:]
    single = Wt103.load(cfg_for(tmp_path, cache_dir=str(tmp_path / "solo")))
    expect = hashlib.sha256(b"".join(single.splits[s].tobytes() for s in FILES)).hexdigest()
    assert results[0][1] == expect
    root = tmp_path / "cache" / "wt103"
    assert not list(root.glob(".tmp-*"))


def test_missing_data_error_is_one_line_with_the_command(tmp_path, monkeypatch):
    monkeypatch.delenv("SIGMA_MOE_CACHE", raising=False)
    with pytest.raises(DataError) as e:
        Wt103.load(Wt103Config(source=str(tmp_path / "nowhere"), cache_dir=str(tmp_path)))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("wt103:") and str(tmp_path / "nowhere") in msg
    assert f"python scripts/prepare_data.py wt103 --source /path/to/wikitext-103 " \
           f"--cache-dir {tmp_path}" in msg
    (tmp_path / "wt").mkdir()  # a directory without the release files
    with pytest.raises(DataError, match="wiki.{train,valid,test}.tokens"):
        Wt103.load(Wt103Config(source=str(tmp_path / "wt"), cache_dir=str(tmp_path)))
    # no source, nothing prepared, nothing at the default place (enwik8 has no online path)
    monkeypatch.setenv("SIGMA_MOE_CACHE", str(tmp_path / "env"))
    with pytest.raises(DataError) as e:
        Enwik8.load(Enwik8Config())
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "env" / "raw" / "enwik8") in msg
    assert "python scripts/prepare_data.py enwik8 --source /path/to/enwik8`" in msg


def test_damaged_entry_is_reported(tmp_path):
    write_wikitext(tmp_path / "wt")
    Wt103.load(cfg_for(tmp_path))
    entry = Wt103.entry(cfg_for(tmp_path))
    with open(entry.path / "valid.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataError, match="damaged"):
        Wt103.load(cfg_for(tmp_path))


def model_module_or_skip():
    """sentencepiece's protobuf module of the model. Skipped where it does not load: e.g.
    sentencepiece 0.2.3 needs protobuf >= 7.36.1 and does not say so, and wandb before 0.26
    holds protobuf below 7 (measured 2026-11-27)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except Exception as e:
        pytest.skip(f"sentencepiece's model module does not load: {first_line(e)}")
    return sentencepiece_model_pb2


@pytest.mark.parametrize("split_digits", [True, False])
def test_the_tokenizer_is_bpe_and_splits_digits_as_configured(tmp_path, split_digits):
    """docs/REFERENCE.md: a BPE SentencePiece model that splits numbers into digits."""
    import sentencepiece as spm

    sentencepiece_model_pb2 = model_module_or_skip()
    texts = [f"In {1900 + i} the town had {i * 37 + 1234} people." for i in range(400)]
    subword.train_spm(texts, subword.SpmSettings(120, split_digits), tmp_path / "spm.model")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tmp_path / "spm.model").read_bytes())
    assert proto.trainer_spec.model_type == proto.trainer_spec.BPE
    pieces = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model")).encode(
        "In 2024 there were 98765", out_type=str)
    numbers = [p.lstrip("\u2581") for p in pieces if any(c.isdigit() for c in p)]
    assert "".join(numbers) == "202498765"
    assert all(len(n) == 1 for n in numbers) == split_digits, pieces


def test_the_model_file_does_not_depend_on_the_core_count(tmp_path, monkeypatch):
    """SentencePiece writes its thread count into the model: the same pieces trained on 1 or
    8 cores were other files, so other data versions (results.json's data sha256)."""
    model_module_or_skip()
    texts = [f"In {1900 + i} the town had {i * 37 + 1234} people." for i in range(200)]
    built = []
    for cores in (1, 8):
        monkeypatch.setattr(subword.os, "cpu_count", lambda c=cores: c)
        subword.train_spm(texts, subword.SpmSettings(100, True), tmp_path / f"{cores}.model")
        built.append((tmp_path / f"{cores}.model").read_bytes())
    assert built[0] == built[1]


def test_a_protobuf_runtime_that_cannot_read_the_model_leaves_it_as_trained(monkeypatch,
                                                                           caplog):
    """sentencepiece's generated module refuses a protobuf runtime older than its own: the
    model stays as trained, and the user hears what that costs."""
    import sys

    import sentencepiece

    monkeypatch.delattr(sentencepiece, "sentencepiece_model_pb2", raising=False)
    monkeypatch.setitem(sys.modules, "sentencepiece.sentencepiece_model_pb2", None)
    with caplog.at_level("WARNING", logger=subword.log.name):
        assert subword.without_thread_count(b"\x12\x03\x80\x01\x02") == b"\x12\x03\x80\x01\x02"
    assert caplog.messages == [
        "the SentencePiece model keeps its thread count, so its data version depends on this "
        "machine's core count: sentencepiece's model module does not load (import of "
        "sentencepiece.sentencepiece_model_pb2 halted; None in sys.modules); a newer protobuf "
        "fixes it"]


def test_a_vocab_smaller_than_asked_is_said(tmp_path, caplog):
    """Tiny text cannot give vocab_size pieces: SentencePiece (hard_vocab_limit=False)
    takes what there is, and the user hears it."""
    import sentencepiece as spm

    texts = ["abc abd abe"] * 20
    with caplog.at_level("WARNING", logger=subword.log.name):
        subword.train_spm(texts, subword.SpmSettings(500, True), tmp_path / "spm.model", "toy")
    n = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model")).get_piece_size()
    assert n < 500 and caplog.messages == [
        f"toy: the train text gives only {n} of the dataset.vocab_size=500 pieces asked; "
        "the model uses those (more text, or a smaller vocab_size, to match)"]
    caplog.clear()
    subword.train_spm(texts, subword.SpmSettings(n, True), tmp_path / "spm.model", "toy")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_source_failing_during_bpe_training_keeps_its_own_message(tmp_path):
    """SentencePiece rewraps what its input iterator raises ("INTERNAL: ..."): an offline
    source's one-line DataError must come out as it was, not as a SentencePiece failure."""
    def texts():
        yield from ["some text to start with"] * 50
        raise DataError("c4: cannot stream allenai/c4 (offline); prepare it with `...`")

    with pytest.raises(DataError) as err:
        subword.train_spm(texts(), subword.SpmSettings(40, True), tmp_path / "spm.model")
    assert str(err.value).startswith("c4: cannot stream") and "SentencePiece" not in str(
        err.value)


def test_checksums_are_recorded_checked_by_verify_and_carried_by_the_data(tmp_path):
    """The manifest records every file's sha256 as it is written; `Entry.verify` re-reads
    them (a byte changed in place keeps the size, which loading checks, the same) and the
    loaded data carries them, with the entry, to results.json."""
    import json

    write_wikitext(tmp_path / "wt")
    data = Wt103.load(cfg_for(tmp_path))
    entry = Wt103.entry(cfg_for(tmp_path))
    files = {f"{s}.bin" for s in FILES} | {"spm.model"}
    sha = {name: hashlib.sha256((entry.path / name).read_bytes()).hexdigest() for name in files}
    assert entry.checksums() == sha and entry.verify() == []
    assert data.origin["cache_entry"] == str(entry.path)
    assert data.origin["sha256"] == {**{s: sha[f"{s}.bin"] for s in FILES},
                                     "spm.model": sha["spm.model"]}
    assert data.origin["source"] == entry.manifest["source"] and data.origin["prepared"]
    with open(entry.path / "train.bin", "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))
    Wt103.load(cfg_for(tmp_path))  # same size: loads (hashing GBs at every run would not pay)
    assert entry.verify() == ["train.bin: sha256 differs from the manifest's (damaged)"]
    (entry.path / "valid.bin").unlink()
    manifest = json.loads((entry.path / "manifest.json").read_text())
    del manifest["arrays"]["test"]["sha256"]  # an entry prepared before checksums existed
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    problems = Wt103.entry(cfg_for(tmp_path)).verify()
    assert problems[0].startswith("train.bin: sha256 differs") and "valid.bin: missing" in problems
    assert "test.bin: no checksum recorded (prepared before checksums existed" in problems[-1]


def test_a_damaged_tokenizer_is_trained_again_not_reused(tmp_path, caplog):
    """Extending an entry (C4's train_tokens raised) reuses its SentencePiece model; a
    damaged one (not its sha256, or not a model at all) is trained anew, with a warning,
    instead of failing in SentencePiece or encoding with it."""
    write_wikitext(tmp_path / "wt")
    Wt103.load(cfg_for(tmp_path))
    entry = Wt103.entry(cfg_for(tmp_path))
    model_file = entry.path / "spm.model"
    good = model_file.read_bytes()
    assert subword.reusable_model(entry) == good and subword.reusable_model(None) is None
    model_file.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, parses maybe
    assert subword.reusable_model(entry) is None
    assert "sha256 differs" in caplog.text and str(model_file) in caplog.text
    del entry.manifest["sha256"]  # prepared before checksums: it must still parse
    model_file.write_bytes(good[: len(good) // 2])
    assert subword.reusable_model(entry) is None
    model_file.unlink()
    assert subword.reusable_model(entry) is None


def test_preparing_inside_a_run_says_what_it_is_doing(tmp_path, capsys):
    """Hydra's job logging is off in runs: the data pipeline's lines (SentencePiece
    training, the entry written) reach stderr through console_logging, once each."""
    import logging

    from sigma_moe.framework.loggers import console_logging

    console_logging()
    console_logging()  # run.py in a sequential sweep: still one handler
    try:
        write_wikitext(tmp_path / "wt")
        Wt103.load(cfg_for(tmp_path))
        err = capsys.readouterr().err
        assert err.count("wt103: training the SentencePiece bpe model (vocab 150) on ") == 1
        assert "wt103: SentencePiece model trained in " in err
        assert f"prepared {Wt103.entry(cfg_for(tmp_path)).path} in " in err
    finally:
        log = logging.getLogger("sigma_moe.framework")
        log.handlers.clear()
        log.setLevel(logging.NOTSET)


def _entry(root: Path, settings, source: str, created: float, fmt=cache.FORMAT) -> Path:
    path = root / f"{cache.digest(settings)}-{cache.digest(source)}"
    path.mkdir(parents=True)
    (path / cache.MANIFEST).write_text(json.dumps(
        {"format": fmt, "settings": settings, "source": source, "created": created,
         "arrays": {}}))
    return path


def test_find_prepared_takes_the_newest_entry(tmp_path):
    """Mutant `max(found, key=created)` -> `min`."""
    settings = {"vocab": 8000}
    _entry(tmp_path, settings, "a", created=100.0)
    newest = _entry(tmp_path, settings, "b", created=200.0)
    _entry(tmp_path, settings, "c", created=150.0)
    assert find_prepared(tmp_path, settings).path == newest


def test_an_entry_of_another_format_is_not_read(tmp_path):
    """Mutant: `_read_entry` drops its `format == FORMAT` check (old layouts would load)."""
    settings = {"vocab": 8000}
    _entry(tmp_path, settings, "a", created=100.0, fmt=cache.FORMAT - 1)
    assert find_prepared(tmp_path, settings) is None
    ok = _entry(tmp_path, settings, "b", created=50.0)
    assert find_prepared(tmp_path, settings).path == ok
