"""What each dataset of issue 5 yields (docs/REFERENCE.md, "Datasets"): exact split boundaries,
line/document handling, the training-token limit, the embedded `wikitext_mini` corpus and
`scripts/prepare_data.py`. WikiText-103, enwik8, C4 and peS2o are checked on local fixtures
shaped like the originals; nothing is downloaded."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import random
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sigma_moe.framework.config import from_dict
from sigma_moe.framework.data import DATASETS, DataError, enwik8, hf_stream, subword
from sigma_moe.framework.data import cache as subword_cache
from sigma_moe.framework.data.base import bytes_to_ids, split_contiguous
from sigma_moe.framework.data.enwik8 import Enwik8, Enwik8Config, split_sizes
from sigma_moe.framework.data.hf_stream import C4, C4Config, Pes2o, Pes2oConfig
from sigma_moe.framework.data.wikitext_mini import WikitextMini, WikitextMiniConfig
from sigma_moe.framework.data.wt103 import FILES, Wt103, Wt103Config
from tests.data_helpers import decoder, sentence, write_shards

ROOT = Path(__file__).resolve().parent.parent

def test_registry_and_yamls_agree():
    import yaml

    yamls = sorted(p.stem for p in (ROOT / "configs" / "dataset").glob("*.yaml"))
    assert yamls == DATASETS.names()  # every kind has its yaml, every yaml its class
    for name in yamls:
        fields = yaml.safe_load((ROOT / "configs" / "dataset" / f"{name}.yaml").read_text())
        assert fields.pop("kind") == name
        cls = DATASETS.get(name)
        assert from_dict(cls.Config, fields) == cls.Config()  # the yaml states the defaults


def test_split_contiguous_is_first_next_last():
    """The embedded corpora's splits, like enwik8's 90M / 5M / 5M."""
    ids = np.arange(1000)
    parts = split_contiguous(ids, (0.9, 0.05, 0.05))
    assert [len(parts[k]) for k in ("train", "valid", "test")] == [900, 50, 50]
    np.testing.assert_array_equal(np.concatenate(list(parts.values())), ids)


def test_wt103_each_line_encoded_blank_lines_dropped_splits_exact(tmp_path, caplog):
    rng = random.Random(0)
    src = tmp_path / "wikitext-103"
    src.mkdir()
    text = {}
    for split, n in (("train", 300), ("valid", 30), ("test", 20)):
        lines = [" "]
        for i in range(n):  # headings and blank lines as in the release
            lines += [" = = gamma = = "] * (i % 10 == 0) + [sentence(rng, rng.randint(3, 20)), " "]
        text[split] = [line.strip() for line in lines if line.strip()]
        (src / FILES[split]).write_text("\n".join(lines) + "\n")
    zpath = tmp_path / "wikitext-103-v1.zip"  # the release archive works as well
    with zipfile.ZipFile(zpath, "w") as z:
        for f in FILES.values():
            z.write(src / f, f"wikitext-103/{f}")
    for source in (tmp_path, zpath):
        cfg = Wt103Config(source=str(source), cache_dir=str(tmp_path / "c"), vocab_size=100,
                          num_proc=1)
        data = Wt103.load(cfg)
        assert data.metric == "ppl" and data.vocab_size == 100
        sp = decoder(Wt103.entry(cfg).path)
        for split, lines in text.items():
            ids = data.splits[split]
            assert ids.max() < data.vocab_size
            # the stream is exactly its own file's lines, pieces glued with no separator
            assert sp.decode(ids.tolist()) == " ".join(lines)
            assert len(ids) == sum(len(sp.encode(line)) for line in lines)
    # a train file this small is not WikiText-103's (WikiText-2 has the same file names)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings and all("wiki.train.tokens has 0.0 MB, WikiText-103's has 539 MB" in w
                            for w in warnings), warnings


def test_wt103_parallel_encoding_matches_serial(tmp_path):
    rng = random.Random(1)
    for split in FILES:
        lines = [sentence(rng, 12) for _ in range(2500 if split == "train" else 10)]
        (tmp_path / FILES[split]).write_text("\n".join(lines))
    kw = dict(source=str(tmp_path), vocab_size=60)
    one = Wt103.load(Wt103Config(cache_dir=str(tmp_path / "a"), num_proc=1, **kw))
    two = Wt103.load(Wt103Config(cache_dir=str(tmp_path / "b"), num_proc=2, **kw))
    np.testing.assert_array_equal(one.splits["train"], two.splits["train"])


def test_encoding_workers_leave_a_ctrl_c_to_the_parent(monkeypatch):
    """Each pool worker printed its own KeyboardInterrupt traceback; the parent ends the
    pool (and keeps nothing half-written)."""
    import signal

    seen = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: seen.append((sig, handler)))
    monkeypatch.setattr(subword, "_init", lambda model: seen.append(model))
    subword._init_worker(b"model")
    assert seen == [(signal.SIGINT, signal.SIG_IGN), b"model"]


def test_enwik8_split_boundaries(tmp_path, monkeypatch):
    assert split_sizes(100_000_000) == (90_000_000, 5_000_000, 5_000_000)
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 4099)  # a small stand-in for the real file
    raw = bytes(random.Random(2).choice(b"<page>abc \n\xc3\xa9[]{}") for _ in range(4099))
    (tmp_path / "enwik8").write_bytes(raw)
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", raw)
    ids, vocab = bytes_to_ids(raw)
    a, b = int(4099 * 0.9), int(4099 * 0.9) + int(4099 * 0.05)
    for source in ("enwik8", "enwik8.zip"):
        cfg = Enwik8Config(source=str(tmp_path / source), cache_dir=str(tmp_path / source[-3:]))
        data = Enwik8.load(cfg)
        assert data.metric == "bpc" and data.vocab_size == vocab == len(set(raw))
        assert [len(data.splits[s]) for s in ("train", "valid", "test")] == [a, b - a, 4099 - b]
        np.testing.assert_array_equal(np.concatenate(list(data.splits.values())), ids)
        np.testing.assert_array_equal(data.splits["valid"], ids[a:b])
    # prepared from a local copy, a run with no source finds it in the cache
    again = Enwik8.load(Enwik8Config(cache_dir=str(tmp_path / "zip")))
    np.testing.assert_array_equal(again.splits["test"], ids[b:])


def test_enwik8_refuses_a_file_of_another_size(tmp_path, monkeypatch):
    (tmp_path / "hostname").write_bytes(b"myhost\n")
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", b"x" * 1000)
    for source, what in (("hostname", "hostname has 7 bytes"),
                         ("enwik8.zip", "enwik8.zip:enwik8 has 1,000 bytes")):
        with pytest.raises(DataError) as e:
            Enwik8.load(Enwik8Config(source=str(tmp_path / source), cache_dir=str(tmp_path)))
        msg = str(e.value)
        assert "\n" not in msg and what in msg and "not the 100,000,000 of enwik8" in msg
        assert "http://mattmahoney.net/dc/enwik8.zip" in msg
        assert "`python scripts/prepare_data.py enwik8 --source /path/to/enwik8.zip`" in msg
    assert {p.suffix for p in (tmp_path / "enwik8").iterdir()} == {".lock"}  # nothing cached
    # a cache prepared from a small file (before the check existed) is refused too
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 1000)
    Enwik8.load(Enwik8Config(source=str(tmp_path / "enwik8.zip"), cache_dir=str(tmp_path)))
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 100_000_000)
    with pytest.raises(DataError, match=r"the cache .* has 1,000 bytes"):
        Enwik8.load(Enwik8Config(cache_dir=str(tmp_path)))


def test_c4_documents_separated_and_train_limited(tmp_path, c4_dir, monkeypatch):
    src, train_docs, valid_docs = c4_dir
    kw = dict(source=str(src), cache_dir=str(tmp_path / "cache"), vocab_size=80,
              spm_train_docs=50, valid_docs=5, num_proc=1)
    data = C4.load(C4Config(train_tokens=1500, **kw))
    entry = C4.entry(C4Config(train_tokens=1500, **kw))
    sp = decoder(entry.path)
    eos = sp.eos_id()

    def docs_of(ids):
        assert ids[-1] == eos
        # lists: sentencepiece < 0.2.2 cannot decode an array ("truth value ... ambiguous")
        return [sp.decode(p.tolist()) for p in np.split(ids, np.flatnonzero(ids == eos) + 1)[:-1]]

    flat = lambda docs: [" ".join(d.split()) for d in docs]  # newlines -> word boundaries
    assert docs_of(data.splits["valid"]) == flat(valid_docs[:5])
    assert docs_of(data.splits["test"]) == flat(valid_docs[5:10])
    train = data.splits["train"]
    assert len(train) == 1500 and data.vocab_size == 80
    n_docs = int((train == eos).sum())
    assert docs_of(train[: np.flatnonzero(train == eos)[-1] + 1]) == flat(train_docs[:n_docs])
    # fewer tokens: a prefix of the same cache, nothing re-tokenized
    monkeypatch.setattr(subword, "encode_texts", lambda *a, **k: 1 / 0)
    small = C4.load(C4Config(train_tokens=700, **kw))
    np.testing.assert_array_equal(small.splits["train"], train[:700])
    # more tokens: rebuilt with the same BPE model, the old run's tokens are its prefix
    monkeypatch.undo()
    monkeypatch.setattr(subword, "train_spm", lambda *a, **k: 1 / 0)
    big = C4.load(C4Config(train_tokens=3000, **kw))
    np.testing.assert_array_equal(big.splits["train"][:1500], train)
    assert len(big.splits["train"]) == 3000
    # a run reading a prefix records that prefix's sha256: the same as from an entry of
    # exactly those tokens, so the tables see one data version
    again = C4.load(C4Config(train_tokens=1500, **kw))
    assert again.origin["train_tokens_stored"] == 3000 and "train_tokens_stored" not in \
        data.origin
    assert again.origin["sha256"] == data.origin["sha256"]
    assert small.origin["sha256"]["train"] == hashlib.sha256(train[:700].tobytes()).hexdigest()
    # more than the shards hold: an explicit request fails, the default takes all there is
    with pytest.raises(DataError, match="train_tokens=10000000"):
        C4.load(C4Config(train_tokens=10_000_000, **kw))
    everything = C4.load(C4Config(**kw)).splits["train"]
    assert (everything == eos).sum() == len(train_docs)


def test_extending_an_entry_with_a_damaged_tokenizer_trains_it_again(tmp_path, c4_dir,
                                                                      monkeypatch, caplog):
    """Raising C4's train_tokens rebuilds the entry with its SentencePiece model; a damaged
    one is trained again (the same model: same texts, same seed), not encoded with."""
    kw = dict(source=str(c4_dir[0]), cache_dir=str(tmp_path / "cache"), vocab_size=80,
              spm_train_docs=50, valid_docs=5, num_proc=1)
    first = C4.load(C4Config(train_tokens=700, **kw))
    (C4.entry(C4Config(train_tokens=700, **kw)).path / "spm.model").write_bytes(b"damaged")
    trained, train_spm = [], subword.train_spm
    monkeypatch.setattr(subword, "train_spm", lambda *a, **k: trained.append(train_spm(*a, **k)))
    more = C4.load(C4Config(train_tokens=1500, **kw))
    assert len(trained) == 1 and "spm.model is damaged" in caplog.text
    assert more.origin["sha256"]["spm.model"] == first.origin["sha256"]["spm.model"]
    np.testing.assert_array_equal(more.splits["train"][:700], first.splits["train"])


def test_c4_default_copy_that_grew_is_read_again(tmp_path):
    """A cache built from a partial raw copy ran dry ("exhausted"); once the missing shards
    are added, a run with no source re-reads the copy instead of reusing the short cache."""
    raw = tmp_path / "cache" / "raw" / "c4"
    write_shards(raw, "en/c4-validation.{:05d}-of-00008.json.gz", 1, 30, 4)
    write_shards(raw, "en/c4-train.{:05d}-of-01024.json.gz", 1, 40, 3)
    kw = dict(cache_dir=str(tmp_path / "cache"), vocab_size=80, spm_train_docs=30,
              valid_docs=5, num_proc=1)
    with pytest.raises(DataError, match="holds only"):
        C4.load(C4Config(train_tokens=10_000_000, **kw))
    short = len(C4.load(C4Config(**kw)).splits["train"])  # offline: what there is
    write_shards(raw, "en/c4-train.{:05d}-of-01024.json.gz", 2, 40, 3)  # the missing shard
    assert len(C4.load(C4Config(**kw)).splits["train"]) > short


def test_c4_parallel_encoding_matches_serial(tmp_path, c4_dir):
    src = c4_dir[0]
    kw = dict(source=str(src), vocab_size=100, spm_train_docs=50, valid_docs=3,
              train_tokens=4000)
    one = C4.load(C4Config(cache_dir=str(tmp_path / "a"), num_proc=1, **kw))
    two = C4.load(C4Config(cache_dir=str(tmp_path / "b"), num_proc=2, **kw))
    for s in ("train", "valid", "test"):
        np.testing.assert_array_equal(one.splits[s], two.splits[s])


def test_pes2o_layout_and_offline_message(tmp_path, monkeypatch):
    write_shards(tmp_path / "p", "data/v2/train-{:05d}-of-00020.json.gz", 1, 80, 5)
    valid = write_shards(tmp_path / "p", "data/v2/valid-{:05d}-of-00002.json.gz", 1, 10, 6)
    cfg = Pes2oConfig(source=str(tmp_path / "p"), cache_dir=str(tmp_path / "c"),
                      vocab_size=100, valid_docs=4, train_tokens=800, num_proc=1)
    data = Pes2o.load(cfg)
    sp = decoder(Pes2o.entry(cfg).path)
    assert sp.decode(data.splits["valid"].tolist()) == " ".join(" ".join(d.split())
                                                                 for d in valid[:4])
    # no source, nothing prepared, no network: one line that says how to prepare it
    fake = type(sys)("datasets")

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'allenai/peS2o' on the Hub\n(offline)")

    fake.load_dataset = offline
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(hf_stream, "hub_problem", lambda endpoint: None)  # the hub answers
    with pytest.raises(DataError) as e:
        Pes2o.load(Pes2oConfig(cache_dir=str(tmp_path / "empty")))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("pes2o: could not stream allenai/peS2o")
    assert "python scripts/prepare_data.py pes2o --source" in msg
    assert not list((tmp_path / "empty" / "pes2o").glob("*/manifest.json"))
    # WikiText-103 fails inside BPE training (its lines are read lazily): the same one line,
    # naming the v1 release as the local copy (the hub repo's parquet files are not one)
    with pytest.raises(DataError) as e:
        Wt103.load(Wt103Config(cache_dir=str(tmp_path / "empty")))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("wt103: could not stream Salesforce/wikitext")
    assert "prepare_data.py wt103 --source /path/to/wikitext-103" in msg


def test_unreachable_hub_fails_at_once(tmp_path, monkeypatch):
    """No network: one request decides, `datasets` is not asked (it retries for ~25 s)."""
    def no_network(request, timeout):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    fake = type(sys)("datasets")
    fake.load_dataset = lambda *a, **k: pytest.fail("load_dataset called with no hub")
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    hf_stream.hub_problem.cache_clear()
    try:
        with pytest.raises(DataError) as e:
            C4.load(C4Config(cache_dir=str(tmp_path)))
    finally:
        hf_stream.hub_problem.cache_clear()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("c4: could not stream allenai/c4")
    assert "https://huggingface.co is unreachable" in msg and "Name or service" in msg
    assert "python scripts/prepare_data.py c4 --source" in msg
    # an HTTP error status is an answer: the hub is reachable
    def forbidden(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", forbidden)
    try:
        assert hf_stream.hub_problem("https://example.invalid") is None
    finally:
        hf_stream.hub_problem.cache_clear()


def test_wikitext_mini_size_and_vocab(tmp_path):
    data = WikitextMini.load(WikitextMiniConfig(cache_dir=str(tmp_path)))
    n = {s: len(a) for s, a in data.splits.items()}
    assert data.metric == "ppl" and data.vocab_size == 2048
    assert 700_000 < n["train"] < 1_100_000 and min(n["valid"], n["test"]) > 30_000
    total = sum(n.values())
    assert 0.03 < n["valid"] / total < 0.07 and 0.03 < n["test"] / total < 0.07
    counts = np.bincount(data.splits["train"], minlength=data.vocab_size)
    assert counts.max() < total and np.median(counts) > 50  # pieces are well represented
    sp = decoder(WikitextMini.entry(WikitextMiniConfig(cache_dir=str(tmp_path))).path)
    text = sp.decode(data.splits["valid"][:3000].tolist())
    assert text.startswith("= ") and "[[" not in text and "{{" not in text and "'''" not in text


@pytest.mark.parametrize("name,cfg", [
    ("c4", C4Config(train_tokens=5000, text_field="the text", cache_dir="/tmp/a cache")),
    ("wt103", Wt103Config(vocab_size=1000, split_digits=False)),
    ("pes2o", Pes2oConfig(valid_docs=7, train_files="a/*.gz")), ("enwik8", Enwik8Config())])
def test_the_suggested_prepare_command_builds_what_the_run_looks_for(name, cfg):
    """It named only the dataset: a run with dataset.vocab_size=1000 was told a command that
    built vocab 8000, and a cache_dir with a space broke the shell line."""
    import shlex

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import prepare_data
    finally:
        sys.path.pop(0)
    words = shlex.split(subword_cache.prepare_command(name, "/data/my copy", cfg))
    assert words[:3] == ["python", "scripts/prepare_data.py", name]
    _, _, parsed, _ = prepare_data.parse(words[2:])
    assert parsed == dataclasses.replace(cfg, source="/data/my copy")
    # key=value after an option is an override too (argparse refused it)
    _, _, parsed, _ = prepare_data.parse(["c4", "--source", "/x", "valid_docs=3"])
    assert (parsed.source, parsed.valid_docs) == ("/x", 3)


@pytest.mark.parametrize("kind", ["enwik_mini", "wikitext_mini"])
@pytest.mark.parametrize("fractions", [[0.9, 0.1], [0.5, 0.6, -0.1], [0.9, 0.1, 0.0]])
def test_embedded_corpus_fractions_are_checked(kind, fractions):
    """enwik_mini took any fractions and failed at the first evaluation of an empty split."""
    from sigma_moe.framework.config import ConfigError

    with pytest.raises(ConfigError, match=r"^dataset.fractions=.*give 3 positive numbers"):
        from_dict(DATASETS.get(kind).Config, {"fractions": fractions}, "dataset")


def test_a_damaged_source_file_is_one_line_naming_it(tmp_path, c4_dir):
    """A byte that is not UTF-8, a truncated .gz, a line that is not JSON, a missing text
    field: tracebacks (through run.py) or lines without the file name before."""
    src = tmp_path / "wt"
    src.mkdir()
    for split, f in FILES.items():
        (src / f).write_bytes(b"= a =\n good line\n" + (b"caf\xe9\n" if split == "valid" else b""))
    with pytest.raises(DataError, match=rf"^{src / FILES['valid']}: UnicodeDecodeError: .*"
                                        r"is the file complete"):
        Wt103.load(Wt103Config(source=str(src), cache_dir=str(tmp_path / "c1")))

    shard = sorted(c4_dir[0].rglob("*train*.json.gz"))[0]
    good = shard.read_bytes()
    cases = {"EOFError": good[: len(good) // 2],  # truncated
             # the line in the file, not json's "line 1" of that line alone
             r"line 2 is not JSON \(Expecting property name enclosed in double quotes, "
             r"column 2\)": gzip.compress(b'{"text": "ok"}\n{not json\n'),
             "line 2 has no field 'text'": gzip.compress(b'{"text": "ok"}\n{"body": "x"}\n'),
             "line 3: its 'text' is NoneType, not text": gzip.compress(
                 b'{"text": "ok"}\n\n{"text": null}\n'),
             r"line 1 has no field 'text' \(it has list\)": gzip.compress(b'[1, 2]\n')}
    for i, (said, data) in enumerate(cases.items()):
        shard.write_bytes(data)
        with pytest.raises(DataError, match=rf"^{shard}: .*{said}"):
            C4.load(C4Config(source=str(c4_dir[0]), cache_dir=str(tmp_path / f"c{i + 2}"),
                             train_tokens=1500, valid_docs=5, spm_train_docs=50, vocab_size=80,
                             num_proc=1))


def test_a_damaged_enwik8_zip_is_one_line_naming_it(tmp_path, monkeypatch):
    """A bad CRC (bytes of the member overwritten) was zipfile's traceback."""
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 4099)
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:  # stored: the bytes as they are
        z.writestr("enwik8", bytes(range(256)) * 16 + b"abc")
    raw = bytearray((tmp_path / "enwik8.zip").read_bytes())
    raw[100:108] = bytes(b ^ 0xFF for b in raw[100:108])  # the member's bytes, inverted
    (tmp_path / "enwik8.zip").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=rf"^{tmp_path / 'enwik8.zip'}: BadZipFile: Bad CRC-32"):
        Enwik8.load(Enwik8Config(source=str(tmp_path / "enwik8.zip"), cache_dir=str(tmp_path)))


def test_an_empty_or_short_split_is_refused_not_cached(tmp_path, c4_dir):
    """An empty test file gave a 'prepared' entry with 0 test tokens (exit 0), which a run
    with no source then picked over a good entry; validation shards with fewer documents
    than valid and test take gave short (or empty) splits, silently."""
    src = tmp_path / "wt"
    src.mkdir()
    for split, f in FILES.items():
        (src / f).write_text("" if split == "test" else "= a =\n a good line of text .\n" * 40)
    with pytest.raises(DataError, match=r"^wt103: no text for the test split\(s\) in the "
                                        r"source \(an empty file\?\)$"):
        Wt103.load(Wt103Config(source=str(src), cache_dir=str(tmp_path / "c1"), vocab_size=40,
                               num_proc=1))
    assert not list((tmp_path / "c1").rglob("manifest.json"))
    (src / FILES["train"]).write_text("\n \n")  # and no text to train the tokenizer on
    with pytest.raises(DataError, match=r"^wt103: no text to train the SentencePiece model on "
                                        r"in the source's train split"):
        Wt103.load(Wt103Config(source=str(src), cache_dir=str(tmp_path / "c2"), num_proc=1))
    (tmp_path / "wt.zip").write_bytes(b"PK\x03\x04 cut short")  # a download cut short
    with pytest.raises(DataError, match=r"wt.zip: not a complete zip archive"):
        Wt103.load(Wt103Config(source=str(tmp_path / "wt.zip"), cache_dir=str(tmp_path / "c3")))
    kw = dict(source=str(c4_dir[0]), train_tokens=1500, spm_train_docs=50, vocab_size=80,
              num_proc=1)
    n_valid = len(c4_dir[2])
    for valid_docs, held in ((n_valid - 3, n_valid), (n_valid + 1, f"at most {n_valid + 1}")):
        with pytest.raises(DataError, match=rf"^c4: the validation shards \(.*\) hold {held} "
                                            rf"documents, fewer than the 2 x dataset.valid_docs"
                                            rf"={valid_docs} that valid and test take"):
            C4.load(C4Config(cache_dir=str(tmp_path / f"c{valid_docs}"), valid_docs=valid_docs,
                             **kw))
        assert not list((tmp_path / f"c{valid_docs}").rglob("manifest.json"))  # none made


def test_the_start_line_names_where_the_tokens_came_from():
    """A cache entry, else the file a dataset of one's own records as its `source`; an
    embedded corpus (its source a dict: file and gensim version) is `embedded`."""
    from sigma_moe.tasks.lm_run import data_line

    rec = {"name": "x", "tokens": {"train": 1000, "valid": 10}, "train_epochs": 2.0}
    assert data_line(rec) == "data x: train/valid 1,000/10 tokens, 2 epochs of train | embedded"
    assert data_line({**rec, "source": {"file": "a.bz2"}}).endswith("| embedded")
    assert data_line({**rec, "source": "/data/tiny.txt"}).endswith("| /data/tiny.txt")
    assert data_line({**rec, "source": "/data/x", "cache_entry": "/c/e"}).endswith("| /c/e")


