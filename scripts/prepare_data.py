"""Prepare one dataset's cache ahead of a run (docs/REFERENCE.md "Datasets"; docs/DESIGN.md).

    python scripts/prepare_data.py wt103 --source /data/wikitext-103
    python scripts/prepare_data.py enwik8 --source /data/enwik8.zip --cache-dir /scratch/cache
    python scripts/prepare_data.py c4 train_tokens=1638400064          # streams from the hub
    python scripts/prepare_data.py c4 --source /data/c4-copy           # local shards
    python scripts/prepare_data.py wt103 --verify      # re-read the cache against its sha256

The settings come from configs/dataset/NAME.yaml plus `key=value` overrides, which must
match what the run will use (an experiment's `dataset.*` overrides), because the cache is
keyed by them. `--source` is only used to find the original: a later run with `source: ""`
finds the prepared cache by its settings, so machines with no internet can copy the
archive here and prepare from it. Several jobs may run this at once: they share the work.
"""
from __future__ import annotations

import argparse
import errno
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:  # a Ctrl-C while these import (torch: a second) is no traceback
    from sigma_moe.framework.config import ConfigError, from_dict, is_environment_error  # noqa: E402
    from sigma_moe.framework.data import DATASETS, DataError  # noqa: E402
    from sigma_moe.framework.data.cache import prepared_only  # noqa: E402
    from sigma_moe.framework.loggers import console_logging  # noqa: E402
except KeyboardInterrupt:
    sys.exit(130)


def parse_override(text: str) -> tuple[str, object]:
    """key=value, the value read as YAML (a number, a list), else as it is written (a glob
    `train_files=*.json.gz`: YAML would read an alias)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"override {text!r}: write key=value, e.g. train_tokens=1638400064")
    try:
        return key, yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        return key, value


def parse(argv: list[str] | None = None) -> tuple[str, type, object, bool]:
    """(dataset name, its class, its validated Config, --verify) from the command line: the
    yaml's fields, then the key=value overrides, then the options. ConfigError when invalid."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("name", choices=DATASETS.names(), help="dataset (configs/dataset/NAME.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dataset config fields, as the run sets them")
    p.add_argument("--source", help="local copy of the original archive / file / directory")
    p.add_argument("--cache-dir", help="cache root (default $SIGMA_MOE_CACHE or "
                   "~/.cache/sigma_moe); the run must use the same")
    p.add_argument("--num-proc", type=int, help="encoding processes (default: all cores)")
    p.add_argument("--verify", action="store_true",
                   help="re-read the prepared files against their sha256 (exit 1 if damaged)")
    args = p.parse_intermixed_args(argv)  # key=value after an option too
    fields = yaml.safe_load((ROOT / "configs" / "dataset" / f"{args.name}.yaml").read_text())
    fields.pop("kind", None)
    fields.update(parse_override(o) for o in args.overrides)
    for key, value in (("source", args.source), ("cache_dir", args.cache_dir),
                       ("num_proc", args.num_proc)):
        if value is not None:
            fields[key] = value
    cls = DATASETS.get(args.name)
    return args.name, cls, from_dict(cls.Config, fields, "dataset"), args.verify


def main(argv: list[str] | None = None) -> int:
    console_logging()
    try:
        name, cls, cfg, verify = parse(argv)
        if verify and not hasattr(cls, "entry"):  # nothing wrong: nothing to check
            print(f"{name} is not cached (built from the embedded file at every load): "
                  f"nothing to verify")
            return 0
        t0 = time.time()
        if verify:  # the entry as prepared: nothing built, nothing loaded (a C4 prefix's hash)
            with prepared_only():
                entry = cls.entry(cfg)
            problems, made, where = entry.verify(), entry.manifest, entry.path
            sizes = {split: info["length"] for split, info in made["arrays"].items()}
            vocab, metric = made["vocab_size"], made["metric"]
        else:  # (where it was cached: as the load found it, not looked up again)
            data = cls.load(cfg)
            problems, sizes = [], {split: len(a) for split, a in data.splits.items()}
            vocab, metric, where = data.vocab_size, data.metric, data.origin.get("cache_entry")
    except (ConfigError, ValueError, DataError, OSError) as e:
        if isinstance(e, OSError) and not is_environment_error(e):
            raise
        hint = ("; SIGMA_MOE_CACHE or --cache-dir picks another cache folder" if isinstance(
            e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else "")
        print(f"error: {e}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # what was half-built is removed (cache.py): rerun to go on
        print("interrupted; nothing half-prepared is kept: rerun the same command",
              file=sys.stderr)
        return 130
    print(f"{name}: {', '.join(f'{s} {n:,}' for s, n in sizes.items())} tokens, vocab {vocab}, "
          f"metric {metric}{f' in {where}' if where else ''} ({time.time() - t0:.1f} s)")
    for problem in problems:
        print(f"error: {entry.path}: {problem}", file=sys.stderr)
    if problems:
        print(f"delete {entry.path} and prepare again (this command without --verify, with "
              f"--source where the original is local)", file=sys.stderr)
        return 1
    if verify:
        print(f"verified: every file matches its sha256 ({len(entry.checksums())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
