"""From mutation testing: byte ids, enwik8's zip, the embedded corpora (enwik_mini's
per-split sha256s, wikitext_mini's article text, namespaces, splits and pipeline)."""

from __future__ import annotations

import hashlib
import random
import zipfile

import numpy as np

from sigma_moe.framework.config import from_dict
from sigma_moe.framework.data import enwik8
from sigma_moe.framework.data.base import bytes_to_ids
from sigma_moe.framework.data.enwik8 import Enwik8, Enwik8Config
from sigma_moe.framework.data.wikitext_mini import WikitextMini, WikitextMiniConfig
from tests.data_helpers import decoder, sentence


def test_byte_ids_are_dense_from_zero():
    """Mutant `np.arange(len(present))` -> `np.arange(1, len(present) + 1)`: the largest id
    was the vocabulary size, one past the embedding table."""
    ids, vocab = bytes_to_ids(b"baca\xff")
    assert ids.tolist() == [1, 0, 2, 0, 3] and vocab == 4


def test_enwik8_zip_is_checked_unpacked_and_by_member_name(tmp_path, monkeypatch):
    """Mutants: the size check reads the member's compressed size (the real enwik8.zip is
    deflated: every download was refused), and the member taken is the first one rather than
    the one named enwik8; the manifest's metric said "ppl" (prepare_data.py printed it)."""
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 5000)
    raw = b"<page>enwik8 text</page>\n" * 200  # 5000 bytes that deflate well
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("readme.txt", "not the data")
        z.writestr("enwik8", raw)
    cfg = Enwik8Config(source=str(tmp_path / "enwik8.zip"), cache_dir=str(tmp_path / "c"))
    data = Enwik8.load(cfg)
    ids, vocab = bytes_to_ids(raw)
    np.testing.assert_array_equal(np.concatenate(list(data.splits.values())), ids)
    assert data.vocab_size == vocab and Enwik8.entry(cfg).manifest["metric"] == "bpc"


def test_enwik_mini_records_each_splits_own_sha256():
    """Mutant: every split's sha256 taken over the whole corpus (valid and test then had the
    same data version as train)."""
    from sigma_moe.framework.data.enwik_mini import EnwikMini, EnwikMiniConfig

    data = EnwikMini.load(EnwikMiniConfig())
    assert data.origin["sha256"] == {s: hashlib.sha256(a.tobytes()).hexdigest()
                                     for s, a in data.splits.items()}


def test_wikitext_mini_article_text():
    """Mutants: headings written with one `=` too few; a section after a dropped one
    (References) dropped as well (`level >= skip_below`)."""
    from sigma_moe.framework.data.wikitext_mini import clean_article

    text = ("'''T''' is a [[river|stream]].\n\n== History ==\nText one.\n=== Early ===\n* More.\n"
            "== References ==\n* ref one\n=== Sub ===\nin references\n== Legacy ==\nKept.\n")
    assert clean_article("T", text) == ["= T =", "T is a stream.", "= = History = =",
                                        "Text one.", "= = = Early = = =", "More.",
                                        "= = Legacy = =", "Kept."]


WIKI_NS = "http://www.mediawiki.org/xml/export-0.10/"


def wiki_xml(pages: list[tuple[str, str, str, bool]]) -> bytes:
    """A MediaWiki export of (title, namespace, text, is_redirect) pages."""
    from xml.sax.saxutils import escape

    body = "".join(
        f"<page><title>{escape(t)}</title><ns>{ns}</ns>" + ("<redirect title='x'/>" if r else "")
        + f"<revision><text>{escape(text)}</text></revision></page>"
        for t, ns, text, r in pages)
    return f'<mediawiki xmlns="{WIKI_NS}">{body}</mediawiki>'.encode()


def test_wikitext_mini_keeps_main_namespace_articles_only():
    """Mutant: the `ns == 0` check dropped (talk and user pages became articles)."""
    from sigma_moe.framework.data.wikitext_mini import extract_articles

    xml = wiki_xml([("Alpha", "0", "Alpha text.", False), ("Talk:Alpha", "1", "Chat.", False),
                    ("Beta", "0", "", True), ("Gamma (disambiguation)", "0", "G may be", False),
                    ("Delta", "0", "Delta text.", False)])
    assert extract_articles(xml) == [["= Alpha =", "Alpha text."], ["= Delta =", "Delta text."]]


def test_wikitext_mini_split_gives_every_split_an_article():
    """Mutant `len(articles) - 2` -> `len(articles) - 1`: with a large train share, valid was
    left empty."""
    from sigma_moe.framework.data.wikitext_mini import split_articles

    arts = [[f"article {i}"] for i in range(3)]
    parts = split_articles(arts, (0.98, 0.01, 0.01))
    assert parts == {"train": arts[:1], "valid": arts[1:2], "test": arts[2:]}


def test_wikitext_mini_pipeline_on_a_small_dump(tmp_path, monkeypatch):
    """Mutants: lines separated by </s> (eos=True; WikiText lines get no separator), the
    BPE trained on valid instead of train, EXTRACT_VERSION out of the cache key (a changed
    extraction reused the old cache), num_proc=0 ("all cores") refused."""
    from sigma_moe.framework.data import wikitext_mini as wm

    rng = random.Random(7)
    pages = [(f"Page {i}", "0", "\n".join(sentence(rng, 12) + "." for _ in range(20)), False)
             for i in range(10)]
    monkeypatch.setattr(wm, "embedded_wiki_xml", lambda: wiki_xml(pages))
    spm_texts, build = [], wm.build_subword

    def recording(out, splits, texts, *a, **k):
        spm_texts.append(list(texts()))
        return build(out, splits, texts, *a, **k)

    monkeypatch.setattr(wm, "build_subword", recording)
    cfg = from_dict(WikitextMiniConfig, {"cache_dir": str(tmp_path), "vocab_size": 60,
                                        "num_proc": 0}, "dataset")
    data = WikitextMini.load(cfg)
    parts = wm.split_articles(wm.extract_articles(wiki_xml(pages)), cfg.fractions)
    lines = {s: [line for a in parts[s] for line in a] for s in parts}
    assert spm_texts == [lines["train"]]
    sp = decoder(WikitextMini.entry(cfg).path)
    for split, ids in data.splits.items():
        assert ids.tolist() == [i for line in lines[split] for i in sp.encode(line)]
    before = WikitextMini.entry(cfg).path
    monkeypatch.setattr(wm, "EXTRACT_VERSION", wm.EXTRACT_VERSION + 1)
    assert WikitextMini.entry(cfg).path != before and len(spm_texts) == 2  # prepared again


def test_the_embedded_file_is_found_without_importing_gensim(monkeypatch):
    """gensim's __init__ imports scipy and more (a second per run start): the file is found
    through the package's location; where gensim is missing, one line says what to install."""
    import subprocess
    import sys

    import pytest

    from sigma_moe.framework.data import enwik_mini
    from sigma_moe.framework.data.base import DataError

    code = ("import sys; from sigma_moe.framework.data.enwik_mini import embedded_wiki_xml; "
            "assert embedded_wiki_xml().startswith(b'<mediawiki'); "
            "assert 'gensim' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setattr(enwik_mini.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="embedded corpus not found .*`pip install gensim`"):
        enwik_mini.embedded_wiki_xml()
