"""The finished runs under the --runs roots: where their results.json files are and what they
say (scripts/run_results.py judges them; scripts/compare_runs.py groups them). A file that a
table would fail or mislead on is "unreadable", with why."""
from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

UNREADABLE = "unreadable results.json"  # ... for a file with no usable name, metric or seed
NOT_JSON = "not JSON"  # ... of those, one that run.py too reads as unfinished


def run_roots(given: list[Path] | None, default: Path) -> list[Path]:
    """The --runs roots: each given one must be a directory (a typo would list every run as
    missing); the default may not exist yet (nothing has run: the tables say what to run),
    or the script was started from another directory: a note says so."""
    for root in given or ():
        if not root.is_dir():
            sys.exit(f"error: --runs {root} is not a directory")
        if next(_walk(root, set()), None) is None:  # a wrong directory, or none yet
            print(f"note: no finished run (results.json) under --runs {root}: the tables "
                  f"below are empty for it", file=sys.stderr)
    if not given and not default.is_dir():
        print(f"note: no {default}/ in {Path.cwd()}; if runs exist elsewhere, point --runs at "
              f"their directory", file=sys.stderr)
    return given or [default]


def results_files(roots: Iterable[Path]) -> Iterator[Path]:
    """Every results.json under the roots, each root's sorted. Directory links are followed
    (`runs/sweeps` on a scratch disk: Path.rglob does not follow them, and those runs were
    missing without a word); a directory or file reached again (`--runs runs runs/sweeps`, a
    link back up the tree) is not read twice: its runs, notes and warnings came twice."""
    seen: set[str] = set()  # resolved directories walked
    files: set[str] = set()  # resolved results.json files yielded (a linked file)
    for root in roots:
        for path in sorted(_walk(root, seen)):
            if (real_path := os.path.realpath(path)) not in files:
                files.add(real_path)
                yield path


def _walk(root: Path, seen: set[str]) -> Iterator[Path]:
    """The results.json files under root, following directory links, skipping (and adding
    to `seen`) the resolved directories in it; a missing or unreadable one yields nothing."""
    for top, dirs, names in os.walk(root, followlinks=True):
        if (real_top := os.path.realpath(top)) in seen:
            dirs[:] = []  # walked already: by another root, or this is a link loop
            continue
        seen.add(real_top)
        if "results.json" in names:
            yield Path(top) / "results.json"


def real(x: Any) -> int | float | None:
    """x when it is a finite number (not a bool), else None: a hand-edited or diverged
    field ("41M", NaN) must not reach a mean, where it fails or spreads."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return x if ok else None


def as_seed(x: Any) -> int | None:
    """A recorded seed as an int ("0" from a hand-edited file is seed 0, not another
    seed); None when it is not one."""
    if isinstance(x, str) and re.fullmatch(r"-?\d+", x.strip()):
        return int(x)
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _unreadable(res: Any) -> str | None:
    """What makes a parsed results.json unusable (None: it holds a finite number for the
    metric in valid and test, and an integer seed); a table would fail or mislead on it."""
    if not isinstance(res, dict) or not isinstance(res.get("metric"), str):
        return "no 'metric'"
    for split in ("valid", "test"):
        values = res.get(split)
        value = values.get(res["metric"]) if isinstance(values, dict) else None
        if value is None:
            return f"{split} has no number {res['metric']!r}"
        if real(value) is None:
            return f"{split} has no finite number {res['metric']!r} (it has {value!r})"
    if not res.get("name"):
        return "no experiment 'name'"
    if "seed" not in res:  # run.py always writes it: judged as seed None, it read as stale
        return "no 'seed'"
    if as_seed(res["seed"]) is None:
        return f"seed {res['seed']!r} is not an integer"
    return None


def read_yaml(path: Path) -> Any:
    """A run's YAML record (config.yaml, overrides.yaml); None when it cannot be read:
    missing, not YAML, or not UTF-8 (a UnicodeDecodeError is a ValueError)."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None


def read_result(path: Path) -> dict[str, Any] | str:
    """A results.json, or why it cannot be used."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"{NOT_JSON} ({type(e).__name__})"
    return _unreadable(res) or res


if __name__ == "__main__":  # a library without a CLI: say which scripts read the runs
    sys.exit("error: scripts/run_files.py is a library; print the results with "
             "`python scripts/paper_tables.py`, `python scripts/mini_claims.py` or "
             "`python scripts/compare_runs.py`")
