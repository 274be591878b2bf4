"""Your own runs side by side: mean ± std over seeds of every command that finished.

    python scripts/compare_runs.py                        # every run under runs/
    python scripts/compare_runs.py --runs runs/sweeps/multirun --name 'mini_moe_glu*'

scripts/paper_tables.py fills the paper's tables, from the runs of the experiments that
claim their cells; this script tabulates any finished run, of any experiment (your own:
configs/exp/*.yaml without a `paper:` block, docs/extending.md) and any overrides. A run
directory (anything under the roots holding a results.json) is grouped with the others
of the same experiment and the same overrides but the seed (read from its directory name,
`<name>/<overrides>`, as Hydra names it): one row per group, one seed per run (the newest,
when a `fresh=true` sibling ran it again; a note names the run left out), valid and test
metric as mean ± sample std.

Runs of one command can have trained different configs: the experiment file changed
between them. Their config.yaml (seed left out) tells them apart; such a group is split,
with the config's hash in a column of its own.
"""
from __future__ import annotations

import argparse
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.run_files import (  # noqa: E402
    UNREADABLE,
    as_seed,
    read_result,
    read_yaml,
    real,
    results_files,
    run_roots,
)
from scripts.run_results import (  # noqa: E402
    other_overrides,
    ours_text,
    print_out,
    run_overrides,
)


@dataclass(frozen=True)
class Row:
    name: str
    overrides: str  # those other than the seed, comma-separated ('' = the experiment's own)
    config: str  # hash of the run's config.yaml without the seed ('' = no config.yaml)
    metric: str


def config_without_seed(run_dir: Path) -> str:
    """sigma_moe.framework.experiment.config_hash of the run's config.yaml with the seed unset; ''
    when it cannot be read (not UTF-8: a UnicodeDecodeError is a ValueError)."""
    from sigma_moe.framework.experiment import config_hash

    cfg = read_yaml(run_dir / "config.yaml")
    if not isinstance(cfg, dict):
        return ""
    return config_hash({**cfg, "trainer": {**(cfg.get("trainer") or {}), "seed": None}})[:7]


def find(roots: list[Path], names: list[str]) -> dict[Row, dict[Any, dict[str, Any]]]:
    """Row -> seed -> the newest results.json of that seed (with its run_dir and mtime)."""
    rows: dict[Row, dict[Any, dict[str, Any]]] = {}
    for path in results_files(roots):
        res = read_result(path)
        if isinstance(res, str):
            print(f"warning: {path}: {UNREADABLE} ({res})", file=sys.stderr)
            continue
        name = str(res["name"])
        if names and not any(fnmatch.fnmatchcase(name, pat) for pat in names):
            continue
        run_dir = path.parent
        over = run_overrides(run_dir, name)
        # a directory chosen by hand (hydra.run.dir=...): its name is all we know of it
        extra = other_overrides(over) if over is not None else [f"dir {run_dir.name}"]
        row = Row(name, ",".join(extra), config_without_seed(run_dir), res["metric"])
        seeds = rows.setdefault(row, {})
        seed, mtime = as_seed(res.get("seed")), path.stat().st_mtime
        run = {**res, "run_dir": str(run_dir), "mtime": mtime}
        if seed in seeds:  # a fresh=true rerun, or a copy: the newest counts, and we say so
            newer = mtime > seeds[seed]["mtime"]  # a tie: the one found first
            left, kept = (seeds[seed], run) if newer else (run, seeds[seed])
            print(f"note: {left['run_dir']} left out: seed {seed} also ran in "
                  f"{kept['run_dir']}, which counts "
                  f"({'its results.json is newer' if newer else 'found first'})",
                  file=sys.stderr)
            run = kept
        seeds[seed] = run
    return rows


def table(rows: dict[Row, dict[Any, dict[str, Any]]]) -> str:
    """Markdown: one line per row, sorted by experiment and overrides."""
    commands = [(r.name, r.overrides) for r in rows]
    mixed = any(commands.count(c) > 1 for c in commands)
    head = ["experiment", "overrides", *(["config"] if mixed else []), "seeds", "metric",
            "valid", "test", "params"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sorted(rows, key=lambda r: (r.name, r.overrides, r.config)):
        runs = list(rows[row].values())
        seeds = ",".join(sorted((str(s) for s in rows[row]), key=lambda s: (len(s), s)))
        params = [p for p in (real(r.get("n_params")) for r in runs) if p is not None]
        cells = [row.name, row.overrides or "—", *([row.config or "?"] if mixed else []),
                 seeds, row.metric,
                 *(ours_text([r[split][row.metric] for r in runs], row.metric)
                   for split in ("valid", "test")),
                 f"{sum(params) / len(params) / 1e6:.2f}M" if params else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    if mixed:
        lines += ["", "Some commands trained different configs (their experiment file changed "
                      "between runs): the config column tells them apart (a hash of "
                      "config.yaml without the seed)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, nargs="+",
                    help="root directories searched recursively for results.json "
                         "(default: runs)")
    ap.add_argument("--name", action="append", default=[], metavar="PATTERN",
                    help="only experiments whose name matches (shell pattern, repeatable)")
    args = ap.parse_args(argv)
    rows = find(run_roots(args.runs, Path("runs")), args.name)
    if not rows:
        sys.exit("error: no finished run (results.json) under "
                 f"{', '.join(map(str, args.runs or ['runs']))}"
                 + (f" of an experiment matching {', '.join(args.name)}" if args.name else ""))
    text = table(rows)
    print_out(text)
    return text


if __name__ == "__main__":
    main()
