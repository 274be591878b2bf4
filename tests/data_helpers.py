"""Synthetic corpora for the data tests: random sentences over a small word list, gzipped
JSON-lines shards laid out like C4's, and a reader of a prepared entry's tokenizer."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import sentencepiece as spm

WORDS = "alpha beta gamma delta the of and in to was 1984 12 , . river city model".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def decoder(entry_path: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(entry_path / "spm.model"))


def write_shards(root: Path, pattern: str, n_files: int, docs_per_file: int, seed: int) -> list:
    rng, docs = random.Random(seed), []
    for i in range(n_files):
        path = root / pattern.format(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        for _ in range(docs_per_file):
            doc = "\n".join(sentence(rng, rng.randint(4, 30)) for _ in range(rng.randint(1, 4)))
            rows.append(json.dumps({"text": doc, "url": "x", "timestamp": "t"}))
            docs.append(doc)
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    return docs
