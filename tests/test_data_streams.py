"""From mutation testing: WikiText-103's release files and hub split, the SentencePiece
pipeline (settings, vocabulary, order of parallel chunks, limits) and the C4 stream
(blank lines, cache key, BPE sample, offline reuse)."""

from __future__ import annotations

import random
import sys
import zipfile

import numpy as np
import pytest

from sigma_moe.framework.data import hf_stream, subword
from sigma_moe.framework.data.hf_stream import C4, C4Config, Pes2oConfig
from sigma_moe.framework.data.wt103 import FILES, Wt103, Wt103Config
from tests.data_helpers import decoder, sentence


def test_wt103_reads_each_split_from_its_release_file(tmp_path):
    """Mutant: FILES maps valid to wiki.test.tokens and test to wiki.valid.tokens (the
    fixtures named their files through FILES, so they agreed with it)."""
    rng = random.Random(3)
    text = {name: [sentence(rng, 10) for _ in range(200 if "train" in name else 5)]
            for name in ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")}
    for name, lines in text.items():
        (tmp_path / name).write_text("".join(f" {line} \n \n" for line in lines))
    cfg = Wt103Config(source=str(tmp_path), cache_dir=str(tmp_path / "c"), vocab_size=60,
                      num_proc=1)
    data = Wt103.load(cfg)
    sp = decoder(Wt103.entry(cfg).path)
    for split in ("train", "valid", "test"):
        assert sp.decode(data.splits[split].tolist()) == " ".join(text[f"wiki.{split}.tokens"])


def test_wt103_size_warning_reads_the_train_file(tmp_path, monkeypatch, caplog):
    """Mutant: the directory's size check read wiki.valid.tokens (every real WikiText-103
    copy, whose valid file has 1 MB, was called WikiText-2)."""
    from sigma_moe.framework.data import wt103

    for name, n in FILES.items():
        (tmp_path / n).write_text("word " * (2000 if name == "train" else 20))
    monkeypatch.setattr(wt103, "MIN_TRAIN_BYTES", 5000)  # between the valid and train sizes
    with zipfile.ZipFile(tmp_path / "w.zip", "w") as z:
        for n in FILES.values():
            z.write(tmp_path / n, f"wikitext-103/{n}")
    assert wt103.locate(tmp_path) and wt103.locate(tmp_path / "w.zip")
    assert "WikiText-103" not in caplog.text
    monkeypatch.setattr(wt103, "MIN_TRAIN_BYTES", 20000)
    wt103.locate(tmp_path)
    assert "wiki.train.tokens has 0.0 MB" in caplog.text


def fake_datasets(monkeypatch, rows: list[dict]) -> list:
    """`datasets` that streams `rows` and records each load_dataset call."""
    calls = []
    fake = type(sys)("datasets")
    fake.load_dataset = lambda *a, **k: calls.append((a, k)) or iter(rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    return calls


def test_wt103_streams_the_hubs_validation_split(monkeypatch):
    """Mutant: `valid` asked of the hub as "valid" (Salesforce/wikitext calls it
    "validation")."""
    from sigma_moe.framework.data import wt103

    calls = fake_datasets(monkeypatch, [{"text": " a line \n"}])
    monkeypatch.setattr(hf_stream, "hub_problem", lambda endpoint: None)
    assert list(wt103.online("cmd").handle("valid")) == [" a line \n"]
    assert calls == [(("Salesforce/wikitext", "wikitext-103-v1"),
                      {"split": "validation", "streaming": True})]


def test_an_offline_hub_setting_asks_datasets_not_the_network(monkeypatch):
    """Mutant: HF_HUB_OFFLINE not consulted: with HF_HUB_OFFLINE=1 (datasets reads its own
    cache) the hub's reachability was checked, and failed."""
    calls = fake_datasets(monkeypatch, [{"text": "doc"}])
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_stream, "hub_problem", lambda endpoint: "unreachable")
    assert list(hf_stream.hf_texts("c4", "allenai/c4", "cmd", data_files="en/*.gz")) == ["doc"]
    assert len(calls) == 1


def test_spm_settings_reach_sentencepiece(tmp_path, monkeypatch):
    """Mutants: wt103's spm_train_lines not passed on (SpmSettings.train_texts stayed 0), and
    train_spm passing input_sentence_size=0 whatever train_texts said (both: the BPE read
    every line of WikiText-103 instead of the sample asked for)."""
    import sentencepiece

    rng = random.Random(4)
    for split in FILES.values():
        (tmp_path / split).write_text("\n".join(sentence(rng, 8) for _ in range(300)))
    seen, train = [], sentencepiece.SentencePieceTrainer.train
    monkeypatch.setattr(sentencepiece.SentencePieceTrainer, "train",
                        lambda **k: seen.append(k["input_sentence_size"]) or train(**k))
    Wt103.load(Wt103Config(source=str(tmp_path), cache_dir=str(tmp_path / "c"), vocab_size=40,
                           spm_train_lines=150, num_proc=1))
    assert seen == [150]


def test_a_bpe_sample_sentencepiece_refuses_is_a_config_error():
    """SentencePiece takes input_sentence_size 0 or > 100: spm_train_lines=50 failed with its
    INTERNAL error after reading the whole train file (minutes on WikiText-103)."""
    from sigma_moe.framework.config import ConfigError

    with pytest.raises(ConfigError, match=r"^dataset.spm_train_lines=100: SentencePiece "):
        Wt103Config(spm_train_lines=100)
    assert Wt103Config(spm_train_lines=101).spm().train_texts == 101


@pytest.mark.parametrize("vocab", [15, 65536])
def test_vocab_sizes_that_uint16_cannot_hold_are_refused(vocab):
    """Mutant `<= 65535` -> `<= 65536`: id 65535 + 1 does not fit the uint16 streams."""
    from sigma_moe.framework.config import ConfigError

    with pytest.raises(ConfigError, match=r"use 16\.\.65535"):
        Wt103Config(vocab_size=vocab)
    Wt103Config(vocab_size=65535)


def test_parallel_encoding_keeps_the_order_of_many_chunks(tmp_path, monkeypatch):
    """Mutant: with more chunks than the 2 x num_proc in flight, the newest was taken
    (`pending.pop()`): chunks came out of order. The dataset fixtures had 2 chunks."""
    rng = random.Random(5)
    texts = [sentence(rng, 6) for _ in range(40)]
    subword.train_spm(texts, subword.SpmSettings(vocab_size=40), tmp_path / "m.model")
    model = (tmp_path / "m.model").read_bytes()
    monkeypatch.setattr(subword, "CHUNK_TEXTS", 3)  # 14 chunks
    serial = np.concatenate(list(subword.encode_texts(texts, model, eos=True, num_proc=1)))
    parallel = np.concatenate(list(subword.encode_texts(texts, model, eos=True, num_proc=2)))
    np.testing.assert_array_equal(parallel, serial)


def test_a_limited_split_stops_reading_its_source(tmp_path):
    """Mutant: write_split without its `break` at the limit (C4's train stream was read to
    its end, hours of downloading, for tokens that are then cut off)."""
    rng = random.Random(6)
    texts = [sentence(rng, 6) for _ in range(40)]
    subword.train_spm(texts, subword.SpmSettings(vocab_size=40), tmp_path / "m.model")
    read = []

    def source():
        for i in range(5 * subword.CHUNK_TEXTS):
            read.append(i)
            yield texts[i % len(texts)]

    out = subword.write_split(tmp_path, "train", source(), (tmp_path / "m.model").read_bytes(),
                              eos=True, num_proc=1, limit=100)
    assert out["length"] == 100 and len(read) <= 2 * subword.CHUNK_TEXTS


def test_word_starts_count_the_words_of_wt103_and_c4_text(tmp_path, c4_dir):
    """The denominator of word-level perplexity: the tokens that start a word are as many as
    the whitespace-separated words of the text (WikiText-103: its lines, no end-of-line
    token), plus one per document where an EOS token ends it (C4)."""
    rng = random.Random(4)
    text = {s: [sentence(rng, 7) for _ in range(150 if s == "train" else 6)] for s in FILES}
    text["valid"][0] += " 1984 <unk> @-@ x"  # digits split one per piece, release markup
    for split, lines in text.items():
        (tmp_path / FILES[split]).write_text("".join(f" {line} \n \n" for line in lines))
    data = Wt103.load(Wt103Config(source=str(tmp_path), cache_dir=str(tmp_path / "c"),
                                  vocab_size=60, num_proc=1))
    for split in FILES:
        words = sum(len(line.split()) for line in text[split])
        assert data.word_start[data.splits[split]].sum() == words, split

    root, _, valid_docs = c4_dir
    data = C4.load(C4Config(source=str(root), cache_dir=str(tmp_path / "c4c"), vocab_size=80,
                            spm_train_docs=50, train_tokens=300, valid_docs=5, num_proc=1))
    for split, docs in (("valid", valid_docs[:5]), ("test", valid_docs[5:10])):
        words = sum(len(doc.split()) + 1 for doc in docs)
        assert data.word_start[data.splits[split]].sum() == words, split


def test_the_recorded_vocabulary_is_the_models(tmp_path):
    """Mutant: vocab_size recorded as configured; on a corpus too small for it SentencePiece
    makes fewer pieces (hard_vocab_limit=False), and the model's embedding was sized wrong."""
    rng = random.Random(8)
    for split in FILES.values():
        (tmp_path / split).write_text("\n".join(sentence(rng, 5) for _ in range(20)))
    cfg = Wt103Config(source=str(tmp_path), cache_dir=str(tmp_path / "c"), vocab_size=5000,
                      num_proc=1)
    data = Wt103.load(cfg)
    assert data.vocab_size == decoder(Wt103.entry(cfg).path).get_piece_size() < 5000


def test_default_c4_train_tokens_are_the_largest_paper_run():
    """Mutant: the default sized for context 256 (the big runs' context is 512)."""
    assert hf_stream.DEFAULT_TRAIN_TOKENS == 64 * (100_000 * 512 + 1)
    assert C4Config().needed_tokens == Pes2oConfig().needed_tokens == 3_276_800_064


def test_c4_blank_lines_in_a_shard_are_skipped(tmp_path):
    """Mutant: every line parsed as JSON (a shard with a blank line failed)."""
    path = tmp_path / "s.json"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n   \n')
    assert list(hf_stream.local_texts([path], "text")) == ["a", "b"]


def test_c4_bpe_reads_the_first_spm_train_docs(tmp_path, c4_dir, monkeypatch):
    """Mutant: the BPE trained on the whole train stream, not its first spm_train_docs
    documents (from the hub: every shard of C4)."""
    src, train_docs, _ = c4_dir
    seen, train_spm = [], subword.train_spm

    def recording(texts, *a, **k):
        seen.extend(texts)
        return train_spm(seen, *a, **k)

    monkeypatch.setattr(subword, "train_spm", recording)
    C4.load(C4Config(source=str(src), cache_dir=str(tmp_path / "c"), vocab_size=80,
                     spm_train_docs=7, valid_docs=5, train_tokens=500, num_proc=1))
    assert seen == [line for doc in train_docs[:7] for line in doc.split("\n")]


def test_c4_valid_docs_are_part_of_the_cache_key(tmp_path, c4_dir):
    """Mutant: valid_docs left out of the settings: a run with another valid_docs was served
    the other's valid and test splits."""
    kw = dict(source=str(c4_dir[0]), cache_dir=str(tmp_path / "c"), vocab_size=80,
              spm_train_docs=50, train_tokens=500, num_proc=1)
    for n in (5, 3):
        data = C4.load(C4Config(valid_docs=n, **kw))
        eos = decoder(C4.entry(C4Config(valid_docs=n, **kw)).path).eos_id()
        assert [int((data.splits[s] == eos).sum()) for s in ("valid", "test")] == [n, n]


def test_a_c4_cache_whose_source_ran_dry_serves_runs_offline(tmp_path, c4_dir, monkeypatch):
    """Mutant: `enough` = full only: a cache prepared from a local copy with fewer tokens than
    the default asks for was not used by a run with no source, which then streamed from the
    hub (offline: failed)."""
    kw = dict(cache_dir=str(tmp_path / "c"), vocab_size=80, spm_train_docs=50, valid_docs=5,
              num_proc=1)
    prepared = C4.load(C4Config(source=str(c4_dir[0]), **kw))  # all there is, < the default
    monkeypatch.setattr(hf_stream, "hf_texts", lambda *a, **k: pytest.fail("streamed"))
    np.testing.assert_array_equal(C4.load(C4Config(**kw)).splits["train"],
                                  prepared.splits["train"])
