"""Where the time of one MoE layer's forward+backward goes: GPU time per kernel.

The layer of scripts/bench_moe.py (sigma-MoE selection + `kernels.moe_mlp`, paper Eq.
`moe_out`) at one shape, run under torch.profiler after warm-up; per backend, a table of
the kernels (calls and microseconds per forward+backward, share of the GPU time), the
wall time of the eager call, the CPU time to issue it and the time of a CUDA-graph replay
(where the eager layer waits on Python launches rather than the GPU, the first two are
close and the third is far lower), and the block sizes the Triton autotuner chose. This
says which kernel (or the host) to work on; bench_moe.py says whether the layer meets its
targets.

    python scripts/profile_moe.py                       # issue 4's target case, bf16
    python scripts/profile_moe.py --d-model 512 --backends triton grouped_mm
    python scripts/profile_moe.py --chunks 2 4          # + the fused layer in token chunks

Needs torch (+ triton) and a CUDA device; no Hydra. JSON to runs/bench/ (or --out).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_common import (  # noqa: E402
    DTYPES,
    ROOT,
    add_case_args,
    case_record,
    check_k,
    device_slug,
    graph_times,
    kernel_table,
    positive,
    precompile,
    sync,
    write_json,
)
from scripts.bench_moe import (  # noqa: E402
    BACKENDS,
    GPU_TARGET,
    graphable,
    make_layers,
)


def host_and_graph_ms(layer_name: str, fn, reps: int) -> dict[str, float | None]:
    """Three times of one forward+backward: `wall_ms` (CUDA events around the eager call),
    `host_ms` (the CPU time to issue it, GPU kept busy; when it is near wall_ms the eager
    layer waits on Python, not on the GPU) and `graph_ms` (a CUDA graph replay of it: the
    GPU time alone, median of `reps` replays; None for the layers that sync with the host:
    bench_moe.graphable)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync("cuda")
    start.record()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps * 1e3
    end.record()
    end.synchronize()
    out = {"wall_ms": start.elapsed_time(end) / reps, "host_ms": host, "graph_ms": None}
    if graphable(layer_name):
        out["graph_ms"] = statistics.median(graph_times({layer_name: fn}, 1, reps)[layer_name])
    return out


def autotuned() -> dict[str, dict[str, str]]:
    """The block sizes each Triton autotuner chose, by kernel and key (shapes, dtypes,
    variant)."""
    try:
        from sigma_moe.kernels.triton_launch import TUNED
    except ImportError:
        return {}
    return {name: {str(k): str(v) for k, v in getattr(tuned.launcher, "cache", {}).items()}
            for name, tuned in TUNED.items()}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_args(p, GPU_TARGET)
    p.add_argument("--d-ff", type=positive, help="the dense MLP's (default N_E * G)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS,
                   default=["triton", "triton_unfused", "grouped_mm"])
    p.add_argument("--chunks", type=positive, nargs="*", default=[],
                   help="also the fused Triton layer with C token chunks (layer 'triton C=<C>': "
                        "its scatters chunk by chunk, kernels.moe_mlp(n_chunks=C)), per C")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=positive, default=5)
    p.add_argument("--top", type=positive, default=12, help="kernels printed per layer")
    p.add_argument("--out", type=Path, help="JSON path (default runs/bench/profile_<gpu>.json)")
    p.add_argument("--ncu", action="store_true",
                   help="for Nsight Compute instead: after the warm-up, one forward+backward "
                        "of each layer between cudaProfilerStart and Stop, nothing else "
                        "(ncu --profile-from-start off; scripts/gpu_check.sh's ncu step)")
    args = p.parse_args(argv)
    check_k(p, args.k, args.n_experts)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: profile_moe.py profiles GPU kernels and needs a CUDA device "
                 "(on a CPU, time the layers with scripts/bench_moe.py --device cpu)")
    c = {"d_model": args.d_model, "n_experts": args.n_experts,
         "expert_size": args.expert_size, "d_ff": args.d_ff or args.n_experts * args.expert_size}
    layers = make_layers(c, args.tokens, args.k, "cuda", DTYPES[args.dtype], args.backends,
                         chunks=args.chunks)
    precompile(*(fn for layer, fn in layers.items() if layer.startswith("triton")))
    name = torch.cuda.get_device_name()
    out = {**case_record(name, args), "d_ff": c["d_ff"], "layers": {}}
    for layer, fn in layers.items():
        for _ in range(args.warmup):  # autotuning and compiles stay out of the profile
            fn()
        sync("cuda")
        if args.ncu:  # ncu --profile-from-start off records this call alone
            torch.cuda.profiler.start()
            fn()
            sync("cuda")
            torch.cuda.profiler.stop()
            print(f"{layer}: one forward+backward between cudaProfilerStart and Stop")
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                fn()
            sync("cuda")
        rows = kernel_table(prof, args.reps)
        times = host_and_graph_ms(layer, fn, max(args.reps, 10))
        out["layers"][layer] = {"kernels": rows, **times}
        total = sum(r["us"] for r in rows)
        graph = "-" if times["graph_ms"] is None else f"{times['graph_ms']:.3f}"
        print(f"{layer}: {total:.0f} us of GPU kernels per forward+backward "
              f"({len(rows)} kernels); wall {times['wall_ms']:.3f} ms, host "
              f"{times['host_ms']:.3f} ms, CUDA graph {graph} ms")
        for r in rows[:args.top]:
            print(f"  {r['us']:8.1f} us {100 * r['share']:5.1f}% {r['calls']:5.1f}x  "
                  f"{r['kernel'][:90]}")
    if args.ncu:  # no timings to write: ncu has the counters
        return out
    out["autotuned"] = autotuned()
    for tuner, chosen in out["autotuned"].items():
        for key, cfg in chosen.items():
            print(f"autotune {tuner} {key}: {cfg}")
    path = args.out or ROOT / "runs" / "bench" / f"profile_{device_slug(name)}.json"
    write_json(path, out)
    return out


if __name__ == "__main__":
    main()
