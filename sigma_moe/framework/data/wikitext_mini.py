"""`wikitext_mini`: a WikiText-style subword corpus that runs anywhere (docs/DESIGN.md, "Embedded
data"), the stand-in for WikiText-103 (paper: the WikiText-103 rows; docs/REFERENCE.md "Metrics":
perplexity per SentencePiece token, here with a smaller vocabulary).

The articles of the Wikipedia XML that the `gensim` wheel ships (the bytes `enwik_mini`
uses) are reduced to plain text roughly the way WikiText was made: gensim's `filter_wiki`
drops templates, refs, tables, files and link targets; bold/italic quotes go; headings are
written as WikiText writes them (`= = History = =`); reference-like sections (References,
See also, ...), galleries, redirects and disambiguation pages are dropped. Articles are kept
in dump order and split contiguously into 90/5/5 by characters, at article boundaries.
Then the wt103 pipeline: BPE trained on train, each line encoded separately, no separator.

Vocabulary 2048 by default: the corpus is ~3 MB of text (101 articles; 878k / 47k / 55k
tokens); at 2048 pieces the median piece occurs ~150 times in train (4096: ~60, with 320
pieces under 20), so the small CPU models see every embedding often enough to learn it.
Preparation takes ~6 s on 2 CPU cores (text extraction ~5 s, encoding ~0.9M tokens/s).
"""
from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.data import DATASETS
from sigma_moe.framework.data.base import TokenData, check_fractions
from sigma_moe.framework.data.cache import Entry, prepare, resolve_cache_dir
from sigma_moe.framework.data.enwik_mini import embedded_source, embedded_wiki_xml
from sigma_moe.framework.data.subword import (
    SpmSettings,
    build_subword,
    check_vocab_size,
    resolve_num_proc,
    subword_data,
)

EXTRACT_VERSION = 1  # bump when the text extraction changes: the cache key follows
SPLITS = ("train", "valid", "test")
DROP_SECTIONS = {"references", "external links", "see also", "notes", "further reading",
                 "bibliography", "sources", "footnotes", "citations", "notes and references",
                 "gallery"}
HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1$")


@dataclass(frozen=True)
class WikitextMiniConfig:
    cache_dir: str = ""  # "" = $SIGMA_MOE_CACHE or ~/.cache/sigma_moe
    vocab_size: int = 2048  # see the module docstring
    split_digits: bool = True  # as wt103
    fractions: tuple[float, ...] = (0.9, 0.05, 0.05)  # by characters, at article boundaries
    num_proc: int = 1  # the corpus is small: worker start-up would cost more than it saves

    def __post_init__(self) -> None:
        check_vocab_size(self.vocab_size)
        check_fractions(self.fractions)
        if self.num_proc < 0:
            raise ConfigError("dataset.num_proc must be >= 0 (0 = all cores)")


def clean_article(title: str, wikitext: str) -> list[str]:
    """The plain-text lines of one article, title first."""
    from gensim.corpora.wikicorpus import filter_wiki  # slow import: only when preparing

    text = filter_wiki(wikitext).replace("'''", "").replace("''", "")
    out, skip_below = [f"= {title} ="], 0
    for raw in text.split("\n"):
        line = " ".join(raw.split())
        if not line:
            continue
        if m := HEADING.match(line):
            level, name = len(m.group(1)), m.group(2).strip()
            if skip_below and level > skip_below:
                continue  # a subsection of a dropped section
            skip_below = level if name.lower() in DROP_SECTIONS else 0
            if not skip_below and name:
                out.append(" ".join(["="] * level + [name] + ["="] * level))
            continue
        if skip_below or line[0] in "|!{}" or line.startswith(("File:", "Image:")):
            continue  # dropped section, table debris, gallery entry
        line = line.lstrip("*#:; ")
        if line:
            out.append(line)
    return out


def extract_articles(xml: bytes) -> list[list[str]]:
    """Main-namespace, non-redirect, non-disambiguation articles, in dump order."""
    articles = []
    for _, el in ET.iterparse(io.BytesIO(xml)):
        if el.tag.rsplit("}", 1)[-1] != "page":
            continue
        title = el.findtext("{*}title") or ""
        text = el.findtext("{*}revision/{*}text") or ""
        if (el.findtext("{*}ns") == "0" and el.find("{*}redirect") is None
                and not title.endswith("(disambiguation)")):
            articles.append(clean_article(title, text))
        el.clear()
    return articles


def split_articles(articles: list[list[str]], fractions: tuple[float, ...]
                   ) -> dict[str, list[list[str]]]:
    """Contiguous train/valid/test by cumulative characters, cut at article boundaries."""
    ends = np.cumsum([sum(len(line) + 1 for line in a) for a in articles])
    cut = [int(np.searchsorted(ends, f * ends[-1])) for f in np.cumsum(fractions[:2])]
    a = min(max(cut[0], 1), len(articles) - 2)  # every split gets at least one article
    b = min(max(cut[1], a + 1), len(articles) - 1)
    return {"train": articles[:a], "valid": articles[a:b], "test": articles[b:]}


def settings(cfg: WikitextMiniConfig) -> dict:
    spm = SpmSettings(cfg.vocab_size, cfg.split_digits)
    return {"dataset": "wikitext_mini", "spm": asdict(spm), "fractions": list(cfg.fractions),
            "extract": EXTRACT_VERSION}


@DATASETS.register("wikitext_mini")
class WikitextMini:
    Config = WikitextMiniConfig

    @staticmethod
    def entry(cfg: WikitextMiniConfig) -> Entry:
        def build(out: Path, previous: Entry | None) -> dict:
            parts = split_articles(extract_articles(embedded_wiki_xml()), cfg.fractions)
            lines = {s: [line for art in parts[s] for line in art] for s in SPLITS}
            made = build_subword(out, {s: (lambda s=s: lines[s]) for s in SPLITS},
                                 lambda: lines["train"], SpmSettings(cfg.vocab_size,
                                 cfg.split_digits), resolve_num_proc(cfg.num_proc), eos=False,
                                 desc="wikitext_mini")
            made["articles"] = {s: len(parts[s]) for s in SPLITS}
            return made

        return prepare(resolve_cache_dir(cfg.cache_dir) / "wikitext_mini", settings(cfg),
                       embedded_source(), build)

    @staticmethod
    def load(cfg: WikitextMiniConfig) -> TokenData:
        e = WikitextMini.entry(cfg)
        return subword_data("wikitext_mini", e, {s: e.array(s) for s in SPLITS})
