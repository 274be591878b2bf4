"""What scripts/bench_moe.py and scripts/bench_train.py share: dtypes, device sync, interleaved
timing with paired ratios, the flags that make a run "not the defaults", and where results
go. torch only (the GPU machines have no Hydra)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3': benchmark JSON file names."""
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower()).strip("_")


def time_all(fns: dict, device: str, warmup: int, reps: int) -> dict[str, list[float]]:
    """Interleaved runs (every variant once per round), so a load change on a shared
    machine hits all variants alike. -> name -> list of milliseconds."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    out = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            if device == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                fn()
                end.record()
                end.synchronize()
                out[k].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                out[k].append((time.perf_counter() - t0) * 1e3)
    return out


def cuda_graph(fn) -> torch.cuda.CUDAGraph:
    """fn() captured as a CUDA graph (replay() reruns its kernels with no Python or launch
    cost: the GPU time alone). fn runs once on a side stream first, as capture requires of
    autograd. RuntimeError where fn cannot be captured (a host sync, e.g. .tolist())."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_times(fns: dict, warmup: int, reps: int) -> dict[str, list[float]]:
    """Milliseconds of CUDA-graph replays of each fn (the GPU time alone: what the kernels
    decide), interleaved round by round like `time_all`. Eager timings of many small
    launches measure the host's Python as much as the GPU (H200 VM: 3.5 ms to issue a
    1.4 ms MoE layer), and in a training step the GPU is busy with other layers meanwhile."""
    graphs = {name: cuda_graph(fn) for name, fn in fns.items()}
    times = time_all({n: g.replay for n, g in graphs.items()}, "cuda", warmup, reps)
    del graphs  # their memory pools
    torch.cuda.empty_cache()
    return times


def kernel_table(prof, reps: int) -> list[dict]:
    """GPU kernels of a torch.profiler run of `reps` repetitions, slowest first: name, calls
    and microseconds per repetition, share of the GPU time."""
    rows = []
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None)
        if us is None:  # torch < 2.4
            us = evt.self_cuda_time_total
        if us > 0:
            rows.append({"kernel": evt.key, "calls": evt.count / reps, "us": us / reps})
    total = sum(r["us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["us"] / total
    return sorted(rows, key=lambda r: -r["us"])


def paired_ratio(ms: list[float], dense_ms: list[float]) -> tuple[float, list[float]]:
    """-> (median, [first quartile, third quartile]) of the per-round ratios ms / dense_ms."""
    ratios = [a / b for a, b in zip(ms, dense_ms, strict=True)]
    if len(ratios) == 1:
        return ratios[0], ratios * 2
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), [q1, q3]


def parse_with_defaults(parser, argv, resolved, not_results
                        ) -> tuple[argparse.Namespace, list[str]]:
    """-> (arguments resolved for their device, the flags whose values differ from that
    device's defaults (a parser without --device: from its defaults), except
    `not_results`)."""
    args = resolved(parser.parse_args(argv))
    device = ["--device", args.device] if hasattr(args, "device") else []
    defaults = resolved(parser.parse_args(device))
    return args, ["--" + k.replace("_", "-") for k, v in vars(args).items()
                  if k not in not_results and v != getattr(defaults, k)]


def write_json(path: Path, out: dict | list) -> None:
    """The results as indented JSON (folders made as needed), and a line saying where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def precompile(*fns) -> None:
    """On CUDA: compile the autotune configs of the Triton launches that fns make, in
    parallel, before anything times them (sigma_moe/kernels/triton_precompile.py; off with
    SIGMA_MOE_PRECOMPILE=0); says what it did."""
    from sigma_moe import kernels

    if not (fns and torch.cuda.is_available() and kernels.HAS_TRITON):
        return
    from sigma_moe.kernels.triton_precompile import precompile as compile_ahead

    print(compile_ahead(lambda: [fn() for fn in fns]).line)


def positive(text: str) -> int:
    """argparse type: an integer >= 1 (sizes, counts of rounds)."""
    value = int(text)  # a ValueError: argparse says "invalid positive value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


CASE_KEYS = ("tokens", "d_model", "n_experts", "expert_size", "k")


def add_case_args(parser, case: dict) -> None:
    """The one-case arguments of the Triton kernel benchmarks, `case`'s values as defaults
    (bench_moe.GPU_TARGET: issue 4's target case), and the dtype (bf16)."""
    for key in CASE_KEYS:
        parser.add_argument("--" + key.replace("_", "-"), type=positive, default=case[key])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")


def case_record(device_name: str, args) -> dict:
    """The head of a Triton kernel benchmark's JSON: where it ran (device, torch, Triton)
    and the case of `add_case_args`."""
    return {"device": device_name, "torch": torch.__version__,
            "triton": getattr(sys.modules.get("triton"), "__version__", None),
            "dtype": args.dtype, "case": {k: getattr(args, k) for k in CASE_KEYS}}


def exit_without_triton(module: str, path: str) -> None:
    """For a script of Triton kernels, called with its __name__ and __file__ before it
    imports Triton: run as a script (not imported), one line and exit 1 where Triton does
    not import (macOS, Windows, an install without it)."""
    from sigma_moe import kernels

    if module == "__main__" and not kernels.HAS_TRITON:
        script = Path(path).name
        sys.exit(f"error: {script} needs Triton, which does not import here "
                 f"({kernels.TRITON_ERROR}): run it on Linux, after `pip install triton`")


def triton_device(script: str) -> tuple[str, str]:
    """(device, its name) for a script that times Triton kernels: a CUDA device, or the CPU
    under the Triton interpreter (a smoke test); a one-line error anywhere else."""
    from sigma_moe.kernels import TRITON_INTERPRET

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name()
    if TRITON_INTERPRET:
        return "cpu", "cpu (Triton interpreter)"
    raise SystemExit(f"error: {script} times Triton kernels: it needs a CUDA device (or "
                     "TRITON_INTERPRET=1 and small shapes, for a smoke test)")


def check_device(parser, device: str) -> None:
    """A one-line argparse error (exit 2) for --device cuda where torch sees no GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA device here "
                     "(run on a GPU machine, or with --device cpu)")


def check_k(parser, k: int, n_experts: int) -> None:
    """A one-line argparse error for more experts per token than there are experts."""
    if k > n_experts:
        parser.error(f"--k {k} is more than the {n_experts} experts of a case: lower --k "
                     "(or raise --n-experts)")


def out_path(name: str, changed: list[str]) -> Path:
    """benchmarks/NAME for a run with the device's defaults; runs/bench/NAME (git-ignored)
    for any other, so that a quick run cannot overwrite the committed results."""
    if not changed:
        return ROOT / "benchmarks" / name
    path = ROOT / "runs" / "bench" / name
    print(f"not the defaults ({', '.join(changed)}): writing {path}, not benchmarks/{name} "
          "(--out to choose)")
    return path


if __name__ == "__main__":  # a library without a CLI: say which scripts measure
    sys.exit("error: scripts/bench_common.py is a library; benchmark with "
             "`python scripts/bench_moe.py` or `python scripts/bench_train.py`")
