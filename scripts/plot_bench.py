"""Kernel benchmark figures (paper Figs. `benchmark_es128`, `benchmark_32exp`, `benchmark`,
`benchmark_es`, `benchmark_dmodel`; App. "More on Resource Efficiency").

    python scripts/bench_moe.py                     # writes benchmarks/moe_<device>.json
    python scripts/plot_bench.py benchmarks/moe_<device>.json [--out DIR]

Time and memory of a forward-backward pass of one MLP / MoE layer against d_model, N_E or
G: full lines are time (left axis, ms), dashed lines memory (right axis, MB), one colour per
variant (the dense MLP and each MoE backend), as in the paper; dotted lines, where the JSON
has them (bench_moe.py on a GPU), the time of CUDA-graph replays: the GPU time alone, without
the host's launch costs that flatten the eager curves of the MoE layers. One figure per
sweep, PNG and PDF: `bench_<sweep>.{png,pdf}` (default: beside the JSON file).

Input, either of:
* the JSON of scripts/bench_moe.py: `{"device", "dtype", "sweeps": {sweep: [{"d_model",
  "n_experts", "expert_size", "d_ff", "tokens", "k", "results": {variant: {"ms",
  "peak_mb" (None on CPU), "saved_mb", ...}}}]}}`; memory is the GPU peak, or on a CPU the
  activations saved for the backward;
* a flat list of records, `{"meta": {...}, "results": [{"sweep", "x", "variant", "ms",
  "peak_mb"}, ...]}` (or the bare list); other keys are ignored.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# bench_moe.py's sweeps -> (x key, the paper's figure, how d_ff, N_E and G follow from x)
SWEEPS = {
    "dmodel_g128": ("d_model", "benchmark_es128", "d_ff=4 d_model, N_E=d_ff/G"),
    "dmodel_ne32": ("d_model", "benchmark_32exp", "d_ff=4 d_model, G=d_ff/N_E"),
    "n_experts": ("n_experts", "benchmark", "d_ff=G N_E"),
    "expert_size": ("expert_size", "benchmark_es", "d_ff=G N_E"),
    "dmodel_f4096": ("d_model", "benchmark_dmodel", ""),
}
SHAPE = {"d_model": "d_model", "n_experts": "N_E", "expert_size": "G", "d_ff": "d_ff"}
AXIS = {"d_model": "$d_{model}$", "n_experts": "$N_E$", "expert_size": "$G$ (expert size)"}
# sweep -> variant -> (x, ms, MB, CUDA-graph ms or NaN)
Series = dict[str, dict[str, tuple[list[float], list[float], list[float], list[float]]]]


def records_of(data: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, flat records) of either input format."""
    if isinstance(data, dict) and isinstance(data.get("sweeps"), dict):  # bench_moe.py
        meta = {k: data[k] for k in ("device", "dtype") if k in data}
        records = []
        for sweep, cases in data["sweeps"].items():
            xkey = SWEEPS.get(sweep, ("d_model",))[0]
            for case in cases:
                for variant, r in case["results"].items():
                    on_cpu = r.get("peak_mb") is None
                    records.append({"sweep": sweep, "x": case[xkey], "variant": variant,
                                    "ms": r["ms"], "graph_ms": r.get("graph_ms"),
                                    "mem_kind": "saved" if on_cpu else "peak",
                                    "peak_mb": r["saved_mb"] if on_cpu else r["peak_mb"],
                                    "shape": {SHAPE[k]: case[k] for k in SHAPE}})
                meta.update(tokens=case.get("tokens"), k=case.get("k"))
        return meta, records
    records = data if isinstance(data, list) else (data or {}).get("results")
    if not isinstance(records, list):
        raise SystemExit("error: expected bench_moe.py's JSON ('sweeps') or a list of "
                         "records under 'results'")
    need = {"sweep", "x", "variant", "ms", "peak_mb"}
    for i, rec in enumerate(records):
        if not need <= set(rec):
            raise SystemExit(f"error: record {i} lacks {sorted(need - set(rec))}")
    return ({} if isinstance(data, list) else data.get("meta") or {}), records


def series(records: list[dict[str, Any]]) -> Series:
    """sweep -> variant -> (x, ms, MB, CUDA-graph ms or NaN), sorted by x."""
    out: dict[str, dict[str, list[tuple[float, float, float, float]]]] = {}
    for rec in records:
        graph = rec.get("graph_ms")
        out.setdefault(str(rec["sweep"]), {}).setdefault(str(rec["variant"]), []).append(
            (float(rec["x"]), float(rec["ms"]), float(rec["peak_mb"]),
             float("nan") if graph is None else float(graph)))
    return {sweep: {v: tuple(map(list, zip(*sorted(pts)))) for v, pts in variants.items()}
            for sweep, variants in out.items()}


def caption(sweep: str, records: list[dict[str, Any]]) -> str:
    """The paper's figure and the shape of this sweep's cases: the sizes that stay fixed
    (as measured: the CPU sweeps are smaller than the paper's), then how the others follow."""
    if sweep not in SWEEPS:
        return sweep
    _, figure, relation = SWEEPS[sweep]
    shapes = [r["shape"] for r in records if r["sweep"] == sweep and "shape" in r]
    fixed = [f"{k}={shapes[0][k]}" for k in SHAPE.values()
             if shapes and all(s[k] == shapes[0][k] for s in shapes)]
    return f"Fig. {figure}: " + ", ".join(filter(None, [*fixed, relation]))


def plot(sweep: str, variants, meta: dict[str, Any], out: Path, written: list[Path],
         mem: str = "peak", title: str = "") -> None:
    """One figure (PNG and PDF) of a sweep, its files added to `written` before they are
    begun (so a failed write can remove a half-written one); `title`: its caption
    (`caption`)."""
    xkey = SWEEPS.get(sweep, (sweep,))[0]
    fig, ax_t = plt.subplots(figsize=(5.5, 3.8))
    ax_m = ax_t.twinx()
    graphs = False
    for i, (variant, (x, ms, mb, graph_ms)) in enumerate(variants.items()):
        ax_t.plot(x, ms, "-o", color=f"C{i}", markersize=3, label=variant)
        ax_m.plot(x, mb, "--", color=f"C{i}")
        if any(g == g for g in graph_ms):  # not all NaN
            ax_t.plot(x, graph_ms, ":s", color=f"C{i}", markersize=3)
            graphs = True
    ax_t.set_xlabel(AXIS.get(xkey, xkey))
    ax_t.set_ylabel("time (ms), full lines" + ("; CUDA graph, dotted" if graphs else ""))
    ax_m.set_ylabel(("saved activations" if mem == "saved" else "peak memory")
                    + " (MB), dashed lines")
    ax_t.set_ylim(bottom=0)
    ax_m.set_ylim(bottom=0)
    ax_t.legend(fontsize=8, loc="best")
    info = ", ".join(f"{k}={v}" for k, v in meta.items()
                     if v is not None and isinstance(v, (str, int, float)))
    ax_t.set_title("\n".join(filter(None, [title, info])), fontsize=8)
    fig.tight_layout()
    stem = "bench_" + re.sub(r"[^\w.=+-]", "_", sweep)
    try:
        for p in (out / f"{stem}.png", out / f"{stem}.pdf"):
            written.append(p)
            fig.savefig(p, dpi=150)
    finally:
        plt.close(fig)


def write_figures(by_sweep: Series, records: list[dict[str, Any]], meta: dict[str, Any],
                  out: Path) -> list[Path]:
    """Every sweep's figure in `out`, or none: a file that cannot be written (`out` a file,
    a directory that cannot be made, a full disk) is one error line, and the figures written
    before it are removed again rather than left beside a half-written one."""
    mem = {str(r["sweep"]): r.get("mem_kind", "peak") for r in records}
    written: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sweep, variants in by_sweep.items():
            plot(sweep, variants, meta, out, written, mem[sweep], caption(sweep, records))
    except OSError as e:
        for p in written:
            if p.is_file():
                p.unlink()
        why = "it is a file" if out.is_file() else e.strerror or e
        raise SystemExit(f"error: cannot write to {e.filename or out}: {why}; give --out a "
                         "directory that can be written to") from None
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--out", type=Path, help="default: the JSON file's directory")
    args = ap.parse_args(argv)
    try:
        data = json.loads(args.bench_json.read_text())
    except OSError as e:
        raise SystemExit(f"error: {args.bench_json}: {e.strerror}") from None
    except ValueError as e:  # not JSON (a binary file too: UnicodeDecodeError)
        raise SystemExit(f"error: {args.bench_json} is not JSON: {e}") from None
    try:
        meta, records = records_of(data)
        by_sweep = series(records)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a key or value is off
        raise SystemExit(f"error: {args.bench_json} is neither bench_moe.py's JSON nor a list "
                         f"of records: {type(e).__name__} {e}") from None
    if not records:  # not "wrote 0 files": the benchmark wrote nothing, or this is not its file
        raise SystemExit(f"error: {args.bench_json} holds no benchmark results; give the "
                         "JSON that scripts/bench_moe.py wrote after its sweeps ran")
    out = args.out or args.bench_json.parent
    paths = write_figures(by_sweep, records, meta, out)
    print(f"wrote {len(paths)} files to {out}")
    return paths


if __name__ == "__main__":
    main()
