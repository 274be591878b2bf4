"""The slot-ordered scatter alone (paper Eq. `moe_out`'s sum over the K experts of a token):
K launches (kernels/triton_launch.py `scatter_mm`) against one wave launch
(kernels/triton_wave.py) for several numbers of token blocks.

    python scripts/bench_scatter.py                      # GPU: issue 4's target case, bf16
    python scripts/bench_scatter.py --blocks 4 8 16 --tokens 65536

Both scatters of the fused layer: `fwd` (y = sum_k gate * h W2) and `dx` (sum_k dz W1^T,
W1 read transposed). Per variant: eager and CUDA-graph milliseconds (median of interleaved
rounds after warm-up), the graph time over the slot launches' in the same round, the
DRAM-time floor of the slot launches' traffic (A once, Y written K times and read K - 1)
and of the traffic an L2 that kept Y would leave (A once, Y written once), and the largest
difference from the slot launches' result (relative to its largest entry; on CUDA the
larger of an eager call's and a CUDA-graph replay's), checked for both scatters before any
timing: a line `check fwd: ok` (or FAIL) per scatter, and exit status 1 after the JSON if a
wave variant is off by more than the dtype's tolerance (its tiles may take other block
sizes, so the bits may differ; a missed wait would leave a slot out: an O(1) error).
torch + triton only (no Hydra). JSON to runs/bench/scatter_<device>.json (or --out).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.testing import TOLERANCE, rel_err  # noqa: E402
from scripts.bench_common import (  # noqa: E402
    DTYPES,
    ROOT,
    add_case_args,
    case_record,
    check_k,
    cuda_graph,
    device_slug,
    graph_times,
    paired_ratio,
    positive,
    precompile,
    time_all,
    triton_device,
    write_json,
)
from scripts.bench_moe import GPU_TARGET  # noqa: E402
from scripts.bench_roofline import datasheet_peaks  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_case_args(p, GPU_TARGET)
    p.add_argument("--blocks", type=positive, nargs="+",
                   help="token blocks of the wave variants (default: 1, 2, 4, 16 and the "
                        "launcher's own choice)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=positive, default=20)
    p.add_argument("--out", type=Path, help="JSON path (default runs/bench/scatter_<gpu>.json)")
    args = p.parse_args(argv)
    check_k(p, args.k, args.n_experts)
    return args


def inputs(args, device):
    """Uniform routing (K distinct experts a token) and the two scatters' operands."""
    from kernels.routing import make_routing

    T, D, E, G, K = args.tokens, args.d_model, args.n_experts, args.expert_size, args.k
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device).manual_seed(0)
    expert_TK = torch.rand(T, E, generator=gen, device=device).argsort(-1)[:, :K]
    routing = make_routing(expert_TK, E)
    randn = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
    gate = torch.rand(T * K, generator=gen, device=device).to(dtype)
    w1_EDG, w2_EGD = randn(E, D, G) * D ** -0.5, randn(E, G, D) * G ** -0.5
    kinds = {"fwd": (randn(T * K, G), w2_EGD, {"scale": gate, "order_R": routing.order_R}),
             "dx": (randn(T * K, G), w1_EDG.transpose(1, 2), {})}
    return routing, kinds


def variants(args, routing, a, w, kw) -> dict:
    from kernels.triton_launch import scatter_mm
    from kernels.triton_wave import scatter_mm_wave, wave_blocks, wave_problem

    T, E, K = args.tokens, args.n_experts, args.k
    fns = {"slots": lambda: scatter_mm(a, w, routing.tok_R, routing.off_S, T, **kw)}
    own = wave_blocks(T, E, K, w.shape[2], a.element_size())
    for b in sorted(set(args.blocks or [1, 2, 4, 16, own])):
        if problem := wave_problem(E, K, b):
            print(f"skip wave B={b}: {problem}")
            continue
        name = f"wave B={b}" + (" (default)" if b == own else "")
        fns[name] = (lambda b=b: scatter_mm_wave(a, w, routing.tok_R, routing.off_S, T,
                                                 n_blocks=b, **kw))
    return fns


def differences(fns: dict, cuda: bool) -> dict[str, list[float]]:
    """Each variant's largest difference from the slot launches' result, relative to its
    largest entry: of an eager call, and on CUDA of a CUDA-graph replay too (what
    bench_moe.py and profile_moe.py time; the replay's output starts as NaN, so a tile it
    never wrote shows)."""
    want = fns["slots"]()
    out = {}
    for name, fn in fns.items():
        out[name] = [rel_err(fn(), want)]
        if cuda:
            box = {}
            graph = cuda_graph(lambda fn=fn, box=box: box.__setitem__("y", fn()))
            box["y"].fill_(float("nan"))
            graph.replay()
            out[name].append(rel_err(box["y"], want))
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, name = triton_device("bench_scatter.py")
    cuda = device == "cuda"
    routing, kinds = inputs(args, device)
    T, N, R, G = args.tokens, args.d_model, args.tokens * args.k, args.expert_size
    elem = DTYPES[args.dtype].itemsize
    bytes_slots = elem * (R * G + (2 * args.k - 1) * T * N)
    bytes_l2 = elem * (R * G + T * N)
    bw = datasheet_peaks(name, DTYPES[args.dtype])[1]
    out = {**case_record(name, args), "bytes_slots": bytes_slots, "bytes_l2": bytes_l2,
           "peak_bytes_s": bw, "results": []}
    floor = (f"DRAM floor at {bw / 1e12:.1f} TB/s: slots {bytes_slots / bw * 1e3:.3f} ms, "
             f"Y kept in L2 {bytes_l2 / bw * 1e3:.3f} ms") if bw else "no datasheet bandwidth"
    print(f"{name}, {args.dtype}, T={T} N={N} E={args.n_experts} G={G} K={args.k}; {floor}")
    # both scatters checked before any timing: scripts/gpu_check.sh goes on with the wave
    # layer only after these lines
    failed, checked = False, {}
    fns_by_kind = {kind: variants(args, routing, a, w, kw) for kind, (a, w, kw) in kinds.items()}
    precompile(*(fn for fns in fns_by_kind.values() for fn in fns.values()))
    for kind, fns in fns_by_kind.items():
        diffs = differences(fns, cuda)
        tol = TOLERANCE[DTYPES[args.dtype]]
        bad = {k: d for k, d in diffs.items() if not max(d) <= tol}  # NaN fails
        failed |= bool(bad)
        print(f"check {kind}: {'FAIL ' + str(bad) if bad else 'ok'} (largest difference from "
              f"the slot launches {max(max(d) for d in diffs.values()):.1e}"
              f"{', eager and CUDA-graph replay' if cuda else ''})")
        checked[kind] = fns, diffs
    for kind, (fns, diffs) in checked.items():
        print(f"{'scatter':6} {'variant':20} {'ms':>8} {'graph ms':>9} {'x slots':>8} "
              f"{'rel diff':>9}")
        eager = time_all(fns, device, args.warmup, args.reps)
        graph = graph_times(fns, 1, args.reps) if cuda else None
        for k in fns:
            row = {"kind": kind, "variant": k, "ms_all": eager[k],
                   "ms": statistics.median(eager[k]), "rel_diff": max(diffs[k])}
            if graph:
                row["graph_ms_all"] = graph[k]
                row["graph_ms"] = statistics.median(graph[k])
                row["graph_x_slots"], row["graph_x_slots_quartiles"] = paired_ratio(
                    graph[k], graph["slots"])
            out["results"].append(row)
            g = (f"{row['graph_ms']:9.3f} {row['graph_x_slots']:8.3f}" if graph
                 else f"{'-':>9} {'-':>8}")
            print(f"{kind:6} {k:20} {row['ms']:8.3f} {g} {row['rel_diff']:9.2e}")
    write_json(args.out or ROOT / "runs" / "bench" / f"scatter_{device_slug(name)}.json", out)
    if failed:
        sys.exit("error: a wave variant disagrees with the per-slot launches (check lines)")
    return out


if __name__ == "__main__":
    main()
