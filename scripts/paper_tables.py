"""The paper's tables, regenerated from our runs (issue 7; paper Tabs. topk, pkm, moe,
ablation_existing / ablation_detailed, new_results, flops_detailed).

    python scripts/paper_tables.py                      # every table, Markdown
    python scripts/paper_tables.py --table moe --format latex
    python scripts/paper_tables.py --runs runs /scratch/runs --wandb ENTITY/PROJECT

What each table holds comes from the experiment files alone: every `configs/exp/*.yaml`
carries `paper: {params_m, entries: [{table, row, column, value}]}`. A run directory
(anything under `--runs` holding a results.json; scripts/run_results.py finds them) belongs
to the experiment whose `name` it records; its seed is results["seed"]. It counts only if
it trained the experiment's config as configs/exp/<name>.yaml says now (the config_hash
in its results.json). Runs with overrides other than `trainer.seed` (read from the Hydra
directory name `<name>/<overrides>`) are listed under the table, not counted, unless
`--all-overrides`, which counts them for the seeds that no run of the experiment's own
config has, marks their cells † and lists them under the table; stale runs are listed,
never counted. Several seeds of one experiment are averaged: mean ± sample std (n - 1).

Metric: test for WikiText-103 / Enwik8, validation for C4 and peS2o (the paper reports
validation perplexity there). Each cell: ours [± std] (n seeds) / paper (Δ = ours - paper)
· our parameter count. A missing run is `—`; the commands producing the missing runs and
seeds (of the table's sweep, configs/sweep/<table>.yaml) are listed below.
The relative FLOPs table is computed from the experiment configs (scripts/flops_table.py).
"""
from __future__ import annotations

import argparse
import functools
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.flops_table import config_relative_flops, format_percent  # noqa: E402
from scripts.run_files import real, run_roots  # noqa: E402
from scripts.run_results import (  # noqa: E402
    OVERRIDDEN,
    Run,
    Skipped,
    by_experiment,
    counted_names,
    find_runs,
    fmt_metric,
    markdown_notes,
    missing_commands,
    ours_text,
    overridden_runs,
    print_out,
    skipped_of,
    superseded,
)
from scripts.run_versions import (  # noqa: E402
    code_versions,
    data_versions,
    precision_versions,
)
from scripts.wandb_runs import wandb_runs  # noqa: E402
from sigma_moe.framework.config import chosen_groups, first_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VALID_SPLIT_DATASETS = {"c4", "pes2o"}


@dataclass(frozen=True)
class Spec:
    title: str
    rows: tuple[str, ...] = ()  # the paper's order; labels not listed follow, as they appear
    columns: tuple[str, ...] = ()


WT_E8 = ("WT-S", "WT-S*", "WT-B", "E8")
MOE = "σ-MoE (ours)"
TABLES: dict[str, Spec] = {
    "dense": Spec("Dense baselines (Tab. dense_hyper sizes; Tabs. topk, moe, Sec. 5.3)",
                  ("47M", "238M", "262M", "41M"), ("WT-S", "WT-S*", "WT-B", "E8")),
    "moe": Spec("Tab. moe: σ-MoE vs parameter-matched dense baselines",
                ("Dense", "σ-MoE"),
                ("E8", "WT-S", "WT-B", "C4-S", "C4-B", "peS2o-S", "peS2o-B")),
    "ablation": Spec("Tabs. ablation_existing / ablation_detailed: MoE variants and ablations",
                     (MOE, *(f"{MOE}, {v}" for v in (
                         "standard dropout", "softmax (after top-k)", "softmax (before top-k)",
                         "standard init", "no reg (γ=0,δ=0)", "K=8, G=64", "K=2, G=256",
                         "K=1, G=512", "N_E' = 2N_E, G=64", "K=1", "K=2", "K=8")),
                      "Switch, K=1, G=512", "Switch, K=1, G=512, no dropout", "Switch, K=4, G=128",
                      "Switch, K=1, G=128", "Switch, K=1, G=128, no dropout",
                      "S-BASE, K=4, G=128", "S-BASE, K=1, G=512"),
                     WT_E8),
    "pkm": Spec("Tabs. pkm / pkm_details: product-key memory",
                ("Dense Baseline, ReLU", "PKM, value-count, Softmax", "PKM, value-count, ReLU",
                 "PKM, # total params., Softmax", "PKM, # total params., ReLU",
                 "PKM + init, # total params., ReLU"),
                ("WT-S", "WT-B", "WT-M", "E8")),
    "topk": Spec("Tab. topk: Top-K activation in the dense MLP",
                 ("Dense", "K=64", "K=128", "K=256", "K=512"), ("E8", "WT-S", "WT-B")),
    "c4_pes2o": Spec("Tab. new_results: C4 and peS2o (validation perplexity)",
                     ("Dense", "σ-MoE", "Switch", "S-BASE"),
                     ("C4-S", "C4-B", "peS2o-S", "peS2o-B")),
}
FLOPS = "flops"
FLOPS_TITLE = "Tab. flops_detailed: relative FLOPs and memory of the feedforward block"
ALL_TABLES = (*TABLES, FLOPS)


def norm(label: str) -> str:
    """Match labels however they are spelled ($\\sigma$-MoE, σ-MoE, sigma-moe, spaces)."""
    s = label.lower().replace("$\\sigma$", "σ").replace("\\sigma", "σ").replace("sigma", "σ")
    return re.sub(r"[\s${}\\_]", "", s)


# -- experiments ------------------------------------------------------------------------------
@dataclass
class Experiment:
    stem: str  # file name: `+exp=<stem>`
    name: str  # the `name:` a run records in results.json
    params_m: float | None
    entries: list[dict[str, Any]]
    cfg: dict[str, Any]

    @property
    def split(self) -> str:
        return "valid" if (self.cfg.get("dataset") or {}).get("kind") in VALID_SPLIT_DATASETS \
            else "test"


@functools.cache
def _load_yaml(path: Path) -> Any:
    return OmegaConf.to_container(OmegaConf.load(path))


def compose_exp(path: Path, configs: Path) -> dict[str, Any]:
    """configs/config.yaml defaults + the exp's group overrides + its body (like Hydra,
    without Hydra: enough for the values the tables read)."""
    base = _load_yaml(configs / "config.yaml") if (configs / "config.yaml").exists() else {}
    exp = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(exp, dict):
        raise ValueError(f"holds a {type(exp).__name__}, not a mapping of config keys")
    groups = {**chosen_groups(base.get("defaults")), **chosen_groups(exp.get("defaults"))}
    parts: list[Any] = [{k: v for k, v in base.items() if k not in ("defaults", "hydra")}]
    for group, opt in groups.items():
        if (configs / group / f"{opt}.yaml").exists():
            parts.append({group: _load_yaml(configs / group / f"{opt}.yaml")})
    parts.append({k: v for k, v in exp.items() if k != "defaults"})
    merged = OmegaConf.merge(*parts)
    try:
        return OmegaConf.to_container(merged, resolve=True)
    except Exception:  # an interpolation we cannot resolve outside Hydra: keep it as text
        return OmegaConf.to_container(merged, resolve=False)


def load_experiments(exp_dir: Path) -> dict[str, Experiment]:
    """Every exp file of `exp_dir` (load_experiment)."""
    configs = configs_of(exp_dir)
    return {path.stem: load_experiment(path, configs) for path in sorted(exp_dir.glob("*.yaml"))}


def configs_of(exp_dir: Path) -> Path:
    """The config tree an exp directory's files are composed in: its parent when that is one."""
    return exp_dir.parent if (exp_dir.parent / "config.yaml").exists() else ROOT / "configs"


def load_experiment(path: Path, configs: Path) -> Experiment:
    """One exp file (scripts/mini_claims.py reads its own with it); one that does not parse,
    or whose `paper:` block is malformed, stops the script with one line naming it."""
    try:
        cfg = compose_exp(path, configs)
        paper = cfg.get("paper") or {}
        if not isinstance(paper, dict):
            raise ValueError("paper must be a mapping {params_m, entries}")
        return Experiment(path.stem, str(cfg.get("name") or path.stem),
                          paper.get("params_m"), paper_entries(paper), cfg)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError, OSError) as e:
        sys.exit(f"error: {path}: {first_line(e)}")  # syntax, merge, our checks


def paper_entries(paper: dict[str, Any]) -> list[dict[str, Any]]:
    """`paper.entries`, checked: the cells format numbers (a typo such as `23,25` would
    fail there, with a traceback)."""
    entries = paper.get("entries") or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("paper.entries must be a list of {table, row, column, value}")
    for e in entries:
        if e.get("value") is not None and real(e["value"]) is None:
            raise ValueError(f"paper.entries value {e['value']!r} ({e.get('table')}, "
                             f"{e.get('row')}, {e.get('column')}) is not a number")
    if paper.get("params_m") is not None and real(paper["params_m"]) is None:
        raise ValueError(f"paper.params_m {paper['params_m']!r} is not a number")
    return list(entries)


# -- tables -----------------------------------------------------------------------------------
@dataclass
class Cell:
    exp: Experiment | None
    ours: list[float] = field(default_factory=list)
    paper: float | None = None
    n_params: float | None = None
    flops: float | None = None
    metric: str = ""
    overridden: bool = False  # counts runs of other settings (--all-overrides)


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: list[tuple[str, list[str], list[Cell | str]]]  # label, lead values, cells
    lead: list[str] = field(default_factory=list)  # lead column names (e.g. G, K)
    header_rows: list[tuple[str, list[str]]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # commands producing missing seeds
    notes: list[str] = field(default_factory=list)  # runs not counted, and why
    overridden: list[str] = field(default_factory=list)  # runs counted of other settings
    code: list[str] = field(default_factory=list)  # code versions of the counted runs
    data: list[str] = field(default_factory=list)  # data versions, when they differ
    precision: list[str] = field(default_factory=list)  # precisions, when they differ


def ordered(labels: list[str], preferred: tuple[str, ...]) -> list[str]:
    pref = [norm(p) for p in preferred]
    rank = {lab: (pref.index(norm(lab)) if norm(lab) in pref else len(pref) + i)
            for i, lab in enumerate(labels)}
    return sorted(labels, key=rank.__getitem__)


def _layout(table: str, exps: dict[str, Experiment]):
    """(row, column) -> (exp, entry) of one table, rows and columns in the paper's order."""
    spec = TABLES[table]
    grid: dict[tuple[str, str], tuple[Experiment, dict[str, Any]]] = {}
    rows: list[str] = []
    cols: list[str] = []
    for exp in exps.values():
        for entry in exp.entries:
            if entry.get("table") != table:
                continue
            row, col = str(entry.get("row")), str(entry.get("column"))
            rows += [row] if row not in rows else []
            cols += [col] if col not in cols else []
            grid.setdefault((row, col), (exp, entry))
    return ordered(rows, spec.rows), ordered(cols, spec.columns), grid


def build_table(table: str, exps: dict[str, Experiment], runs: dict[str, list[Run]],
                skipped: list[Skipped] = (), include_selector: bool = False) -> Table:
    rows, cols, grid = _layout(table, exps)
    out = Table(table, TABLES[table].title, cols, [])
    seeds: dict[str, list[Any]] = {}  # experiment stem -> the seeds it has, in table order
    counted: list[Run] = []
    for row in rows:
        cells: list[Cell | str] = []
        for col in cols:
            if (row, col) not in grid:
                cells.append("")
                continue
            exp, entry = grid[(row, col)]
            cell = Cell(exp, paper=entry.get("value"))
            if table == "moe":
                cell.flops = config_relative_flops(exp.cfg, include_selector)
            found = runs.get(exp.name, [])
            seeds[exp.stem] = [r.seed for r in found]
            counted += found
            if found:
                cell.metric = found[0].metric
                split = exp.split
                cell.ours = [getattr(r, split)[r.metric] for r in found]
                cell.overridden = any(r.overrides for r in found)
                counts = [r.n_params for r in found if r.n_params]
                cell.n_params = statistics.fmean(counts) if counts else None
            cells.append(cell)
        out.rows.append((row, [], cells))
    out.missing = missing_commands(table, seeds, skipped)  # each table has its sweep
    names = {grid[k][0].name for k in grid}
    out.notes = [str(s) for s in skipped_of(skipped, names)]
    out.overridden = overridden_runs(counted)
    out.code, out.data = code_versions(counted), data_versions(counted)
    out.precision = precision_versions(counted)
    return out


def build_flops_table(exps: dict[str, Experiment], include_selector: bool = False) -> Table:
    """Tab. flops_detailed: the configurations of the ablation table (else of Tab. moe)."""
    source = "ablation" if any(e.get("table") == "ablation" for x in exps.values()
                               for e in x.entries) else "moe"
    rows, cols, grid = _layout(source, exps)
    out = Table(FLOPS, FLOPS_TITLE + ("" if not include_selector else " (selector included)"),
                cols, [], lead=["G", "K"])
    first_in_col = {c: next((grid[(r, c)][0] for r in rows if (r, c) in grid), None)
                    for c in cols}
    out.header_rows = [
        ("d_model", [str((e.cfg.get("model") or {}).get("d_model", "—")) if e else "—"
                     for e in first_in_col.values()]),
        ("# params (paper)", [f"{e.params_m}M" if e and e.params_m else "—"
                              for e in first_in_col.values()]),
    ]
    for row in rows:
        here = [grid[(row, c)][0] if (row, c) in grid else None for c in cols]
        ffn = next((e.cfg.get("ffn") or {} for e in here if e), {})
        lead = [str(ffn.get("expert_size", "—")), str(ffn.get("k", "—"))]
        if ffn.get("kind") in ("dense", "topk"):
            lead = ["—", "—"]
        cells: list[Cell | str] = [
            format_percent(config_relative_flops(e.cfg, include_selector)) if e else "-"
            for e in here]
        out.rows.append((row, lead, cells))
    return out


# -- rendering --------------------------------------------------------------------------------
def cell_text(cell: Cell | str, latex: bool = False) -> str:
    if isinstance(cell, str):
        return latex_escape(cell) if latex else cell
    paper = "n/a" if cell.paper is None else f"{cell.paper:.2f}"  # as printed in the paper
    pm = "$\\pm$" if latex else " ± "
    if not cell.ours:
        ours = "---" if latex else "—"
        params = f"{cell.exp.params_m}M" if cell.exp and cell.exp.params_m else ""
    else:
        ours = ours_text(cell.ours, cell.metric, pm, cell.overridden)
        if cell.paper is not None:
            mean = statistics.fmean(cell.ours)
            paper += f" (Δ {fmt_metric(mean - cell.paper, cell.metric, sign=True)})"
        params = f"{cell.n_params / 1e6:.3g}M" if cell.n_params else ""
    text = f"{ours} / {paper}" + (f" · {params}" if params else "")
    if cell.flops is not None:
        text += f" · {format_percent(cell.flops)} FLOPs"
    if latex:
        text = text.replace("%", "\\%").replace("Δ", "$\\Delta$").replace("·", "$\\cdot$")
        text = text.replace(OVERRIDDEN, "$^\\dagger$")
    return text


def latex_escape(s: str) -> str:
    """A label as LaTeX text: `$...$` parts (`$\\sigma$-MoE`) stay math; elsewhere an &, %, #
    not already escaped is (a raw & adds a column, a raw % comments out the rest of the
    row), and so are _ { } unless the part holds a LaTeX command; Greek letters become math."""
    parts = s.split("$")
    for i in range(0, len(parts), 2):  # even parts lie outside math
        special = "&%#" if "\\" in parts[i] else "&%#_{}"
        text = re.sub(rf"(?<!\\)([{re.escape(special)}])", r"\\\1", parts[i])
        parts[i] = "".join(f"${LATEX_GREEK[c]}$" if c in LATEX_GREEK else c
                           for c in text).replace("—", "---")
    return "$".join(parts)


LATEX_GREEK = {c: "\\" + name for c, name in zip(
    "αβγδεηθκλμνπρστφχψωΓΔΘΛΞΠΣΦΨΩ",
    "alpha beta gamma delta epsilon eta theta kappa lambda mu nu pi rho sigma tau phi chi psi "
    "omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split(), strict=True)}


LEGEND = ("Each cell: ours ± sample std over seeds (n seeds) / paper (Δ = ours − paper) · our "
          "parameter count. Metric: test bpc/ppl for WikiText-103 and Enwik8, validation ppl "
          "for C4 and peS2o. `—`: not run yet.")
MISSING = ("Missing runs (Slurm jobs; `hydra/launcher=local` runs them on this "
           "machine; docs/cluster.md):")


def render_markdown(t: Table) -> str:
    head = ["", *t.lead, *t.columns]
    lines = [f"### {t.title}", "", "| " + " | ".join(head) + " |",
             "|" + "|".join([":--", *["--:"] * (len(head) - 1)]) + "|"]
    for label, values in t.header_rows:
        lines.append("| " + " | ".join([label, *[""] * len(t.lead), *values]) + " |")
    for label, lead, cells in t.rows:
        lines.append("| " + " | ".join([label, *lead, *map(cell_text, cells)]) + " |")
    if t.name != FLOPS:
        lines += ["", LEGEND]
    lines += markdown_notes(MISSING, t.missing, t.notes, t.code, t.data, t.overridden,
                            t.precision)
    return "\n".join(lines) + "\n"


def render_latex(t: Table) -> str:
    head = ["", *t.lead, *t.columns]
    lines = ["\\begin{table*}[h]", "\\centering", "\\small",
             f"\\caption{{{latex_escape(t.title)}}}", f"\\label{{tab:ours_{t.name}}}",
             "\\begin{tabular}{l" + "r" * (len(head) - 1) + "}", "\\toprule",
             " & ".join(map(latex_escape, head)) + " \\\\"]
    for label, values in t.header_rows:
        lines.append(" & ".join(map(latex_escape, [label, *[""] * len(t.lead), *values]))
                     + " \\\\")
    lines.append("\\midrule")
    for label, lead, cells in t.rows:
        lines.append(" & ".join([latex_escape(label), *map(latex_escape, lead),
                                 *(cell_text(c, latex=True) for c in cells)]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table*}"]
    lines += [f"% missing: {cmd}" for cmd in t.missing]
    lines += [f"% not counted: {n}" for n in t.notes]
    lines += [f"% counted with --all-overrides ($^\\dagger$): {n}" for n in t.overridden]
    lines += [f"% code: {c}" for c in t.code]
    lines += [f"% data: {d}" for d in t.data]
    lines += [f"% precision: {p}" for p in t.precision]
    return "\n".join(lines) + "\n"


def build_all(exps: dict[str, Experiment], runs: list[Run], skipped: list[Skipped] = (),
              only: str | None = None, include_selector: bool = False) -> list[Table]:
    grouped = by_experiment(runs)
    skipped = [*skipped, *superseded(runs)]  # listed under the tables with the others
    out = []
    for name in [only] if only else ALL_TABLES:
        if name == FLOPS:
            out.append(build_flops_table(exps, include_selector))
        else:
            out.append(build_table(name, exps, grouped, skipped, include_selector))
    return [t for t in out if t.rows or only]


def note_outside_tables(exps: dict[str, Experiment], runs: list[Run],
                        skipped: list[Skipped]) -> None:
    """A note on stderr about the runs of experiments in none of the paper's tables (the
    main job's, the mini report's, a user's own): no table or list mentions them."""
    in_tables = {e.name for e in exps.values() if any(x.get("table") != "mini" for x in e.entries)}
    known = {e.name for e in exps.values()}  # runs of no exp file: find_runs warned already
    counts: dict[str, int] = {}
    for name in [r.name for r in runs] + [s.name for s in skipped]:
        if name in known and name not in in_tables:
            counts[name] = counts.get(name, 0) + 1
    if counts:
        print(f"note: {sum(counts.values())} run(s) of experiments in none of the paper's "
              f"tables: {counted_names(counts)}; scripts/compare_runs.py tabulates them "
              f"(--mini: the mini report)", file=sys.stderr)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exp-dir", type=Path, default=ROOT / "configs" / "exp")
    ap.add_argument("--runs", type=Path, nargs="+",
                    help="root directories searched recursively for results.json "
                         "(default: runs)")
    ap.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read finished wandb runs")
    ap.add_argument("--table", choices=ALL_TABLES, help="print only this table")
    ap.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    ap.add_argument("--all-overrides", action="store_true",
                    help="also count runs whose directory shows overrides besides "
                         "trainer.seed, for seeds no run of the experiment's own config has "
                         "(their cells are marked †)")
    ap.add_argument("--flops-selector", action="store_true",
                    help="count the selector N_E*d_model in the FLOPs table (the paper does not)")
    ap.add_argument("--mini", action="store_true",
                    help="the laptop-scale tables and claim checks (configs/sweep/mini.yaml; "
                         "Markdown from local runs: --runs, --exp-dir, --all-overrides only)")
    args = ap.parse_args(argv)
    if not args.exp_dir.is_dir():
        ap.error(f"--exp-dir {args.exp_dir} is not a directory")
    if args.mini and (unused := [flag for flag, given in (
            ("--table", args.table), ("--format", args.format != "markdown"),
            ("--wandb", args.wandb), ("--flops-selector", args.flops_selector)) if given]):
        ap.error(f"--mini prints the mini report (Markdown, from local runs) and takes no "
                 f"{', '.join(unused)}")
    args.runs = run_roots(args.runs, Path("runs"))
    if args.mini:
        from scripts.mini_claims import report

        text = report(args.exp_dir, args.runs, args.all_overrides)
        print_out(text)
        return text
    exps = load_experiments(args.exp_dir)
    runs, skipped = find_runs(args.runs, args.exp_dir, args.all_overrides)
    if args.wandb:  # by_experiment prefers a local run of the same seed (newer mtime)
        more, more_skipped = wandb_runs(args.wandb, args.exp_dir, args.all_overrides)
        runs, skipped = runs + more, skipped + more_skipped
    tables = build_all(exps, runs, skipped, args.table, args.flops_selector)
    note_outside_tables(exps, runs, skipped)
    if not any(t.rows for t in tables):
        sys.exit(f"error: no exp file in {args.exp_dir} has paper.entries"
                 + (f" for table {args.table}" if args.table else ""))
    render = render_latex if args.format == "latex" else render_markdown
    text = "\n".join(render(t) for t in tables)
    print_out(text)
    return text


if __name__ == "__main__":
    main()
