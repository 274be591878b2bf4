"""Routing and sparsity figures of trained runs (paper Fig. 1 `counts_small` and App. Figs.
`counts_big` / `counts_enwik8`, Figs. `moe_counts_example` / `moe_counts_all`, Fig.
`coocurence`).

    python scripts/analyze.py runs/wt103_small_dense --split valid,test --max-segments 0  # Fig. 1
    python scripts/analyze.py runs/wt103_star_moe runs/wt103_star_switch --layer 6
    python scripts/analyze.py runs/x/checkpoint_00100000.pt --split test --max-segments 50

For each run (a run directory: its config.yaml and newest valid checkpoint; or one
checkpoint file inside a run directory) the model and data are rebuilt exactly as the run
built them, one evaluation pass with routing statistics runs (`LMTask.evaluate(...,
stats=True)`, the numbers of sigma_moe/models/ffn/base.py `RoutingStats.summary()`), and the figures
are drawn, each as PNG and PDF, beside `analysis.json` with every number they show (by
default in `<first run>/analysis/<split>/`, `valid+test` when pooled, so analyses of
different splits do not overwrite each other; figures of an earlier analysis there that
this one does not redraw are removed):

* active_channels: non-zero hidden channels of u per layer, mean ± std over tokens
  (dense and top-k models; paper Fig. 1).
* expert_usage: share of the selection weight per expert, experts sorted by popularity,
  one panel per layer, runs overlaid (paper Figs. moe_counts_*); with `--layer L` also
  expert_usage_layer<L> for that layer alone.
* cooccurrence_layer<L>: row e is the distribution of the experts chosen together with e
  (P(f chosen | e chosen) over tokens, diagonal zeroed, scaled to sum 1; paper Fig.
  coocurence); every layer, or only `--layer L`. None for a K=1 run (Switch): no expert
  is chosen with another (a note says so).
`--layer` asks for the expert figures: refused unless a run has experts (sigma_moe, switch,
sbase); the other runs are left out of them.
`--split valid,test` pools the splits (paper Fig. 1: "all tokens of the test and validation
set"): one evaluation each, their routing statistics summed.
Layers are numbered from 1 (the paper's "Layer 5" is most likely 0-based, our 6:
docs/reproducing.md "The figures"). Default `--max-segments`: the run's own
task.final_segments (0 = the whole split, as the paper), so the numbers equal the routing
statistics in its results.json. Every argument, config.yaml, checkpoint, dataset and the
output folder is checked before the first evaluation; a bad one is one `error:` line.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def resolve_device(name: str):
    """--device, checked before anything is loaded (as sigma_moe.framework.trainer checks
    trainer.device)."""
    from sigma_moe.framework.runtime import resolve_device as resolve

    return resolve(name, f"--device {name}")


def analyze(run, label: str, dev, splits: tuple[str, ...] = ("valid",),
            max_segments: int | None = None) -> dict[str, Any]:
    """One evaluation pass per split with routing statistics, pooled over the splits (the
    paper's Fig. 1 pools valid and test); the numbers of every figure. `run`: a loaded
    `Trained` (sigma_moe/tasks/trained.py), its model moved to `dev` for the passes and
    back to the CPU after: one model on the device at a time."""
    import torch

    from sigma_moe.tasks.lm import metrics

    run.to(dev)
    segments = run.spec.task_cfg.final_segments if max_segments is None else max_segments
    per_split = {split: run.evaluate(split, segments, stats=True, progress=True,
                                     add_stats=i > 0)  # a whole split: minutes
                 for i, split in enumerate(splits)}
    run.to(torch.device("cpu"))
    tokens = sum(r["tokens"] for r in per_split.values())
    loss = sum(r["loss"] * r["tokens"] for r in per_split.values()) / max(tokens, 1)
    metric = run.data.metric
    return {"label": label, "run_dir": str(run.spec.run_dir),
            "step": run.step, "ffn": run.model.cfg.ffn_kind, "split": "+".join(splits),
            "max_segments": segments, "tokens": tokens, "metric": metric,
            metric: metrics(metric, loss)[metric],
            **({"per_split": {s: {metric: r[metric], "tokens": r["tokens"]}
                              for s, r in per_split.items()}} if len(splits) > 1 else {}),
            "layers": summarize_layers(per_split[splits[-1]]["routing"])}


def summarize_layers(routing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RoutingStats summaries (one per layer) + the popularity order the figures use."""
    layers = []
    for i, summary in enumerate(routing):
        layer = {"layer": i + 1, **summary}
        if "cooccurrence" in summary:
            layer["cooccurrence_distribution"] = cooccurrence_distribution(
                summary["cooccurrence"]).tolist()
        if "expert_share" in summary:
            share = np.asarray(summary["expert_share"], dtype=float)
            order = np.argsort(-share, kind="stable")
            layer["expert_order"] = order.tolist()
            layer["expert_share_sorted"] = share[order].tolist()
        layers.append(layer)
    return layers


# -- figures ----------------------------------------------------------------------------------
def save(fig, out: Path, stem: str) -> list[Path]:
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def plot_active(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    runs = [r for r in runs if any("active_mean" in la for la in r["layers"])]
    if not runs:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(runs)
    for j, r in enumerate(runs):
        layers = [la for la in r["layers"] if "active_mean" in la]
        x = np.array([la["layer"] for la in layers]) + (j - (len(runs) - 1) / 2) * width
        d_ff = int(layers[0]["width"])
        ax.bar(x, [la["active_mean"] for la in layers], width,
               yerr=[la["active_std"] for la in layers], capsize=3,
               label=f"{r['label']} (of {d_ff})")
    ax.set_xlabel("layer")
    ax.set_ylabel("active channels in u")
    ax.set_xticks(sorted({la["layer"] for r in runs for la in r["layers"]}))
    ax.legend(fontsize=8)
    return save(fig, out, "active_channels")


def _usage_panel(ax, runs: list[dict[str, Any]], layer: int) -> None:
    shown = [r for r in runs if "expert_share_sorted" in r["layers"][layer - 1]]
    for r in shown:
        share = np.asarray(r["layers"][layer - 1]["expert_share_sorted"])
        ax.plot(np.arange(1, len(share) + 1), share, label=r["label"])
    if shown:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Layer {layer}", fontsize=9)


def plot_usage(runs: list[dict[str, Any]], out: Path, layer: int | None = None) -> list[Path]:
    runs = [r for r in runs if any("expert_share" in la for la in r["layers"])]
    if not runs:
        return []
    n = max(len(r["layers"]) for r in runs)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i < n:
            _usage_panel(ax, [r for r in runs if i < len(r["layers"])], i + 1)
        else:
            ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.supxlabel("expert (sorted by popularity)")
    fig.supylabel("share of selection weight")
    paths = save(fig, out, "expert_usage")
    if layer is not None:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        _usage_panel(ax, runs, layer)
        ax.set_xlabel("expert (sorted by popularity)")
        ax.set_ylabel("share of selection weight")
        ax.legend(fontsize=8)
        paths += save(fig, out, f"expert_usage_layer{layer}")
    return paths


def experts_per_token(cooc: list[list[float]]) -> int:
    """K, read off P(f chosen | e chosen): a used expert's row sums to K (itself, and the
    K-1 others of each of its tokens, a token's K experts being distinct); 0: none used."""
    return int(round(np.asarray(cooc, dtype=float).sum(1).max(initial=0.0)))


def cooccurrence_distribution(cooc: list[list[float]]) -> np.ndarray:
    """Row e: the distribution of the experts chosen together with e (paper Fig. coocurence,
    "each row shows the distribution"; the authors' plot_coocurence.py): P(f | e) with the
    diagonal zeroed, each row scaled to sum to 1 (P(f | e) sums to K-1 over f != e when a
    token's K experts are distinct). An expert never chosen with another (never chosen at
    all, or K = 1) has a row of zeros: analysis.json stays strict JSON, without NaN."""
    m = np.array(cooc, dtype=float)
    np.fill_diagonal(m, 0.0)
    total = m.sum(1, keepdims=True)
    return m / np.where(total > 0, total, 1.0)


def plot_cooccurrence(runs: list[dict[str, Any]], out: Path,
                      layer: int | None = None) -> list[Path]:
    paths: list[Path] = []
    for r in runs:
        suffix = "_" + re.sub(r"[^\w.#-]", "_", r["label"]) if len(runs) > 1 else ""
        layers = [la for la in r["layers"]
                  if "cooccurrence" in la and (layer is None or la["layer"] == layer)]
        if layers and all(experts_per_token(la["cooccurrence"]) == 1 for la in layers):
            # every row all zeros: an empty heatmap per layer would say nothing
            print(f"note: {r['label']}: K=1: no experts are used together; no co-occurrence "
                  f"figure", file=sys.stderr)
            continue
        for la in layers:
            fig, ax = plt.subplots(figsize=(4.5, 3.8))
            m = np.asarray(la["cooccurrence_distribution"], dtype=float)
            n = len(m)  # experts numbered from 1, as the paper's figure
            im = ax.imshow(m, cmap="Blues", extent=(0.5, n + 0.5, n + 0.5, 0.5))
            fig.colorbar(im, ax=ax, label="share of the row expert's partners")
            ax.set_xlabel("expert (used with)")
            ax.set_ylabel("expert (target)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{r['label']}: layer {la['layer']}", fontsize=9)
            paths += save(fig, out, f"cooccurrence_layer{la['layer']}{suffix}")
    return paths


# this script's figures, by name: an earlier analysis's are removed, nothing else
FIGURE_NAME = re.compile(
    r"(active_channels|expert_usage(_layer\d+)?|cooccurrence_layer\d+(_.+)?)\.(png|pdf)")


def remove_stale_figures(out: Path, written: list[Path]) -> None:
    """The figures of an earlier analysis in `out` that this one did not redraw (another
    --layer, other runs): left there, they would pass for those of the new analysis.json."""
    keep = {p.name for p in written}
    for p in out.iterdir():
        if FIGURE_NAME.fullmatch(p.name) and p.name not in keep and p.is_file():
            p.unlink()


def write_figures(runs: list[dict[str, Any]], out: Path,
                  layer: int | None = None) -> list[Path]:
    """Every figure that applies to these runs, and analysis.json with their numbers (written
    whole or not at all: an earlier analysis is not lost to a full disk); the figures of an
    earlier analysis in `out` that this one does not redraw are removed."""
    from sigma_moe.framework.checkpoint import atomic_write_bytes

    out.mkdir(parents=True, exist_ok=True)
    paths = plot_active(runs, out) + plot_usage(runs, out, layer)
    paths += plot_cooccurrence(runs, out, layer)
    remove_stale_figures(out, paths)
    text = json.dumps({"runs": runs}, indent=1) + "\n"
    atomic_write_bytes(out / "analysis.json", text.encode())
    return [*paths, out / "analysis.json"]


def check_writable(out: Path) -> None:
    """The output folder, created and probed before the evaluation: an --out that cannot be
    written failed only after it."""
    from sigma_moe.framework.config import ConfigError

    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise ConfigError(f"cannot write to {out} ({e.strerror or e}): choose another --out") \
            from None


def split_list(text: str) -> tuple[str, ...]:
    splits = tuple(text.split(","))
    if not splits or any(s not in ("train", "valid", "test") for s in splits) or \
            len(set(splits)) < len(splits):
        raise argparse.ArgumentTypeError(
            f"{text!r}: train, valid or test, or several without repeats (valid,test)")
    return splits


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", type=Path, nargs="+", metavar="CHECKPOINT_OR_RUN_DIR")
    ap.add_argument("--split", default="valid", type=split_list,
                    help="train, valid or test, or several pooled: valid,test (paper Fig. 1)")
    ap.add_argument("--out", type=Path, help="default: <first run dir>/analysis/<split> "
                                             "(valid+test when pooled)")
    ap.add_argument("--max-segments", type=int,
                    help="evaluate the first N segments (0 = whole split; default: the "
                         "run's task.final_segments)")
    ap.add_argument("--layer", type=int, help="co-occurrence (and one usage panel) of this "
                                              "layer only, numbered from 1 (MoE runs)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    if args.max_segments is not None and args.max_segments < 0:
        ap.error(f"--max-segments {args.max_segments}: must be >= 0 (0 = the whole split)")
    from sigma_moe.framework.checkpoint import CheckpointError
    from sigma_moe.framework.config import ConfigError, first_line, is_environment_error
    from sigma_moe.framework.data import DataError
    from sigma_moe.framework.registry import RegistryError

    try:
        return analyze_all(ap, args)
    except KeyboardInterrupt:  # nothing written yet, or the figures already are
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except (ConfigError, DataError, CheckpointError, RegistryError, OSError) as e:
        # an OSError is the user's to fix when it is a permission, a full disk or a missing
        # file; any other, like any other exception, is a bug: its traceback
        if isinstance(e, OSError) and not (is_environment_error(e)
                                           or isinstance(e, FileNotFoundError)):
            raise
        print(f"error: {first_line(e)}", file=sys.stderr)
        sys.exit(1)


def distinct_labels(names: list[str], run_dirs: list[Path]) -> list[str]:
    """Each run's label: its experiment's name, told apart from other runs of the same
    experiment by the overrides in which their directories differ (`mini_moe
    [trainer.seed=1]`), else (the same ones) by their position (`#1`). Before the first
    evaluation: it reads each run's overrides.yaml."""
    from scripts.run_results import run_overrides, split_overrides

    labels = list(names)
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        items = [split_overrides(run_overrides(Path(run_dirs[i]), name)) for i in group]
        common = set.intersection(*map(set, items))
        for i, its in zip(group, items):
            if own := [it for it in its if it not in common]:
                labels[i] += f" [{','.join(own)}]"
    return [f"{label}#{i}" if labels.count(label) > 1 else label
            for i, label in enumerate(labels)]


def has_experts(ffn_kind: str) -> bool:
    """Whether the ffn variant chooses experts (`ExpertsFFN` of sigma_moe/models/ffn/experts.py:
    sigma_moe, switch, sbase): only those record the routing the expert figures draw."""
    from sigma_moe.models.ffn import FFNS
    from sigma_moe.models.ffn.experts import ExpertsFFN

    return issubclass(FFNS.get(ffn_kind), ExpertsFFN)


def check_expert_layer(ap: argparse.ArgumentParser, specs: list, layer: int) -> None:
    """--layer asks for the expert usage and co-occurrence figures: a run without experts
    has none (a dense run's analysis wrote neither, silently), so it is left out of them,
    and with no MoE run at all nothing is evaluated. `specs`: the runs' `RunSpec`s."""
    from sigma_moe.framework.config import ConfigError
    from sigma_moe.models.ffn import FFNS

    moe = [s for s in specs if has_experts(s.model_cfg.ffn_kind)]
    if not moe:
        kinds = ", ".join(k for k in FFNS.names() if has_experts(k))
        given = ", ".join(sorted({s.model_cfg.ffn_kind for s in specs}))
        raise ConfigError(f"--layer {layer}: the expert usage and co-occurrence figures need "
                          f"a MoE run (ffn {kinds}), and no run given is one (ffn {given}); "
                          f"without --layer: the active channels of Fig. 1")
    n_layers = min(s.model_cfg.n_layers for s in moe)
    if not 1 <= layer <= n_layers:
        ap.error(f"--layer {layer}: the runs have layers 1..{n_layers}")
    for s in specs:
        if not has_experts(s.model_cfg.ffn_kind):
            print(f"note: {s.path} (ffn {s.model_cfg.ffn_kind}) has no experts: left "
                  f"out of the expert usage and co-occurrence figures", file=sys.stderr)


def analyze_all(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[Path]:
    """Every check first (the arguments, each run's config, checkpoint and data, the output
    folder), then the evaluations, which can take hours on a whole split."""
    import torch

    from sigma_moe.tasks.trained import load, read_run

    dev = resolve_device(args.device)
    specs = [read_run(p, dev) for p in args.paths]
    # reads each run's overrides.yaml: not after hours of evaluation
    labels = distinct_labels([s.name for s in specs], [s.run_dir for s in specs])
    if args.layer is not None:
        check_expert_layer(ap, specs, args.layer)
    # splits side by side
    out = args.out or specs[0].run_dir / "analysis" / "+".join(args.split)
    check_writable(out)
    datasets: dict[str, Any] = {}  # seeds of one experiment: their data loaded once
    loaded = []
    for s in specs:  # on the CPU until evaluated: one model on the device at a time
        key = json.dumps(s.cfg["dataset"], sort_keys=True)
        loaded.append(load(s, torch.device("cpu"), datasets.get(key)))
        datasets[key] = loaded[-1].data
    runs = [analyze(r, label, dev, args.split, args.max_segments)
            for r, label in zip(loaded, labels)]
    paths = write_figures(runs, out, args.layer)
    for r in runs:
        print(f"{r['label']}: {r['split']} {r['metric']} {r[r['metric']]:.4f} "
              f"({r['tokens']} tokens, step {r['step']})")
    print(f"wrote {len(paths)} files to {out}")
    return paths


if __name__ == "__main__":
    main()
