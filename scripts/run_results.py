"""Finished runs and their per-seed summary, shared by scripts/paper_tables.py and
scripts/mini_claims.py.

A run directory (anything under the given roots holding a results.json) belongs to the
experiment whose `name` it records; its seed is results["seed"]. Runs with overrides other
than `trainer.seed` (read from the Hydra directory name `<name>/<overrides>`) are another
configuration and are left out (as `Skipped` records) unless `all_overrides`. wandb runs
count when finished, read from the config/summary tasks/lm_run.py logs.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED_KEYS = {"trainer.seed"}


@dataclass
class Run:
    name: str
    seed: int | None
    metric: str
    valid: dict[str, float]
    test: dict[str, float]
    n_params: int | None
    source: str
    mtime: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)  # the results.json of a local run


@dataclass(frozen=True)
class Skipped:
    """A results.json (or wandb run) left out of the tables, and why. `name` is None when
    the file is unreadable."""
    path: Path
    name: str | None
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def run_overrides(run_dir: Path, name: str) -> str | None:
    """The overrides of `.../<name>/<overrides>` ('' for `.../<name>`), None if the
    directory was chosen by hand. A `fresh=true` sibling (`-2`, `-3`) has the same ones."""
    pat = re.compile(rf"^{re.escape(name)}(-\d+)?$")
    if pat.match(run_dir.name):
        return ""
    if pat.match(run_dir.parent.name):
        return re.sub(r"-\d+$", "", run_dir.name)
    return None


def other_overrides(overrides: str | None) -> list[str]:
    items = re.split(r",(?=[\w.+~/@-]+=)", overrides) if overrides else []
    return [it for it in items if it.split("=", 1)[0].lstrip("+~") not in SEED_KEYS]


def _other_config(run_dir: Path | None, name: str, all_overrides: bool,
                  where: Path | None = None) -> Skipped | None:
    """A run made with overrides other than the seed is another configuration: left out
    (reported at `where`, default its directory) unless `all_overrides`."""
    extra = other_overrides(run_overrides(run_dir, name) if run_dir is not None else None)
    if not extra or all_overrides:
        return None
    return Skipped(where or run_dir, name, f"{name} with overrides {','.join(extra)}")


def run_roots(given: list[Path] | None, default: Path) -> list[Path]:
    """The --runs roots: each given one must be a directory (a typo would list every run as
    missing); the default may not exist yet (nothing has run: the tables say what to run)."""
    for root in given or ():
        if not root.is_dir():
            sys.exit(f"error: --runs {root} is not a directory")
    return given or [default]


def _unreadable(res: Any) -> str | None:
    """What makes a parsed results.json unusable (None: it holds a number for the metric in
    valid and test); a table cell would fail on it with a traceback."""
    if not isinstance(res, dict) or not isinstance(res.get("metric"), str):
        return "no 'metric'"
    for split in ("valid", "test"):
        values = res.get(split)
        value = values.get(res["metric"]) if isinstance(values, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{split} has no number {res['metric']!r}"
    return None


def _read(path: Path) -> dict[str, Any] | str:
    """A results.json, or why it cannot be used."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"not JSON ({type(e).__name__})"
    return _unreadable(res) or res


def find_runs(roots: list[Path], all_overrides: bool = False) -> tuple[list[Run], list[Skipped]]:
    """Every finished run under `roots`; also the ones left out, with why (an unreadable
    file also gets a warning on stderr: it may be a finished run the tables now miss)."""
    runs, skipped = [], []
    for root in roots:
        for path in sorted(root.rglob("results.json")) if root.is_dir() else []:
            res = _read(path)
            if isinstance(res, str):
                skipped.append(Skipped(path, None, f"unreadable results.json ({res})"))
                print(f"warning: {skipped[-1]}", file=sys.stderr)
                continue
            name = str(res.get("name"))
            if (left_out := _other_config(path.parent, name, all_overrides)) is not None:
                skipped.append(left_out)
                continue
            runs.append(Run(name, res.get("seed"), res["metric"], res["valid"], res["test"],
                            res.get("n_params"), str(path.parent), path.stat().st_mtime, res))
    return runs, skipped


def wandb_runs(project: str, all_overrides: bool = False) -> tuple[list[Run], list[Skipped]]:
    """Finished runs of a wandb project: config `name` / `trainer.seed` / `run_dir`, summary
    `valid_<metric>` / `test_<metric>` (written by tasks/lm_run.py at the end of training).
    Crashed or running ones are not finished; runs with other overrides (read from their
    run directory's name, as local runs) are left out like local ones."""
    import wandb

    out, skipped = [], []
    for r in wandb.Api().runs(project):
        cfg, summary = dict(r.config), r.summary
        if r.state != "finished" or not cfg.get("name"):
            continue
        name, source = str(cfg["name"]), f"wandb:{project}/{r.id}"
        run_dir = Path(cfg["run_dir"]) if cfg.get("run_dir") else None
        if (left_out := _other_config(run_dir, name, all_overrides, Path(source))) is not None:
            skipped.append(left_out)
            continue
        for metric in ("ppl", "bpc"):
            valid, test = summary.get(f"valid_{metric}"), summary.get(f"test_{metric}")
            if valid is not None and test is not None:
                seed = (cfg.get("trainer") or {}).get("seed")
                out.append(Run(name, seed, metric, {metric: float(valid)},
                               {metric: float(test)}, summary.get("n_params"), source))
                break
    return out, skipped


def by_experiment(runs: list[Run]) -> dict[str, list[Run]]:
    """name -> one run per seed (the newest when a seed ran twice), local before wandb."""
    best: dict[tuple[str, Any], Run] = {}
    for run in runs:
        key = (run.name, run.seed)
        if key not in best or run.mtime > best[key].mtime:
            best[key] = run
    out: dict[str, list[Run]] = {}
    for (name, _), run in sorted(best.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        out.setdefault(name, []).append(run)
    return out


# -- seeds of one cell -----------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); no std for a single seed."""
    if not values:
        raise ValueError("mean_std of no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def fmt_metric(x: float, metric: str, sign: bool = False) -> str:
    """bpc with 3 decimals, perplexity with 2 (as the paper)."""
    return f"{x:{'+' if sign else ''}.{3 if metric == 'bpc' else 2}f}"


def ours_text(values: list[float], metric: str, pm: str = " ± ") -> str:
    """'mean ± std (n=k)' of the seeds of one cell (no std for one seed)."""
    mean, std = mean_std(values)
    text = fmt_metric(mean, metric) + ("" if std is None else pm + fmt_metric(std, metric))
    return text + (f" (n={len(values)})" if len(values) > 1 else "")


if __name__ == "__main__":  # a library without a CLI: say which scripts read the runs
    sys.exit("error: scripts/run_results.py is a library; print the results with "
             "`python scripts/paper_tables.py` or `python scripts/mini_claims.py`")
