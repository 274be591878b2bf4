"""scripts/prepare_data.py: the prepare, --verify, its options and its one-line stops (the
datasets themselves: tests/test_data_sets.py)."""
from __future__ import annotations

import errno

import pytest

from scripts import prepare_data
from sigma_moe.framework.data import enwik8
from sigma_moe.framework.data.enwik8 import Enwik8, Enwik8Config
from sigma_moe.framework.data.wt103 import Wt103
from tests.data_helpers import write_shards


def test_prepare_data_script(tmp_path, capsys, monkeypatch):
    (tmp_path / "enwik8").write_bytes(b"hello enwik8 " * 100)
    assert prepare_data.main(["enwik8", "--source", str(tmp_path / "enwik8"),
                              "--cache-dir", str(tmp_path / "c")]) == 1  # not 10^8 bytes
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has 1,300 bytes, not the 100,000,000 of enwik8" in err
    monkeypatch.setattr(enwik8, "ENWIK8_BYTES", 1300)  # a small stand-in for the real file
    assert prepare_data.main(["enwik8", "--source", str(tmp_path / "enwik8"),
                              "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    entry = Enwik8.entry(Enwik8Config(cache_dir=str(tmp_path / "c")))
    assert f"train 1,170, valid 65, test 65 tokens, vocab 10, metric bpc in {entry.path} (" in out
    verify = ["enwik8", "--cache-dir", str(tmp_path / "c"), "--verify"]
    assert prepare_data.main(verify) == 0
    assert "verified: every file matches its sha256 (3 files)" in capsys.readouterr().out
    entry = Enwik8.entry(Enwik8Config(cache_dir=str(tmp_path / "c")))
    (entry.path / "test.bin").write_bytes(b"\0" * 65)  # same size, other bytes
    assert prepare_data.main(verify) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {entry.path}: test.bin: sha256 differs from the manifest's (damaged)",
        f"delete {entry.path} and prepare again (this command without --verify, with "
        "--source where the original is local)"]
    assert prepare_data.main(["enwik_mini", "--verify"]) == 0
    assert "nothing to verify" in capsys.readouterr().out
    # nothing prepared: --verify builds nothing (C4 would stream from the hub)
    assert prepare_data.main(["c4", "--cache-dir", str(tmp_path / "none"), "--verify"]) == 1
    assert capsys.readouterr().err == (f"error: c4: nothing prepared with these settings under "
                                       f"{tmp_path / 'none' / 'c4'}\n")
    assert not (tmp_path / "none").exists()
    # C4's train_tokens is no part of the cache key: --verify takes the entry as it is
    src = tmp_path / "c4"
    write_shards(src, "en/c4-train.{:05d}-of-01024.json.gz", 1, 40, 3)
    write_shards(src, "en/c4-validation.{:05d}-of-00008.json.gz", 1, 30, 4)
    small = ["vocab_size=80", "spm_train_docs=30", "valid_docs=5", "--cache-dir",
             str(tmp_path / "c")]
    assert prepare_data.main(["c4", "train_tokens=700", "--source", str(src), *small]) == 0
    capsys.readouterr()
    assert prepare_data.main(["c4", "--verify", *small]) == 0
    assert "verified: every file matches its sha256 (4 files)" in capsys.readouterr().out
    assert prepare_data.main(["enwik8", "--source", str(tmp_path / "no"),
                              "--cache-dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "python scripts/prepare_data.py enwik8 --source" in err
    assert prepare_data.main(["c4", "train_tokens=-1", "--cache-dir", str(tmp_path)]) == 1
    assert "dataset.train_tokens" in capsys.readouterr().err


def test_prepare_data_options(monkeypatch):
    """Mutants: --num-proc stored under another key (refused as unknown), and the key=value
    overrides applied after the options (parse's docstring: options last)."""
    _, _, cfg, _ = prepare_data.parse(["wt103", "--num-proc", "3"])
    assert cfg.num_proc == 3
    _, _, cfg, _ = prepare_data.parse(["c4", "source=/a", "--source", "/b"])
    assert cfg.source == "/b"
    # not YAML (a glob reads as an alias): taken as written, not a traceback
    _, _, cfg, _ = prepare_data.parse(["c4", "train_files=*.json.gz",
                                       "valid_files={a,b}.json.gz"])
    assert (cfg.train_files, cfg.valid_files) == ("*.json.gz", "{a,b}.json.gz")


@pytest.mark.parametrize("raised,rc,said", [
    (KeyboardInterrupt(), 130,
     "interrupted; nothing half-prepared is kept: rerun the same command"),
    (OSError(errno.EROFS, "Read-only file system", "/c/x.lock"), 1,
     "error: [Errno 30] Read-only file system: '/c/x.lock'; SIGMA_MOE_CACHE or --cache-dir "
     "picks another cache folder")])
def test_prepare_data_stops_in_one_line(monkeypatch, capsys, raised, rc, said):
    """Ctrl-C was a KeyboardInterrupt traceback (status -2); a read-only cache said nothing
    of how to pick another."""

    def load(cfg):
        raise raised

    monkeypatch.setattr(Wt103, "load", load)
    assert prepare_data.main(["wt103"]) == rc
    assert capsys.readouterr().err == said + "\n"
