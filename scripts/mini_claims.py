"""The paper's claims at laptop scale (issue 9): the mini tables, a check of each claim
against the seed spread, and a CPU throughput table.

    python scripts/mini_claims.py --runs runs/sweeps/mini
    python scripts/paper_tables.py --mini --runs runs/sweeps/mini   # the same report

Runs come from `python run.py -m +sweep=mini` (configs/sweep/mini.yaml, docs/mini.md): the
experiments `mini_{enwik,wiki}_<variant>` x seeds. Metric: test bits/char (enwik_mini) and
test perplexity (wikitext_mini) on a fixed subset of the split (`task.final_segments`);
lower is better. Each cell: mean ± sample std over seeds (n - 1), as scripts/paper_tables.py.
A run counts as there (scripts/run_results.py): only if it trained its experiment's config
as configs/exp/<name>.yaml says now; the others are listed under "Not counted" with why.

How a claim is judged, for variant a against variant b with n_a, n_b seeds (metric as
reported, bpc or ppl; diff = mean_a - mean_b, negative = a is better):

    pooled std  s_p = sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2))
    t           = diff / (s_p * sqrt(1/n_a + 1/n_b))      (Student's two-sample t)

- "a beats b": holds if diff < 0 and t <= -2 (3 + 3 seeds: df 4, one-sided p ~ 0.06: a
  screen, not a proof); "not significant" if diff < 0 but |t| < 2; "reversed, not
  significant" if diff >= 0 and |t| < 2; "fails" if t >= 2.
- "a matches b": holds if |diff| <= 2 s_p or |diff| <= 1% of mean_b. The paper's claim is
  "matches or surpasses", so a better beyond that tolerance is "holds (better)"; worse
  beyond it "fails".
- Fewer than 2 seeds on a side: no std, so "beats" is "n/a (1 seed)" and "matches" uses
  only the 1% rule. A variant without runs: "missing".
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.paper_tables import configs_of, load_experiment  # noqa: E402
from scripts.run_files import real, run_roots  # noqa: E402
from scripts.run_results import (  # noqa: E402
    Skipped,
    by_experiment,
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

ROOT = Path(__file__).resolve().parent.parent
T_MIN = 2.0  # |t| needed for "beats"
MATCH_STDS = 2.0  # "matches": |diff| within this many pooled std ...
MATCH_REL = 0.01  # ... or within this fraction of the reference mean
# file-name data part -> column (the dataset config); variants in the paper's row order
DATASETS = {"enwik": "enwik_mini", "wiki": "wikitext_mini"}
COLUMNS = tuple(DATASETS.values())
VARIANTS = ("dense", "topk", "pkm_softmax", "pkm_relu", "moe", "moe_softmax_renorm",
            "moe_softmax", "moe_standard_init", "moe_no_reg", "switch", "sbase")


@dataclass(frozen=True)
class Claim:
    text: str
    kind: str  # "matches" | "beats"
    a: str  # variant (file-name suffix)
    b: str


CLAIMS = (
    Claim("σ-MoE matches parameter-equal dense (Tab. moe)", "matches", "moe", "dense"),
    Claim("σ-MoE beats Switch (Tab. ablation)", "beats", "moe", "switch"),
    Claim("σ-MoE beats S-BASE (Tab. ablation)", "beats", "moe", "sbase"),
    Claim("sigmoid beats softmax before top-k (Tab. ablation)", "beats", "moe", "moe_softmax"),
    Claim("sigmoid beats softmax after top-k (Tab. ablation)", "beats", "moe",
          "moe_softmax_renorm"),
    Claim("ReLU PKM beats softmax PKM (Tab. pkm)", "beats", "pkm_relu", "pkm_softmax"),
    Claim("top-k matches dense (Tab. topk)", "matches", "topk", "dense"),
    Claim("σ-MoE init beats standard init (Tab. ablation)", "beats", "moe", "moe_standard_init"),
    Claim("regularization helps: σ-MoE beats no reg (Tab. ablation)", "beats", "moe",
          "moe_no_reg"),
)


# -- statistics -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    diff: float  # mean_a - mean_b (negative: a is better)
    rel: float  # diff / |mean_b|
    pooled: float | None  # pooled sample std; None with fewer than 2 values on either side
    t: float | None  # diff / standard error of the difference; None without a pooled std


def compare(a: list[float], b: list[float]) -> Comparison:
    if not a or not b:
        raise ValueError("compare needs at least one value on each side")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    diff = ma - mb
    rel = diff / abs(mb) if mb else math.inf
    df = len(a) + len(b) - 2
    if len(a) < 2 or len(b) < 2:
        return Comparison(diff, rel, None, None)
    ss = (len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)
    pooled = math.sqrt(ss / df)
    se = pooled * math.sqrt(1 / len(a) + 1 / len(b))
    t = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return Comparison(diff, rel, pooled, t)


def verdict(kind: str, c: Comparison, t_min: float = T_MIN, match_stds: float = MATCH_STDS,
            match_rel: float = MATCH_REL) -> str:
    """The rule of the module docstring; lower metric = better."""
    if kind == "beats":
        if c.t is None:
            return "n/a (1 seed)"
        if c.t >= t_min:
            return "fails"
        if c.diff < 0:
            return "holds" if c.t <= -t_min else "not significant"
        return "reversed, not significant"
    if kind == "matches":
        tol = abs(c.rel) <= match_rel or (c.pooled is not None and abs(c.diff) <= match_stds
                                          * c.pooled)
        if tol:
            return "holds"
        return "holds (better)" if c.diff < 0 else "fails"
    raise ValueError(f"unknown claim kind {kind!r}: matches | beats")


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    column: str
    verdict: str
    comparison: Comparison | None  # None: a side has no runs


def check_claims(values: dict[tuple[str, str], list[float]], columns=COLUMNS,
                 claims=CLAIMS, **rule: float) -> list[ClaimResult]:
    """values: (variant, column) -> the metric of each seed."""
    out = []
    for claim in claims:
        for col in columns:
            a, b = values.get((claim.a, col)) or [], values.get((claim.b, col)) or []
            if not a or not b:
                out.append(ClaimResult(claim, col, "missing", None))
                continue
            c = compare(a, b)
            out.append(ClaimResult(claim, col, verdict(claim.kind, c, **rule), c))
    return out


# -- runs -------------------------------------------------------------------------------------
def exp_name(data: str, variant: str) -> str:
    return f"mini_{data}_{variant}"


def mini_rows(exp_dir: Path) -> dict[str, str]:
    """variant -> row label of its `paper:` entry (table `mini`) in configs/exp/; a file that
    does not parse is one line naming it, as in scripts/paper_tables.py (not a traceback)."""
    rows, configs = {}, configs_of(exp_dir)
    for path in sorted(exp_dir.glob("mini_*_*.yaml")):
        for entry in load_experiment(path, configs).entries:
            if entry.get("table") == "mini":
                rows.setdefault(path.stem.split("_", 2)[2], str(entry.get("row")))
    return rows


def tokens_per_s(run_dir: Path) -> float | None:
    """Median of the run's logged `train/tokens_per_s` (robust to a busy moment). A file that
    cannot be read (not UTF-8, a directory) only feeds the throughput table: a warning, and
    the run's tok/s is left out, rather than no report at all."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:  # a UnicodeDecodeError is a ValueError
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        print(f"warning: {path}: cannot be read ({why}); its run's tok/s is left out of the "
              f"throughput table", file=sys.stderr)
        return None
    vals = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and (v := real(row.get("train/tokens_per_s"))) is not None:
            vals.append(float(v))
    return statistics.median(vals) if vals else None


def _mean(xs: list[Any]) -> float | None:
    """Mean of the finite numbers among xs (a hand-edited "40s" or a missing value is left
    out); None when there is none."""
    xs = [x for x in map(real, xs) if x is not None]
    return statistics.fmean(xs) if xs else None


@dataclass
class Collected:
    values: dict[tuple[str, str], list[float]]
    metric: dict[str, str]  # column -> bpc | ppl
    params: dict[tuple[str, str], float]
    speed: dict[tuple[str, str], dict[str, float | None]]  # tok_s, train_s, peak_rss_mb
    skipped: list[Skipped]  # runs left out, and why (find_runs)
    seeds: dict[str, list[Any]]  # experiment -> the seeds it has
    code: list[str] = field(default_factory=list)  # code versions of the counted runs
    data: list[str] = field(default_factory=list)  # data versions, when they differ
    precision: list[str] = field(default_factory=list)  # precisions, when they differ
    overridden: list[str] = field(default_factory=list)  # runs counted of other settings
    marked: set[tuple[str, str]] = field(default_factory=set)  # cells holding such runs


def collect(roots: list[Path], exp_dir: Path, all_overrides: bool = False) -> Collected:
    runs, skipped = find_runs(roots, exp_dir, all_overrides)
    grouped, skipped = by_experiment(runs), skipped + superseded(runs)
    # the sweep's runs left out (a `+exp=mini_moe` run is no variant of it: not listed)
    names = {exp_name(data, variant) for data in DATASETS for variant in VARIANTS}
    mini = skipped_of(skipped, names)
    out = Collected({}, {}, {}, {}, mini, {})
    counted = []
    for data, col in DATASETS.items():
        for variant in VARIANTS:
            found = grouped.get(exp_name(data, variant), [])
            out.seeds[exp_name(data, variant)] = [r.seed for r in found]
            counted += found
            if not found:
                continue
            key = (variant, col)
            out.metric[col] = found[0].metric
            out.values[key] = [r.test[r.metric] for r in found]
            if any(r.overrides for r in found):
                out.marked.add(key)
            counts = [r.n_params for r in found if r.n_params]
            if counts:
                out.params[key] = statistics.fmean(counts)
            dirs = [Path(r.source) for r in found if not r.source.startswith("wandb:")]
            out.speed[key] = {"tok_s": _mean([tokens_per_s(d) for d in dirs]),
                              "train_s": _mean([r.results.get("train_seconds") for r in found]),
                              "peak_rss_mb": _mean([r.results.get("peak_rss_mb") for r in found])}
    out.code, out.data = code_versions(counted), data_versions(counted)
    out.precision = precision_versions(counted)
    out.overridden = overridden_runs(counted)
    return out


# -- rendering --------------------------------------------------------------------------------
def render_results(c: Collected, rows: dict[str, str]) -> str:
    cols = list(COLUMNS)
    head = ["", *(f"{col} ({c.metric.get(col, 'bpc' if 'enwik' in col else 'ppl')})"
                  for col in cols)]
    lines = ["### Mini: the paper's variants at laptop scale (test, fixed subset; lower is "
             "better)", "", "| " + " | ".join(head) + " |", "|:--|" + "--:|" * len(cols)]
    for variant in VARIANTS:
        cells = []
        for col in DATASETS.values():
            vals = c.values.get((variant, col))
            if not vals:
                cells.append("—")
                continue
            text = ours_text(vals, c.metric[col], overridden=(variant, col) in c.marked)
            if (variant, col) in c.params:
                text += f" · {c.params[(variant, col)] / 1e6:.3g}M"
            cells.append(text)
        lines.append(f"| {rows.get(variant, variant)} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: mean ± sample std over seeds (n seeds) · parameter count."]
    lines += markdown_notes("Missing runs:", missing_commands("mini", c.seeds, c.skipped),
                            [str(s) for s in c.skipped], c.code, c.data, c.overridden,
                            c.precision)
    return "\n".join(lines) + "\n"


def render_claims(results: list[ClaimResult], metric: dict[str, str]) -> str:
    lines = ["### Mini: do the paper's claims hold at this scale?", "",
             "| claim | data | verdict | Δ (a − b) | Δ rel. | pooled std | t |",
             "|:--|:--|:--|--:|--:|--:|--:|"]
    for r in results:
        if r.comparison is None:
            lines.append(f"| {r.claim.text} | {r.column} | missing | | | | |")
            continue
        c, m = r.comparison, metric.get(r.column, "bpc")
        pooled = "—" if c.pooled is None else fmt_metric(c.pooled, m)
        t = "—" if c.t is None else f"{c.t:+.2f}"
        lines.append(f"| {r.claim.text} | {r.column} | {r.verdict} | "
                     f"{'+' if c.diff >= 0 else ''}{fmt_metric(c.diff, m)} | {100 * c.rel:+.1f}% | "
                     f"{pooled} | {t} |")
    lines += ["", f"a beats b: mean_a < mean_b and t <= -{T_MIN:g} (Student's t, pooled "
              f"std); a matches b: |Δ| <= {MATCH_STDS:g} pooled std or <= {100 * MATCH_REL:g}% "
              "of mean_b (better beyond that: \"holds (better)\"). Rules: "
              "scripts/mini_claims.py."]
    return "\n".join(lines) + "\n"


def render_throughput(c: Collected, rows: dict[str, str]) -> str:
    cols = list(COLUMNS)
    head = ["", *(f"{col} {h}" for col in cols
                  for h in ("tok/s", "× dense", "train s", "peak RSS MB"))]
    lines = ["### Mini: CPU training throughput and peak memory", "",
             "| " + " | ".join(head) + " |", "|:--|" + "--:|" * (len(head) - 1)]
    no_rss = True
    for variant in VARIANTS:
        cells = []
        for col in cols:
            s = c.speed.get((variant, col)) or {}
            dense = (c.speed.get(("dense", col)) or {}).get("tok_s")
            tok = s.get("tok_s")
            cells += ["—" if tok is None else f"{tok:,.0f}",
                      "—" if tok is None or not dense else f"{tok / dense:.2f}",
                      "—" if s.get("train_s") is None else f"{s['train_s']:.1f}",
                      "—" if s.get("peak_rss_mb") is None else f"{s['peak_rss_mb']:.0f}"]
            no_rss = no_rss and s.get("peak_rss_mb") is None
        lines.append(f"| {rows.get(variant, variant)} | " + " | ".join(cells) + " |")
    lines += ["", "tok/s: median of the run's logged `train/tokens_per_s`, mean over seeds; "
              "train s: results.json `train_seconds`; a shared machine makes both noisy."]
    if no_rss and c.speed:  # runs counted, none recording it (made before it was recorded)
        lines.append("peak RSS: not in results.json (needs `peak_rss_mb`, "
                     "sigma_moe/tasks/lm_run.py).")
    return "\n".join(lines) + "\n"


def report(exp_dir: Path, roots: list[Path], all_overrides: bool = False) -> str:
    rows = mini_rows(exp_dir)  # a broken exp file stops it before the runs are read
    c = collect(roots, exp_dir, all_overrides)
    return "\n".join([render_results(c, rows), render_claims(check_claims(c.values), c.metric),
                      render_throughput(c, rows)])


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, nargs="+",
                    help="root directories searched recursively for results.json "
                         "(default: runs/sweeps/mini)")
    ap.add_argument("--exp-dir", type=Path, default=ROOT / "configs" / "exp")
    ap.add_argument("--all-overrides", action="store_true",
                    help="also count runs whose directory shows overrides besides "
                         "trainer.seed, for seeds no run of the experiment's own config has "
                         "(their cells are marked †)")
    args = ap.parse_args(argv)
    if not args.exp_dir.is_dir():  # else every variant would print as missing
        ap.error(f"--exp-dir {args.exp_dir} is not a directory")
    text = report(args.exp_dir, run_roots(args.runs, Path("runs/sweeps/mini")),
                  args.all_overrides)
    print_out(text)
    return text


if __name__ == "__main__":
    main()
