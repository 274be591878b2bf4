"""Time Transformer-XL's relative shift with its causal mask, forward and backward: the
torch.where on a strided view (sigma_moe/models/attention.py) against the Triton kernels
(sigma_moe/kernels/triton_relshift.py) that a CUDA run uses, at the attention shapes of
scripts/bench_train.py (heads x batch x segment T x 2T keys).

Both only move values, so they are first checked equal bit for bit. Then medians of
repeated runs after warm-up, interleaved round by round, the GB/s each reaches (bytes read
+ written), the Triton / torch ratios, and what the difference adds up to in a training step
(forward + backward in every layer). A table on stdout, JSON under benchmarks/ (the default
run) or runs/bench/.

    python scripts/bench_relshift.py                     # WT-S and WT-B, bf16
    TRITON_INTERPRET=1 python scripts/bench_relshift.py --shapes mini --batch 1 --reps 1

Needs torch + triton only: no Hydra.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.bench_common import exit_without_triton  # noqa: E402

exit_without_triton(__name__, __file__)  # before Triton is imported

from scripts.bench_common import (  # noqa: E402
    DTYPES,
    device_slug,
    out_path,
    parse_with_defaults,
    positive,
    time_all,
    triton_device,
    write_json,
)
from scripts.bench_train import SHAPES  # noqa: E402
from sigma_moe.kernels.triton_relshift import relshift_bias, relshift_bias_grad  # noqa: E402
from sigma_moe.models.attention import bd_width, position_bias, position_bias_grad  # noqa: E402


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["wt_small", "wt_big"])
    p.add_argument("--batch", type=positive, help="default: each shape's (64)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=positive, default=15)
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/relshift_<gpu>.json)")
    return parse_with_defaults(p, argv, lambda args: args, not_results={"out"})


def bench_shape(shape: str, args, device: str, dtype: torch.dtype) -> dict:
    _, layers, H, _, T, batch, *_ = SHAPES[shape]
    B, L = args.batch or batch, 2 * T  # memory as long as the segment (bench_train's)
    P = bd_width(L)
    bd = torch.randn(H, B, T, P, device=device).to(dtype)
    grad = torch.randn(B, H, T, L, device=device).to(dtype)
    same = (torch.equal(relshift_bias(bd, L), position_bias(bd, L))
            and torch.equal(relshift_bias_grad(grad, P), position_bias_grad(grad, P)))
    ms = time_all({"torch fwd": lambda: position_bias(bd, L),
                   "triton fwd": lambda: relshift_bias(bd, L),
                   "torch bwd": lambda: position_bias_grad(grad, P),
                   "triton bwd": lambda: relshift_bias_grad(grad, P)},
                  device, args.warmup, args.reps)
    med = {k: statistics.median(v) for k, v in ms.items()}
    # each direction reads one of the two tensors and writes the other
    gb = (bd.numel() + grad.numel()) * bd.element_size() / 1e9
    return {"shape": shape, "H": H, "B": B, "T": T, "L": L, "P": P, "layers": layers,
            "equal": same,
            "gb_moved": gb, "ms": med, "ms_all": ms,
            "gb_per_s": {k: gb / (v / 1e3) for k, v in med.items()},
            "triton_over_torch": {d: med[f"triton {d}"] / med[f"torch {d}"]
                                  for d in ("fwd", "bwd")},
            "step_ms_saved": layers * sum(med[f"torch {d}"] - med[f"triton {d}"]
                                          for d in ("fwd", "bwd"))}


def main(argv=None) -> dict:
    args, changed = parse_args(argv)
    device, name = triton_device("bench_relshift.py")
    dtype = DTYPES[args.dtype]
    results = [bench_shape(s, args, device, dtype) for s in args.shapes]
    print(f"{name}, {args.dtype}: relative shift + causal mask, median ms of {args.reps} "
          "rounds")
    print(f"{'shape':10} {'[H, B, T, L]':20} {'GB':>6} " + " ".join(
        f"{k:>11}" for k in results[0]["ms"]) + "  triton/torch fwd, bwd  step -ms")
    for r in results:
        dims = f"[{r['H']}, {r['B']}, {r['T']}, {r['L']}]"
        print(f"{r['shape']:10} {dims:20} {r['gb_moved']:6.2f} "
              + " ".join(f"{v:11.3f}" for v in r["ms"].values())
              + f"  {r['triton_over_torch']['fwd']:.3f}, {r['triton_over_torch']['bwd']:.3f}"
              f"  {r['step_ms_saved']:12.1f}")
    for r in results:
        print(f"check {r['shape']}: Triton {'equals' if r['equal'] else 'DIFFERS FROM'} "
              "torch (bias and gradient, bit for bit)")
    out = {"device": name, "torch": torch.__version__, "dtype": args.dtype, "results": results}
    if device == "cpu":  # the interpreter's times say nothing: never into benchmarks/
        changed.append("the Triton interpreter")
    write_json(args.out or out_path(f"relshift_{device_slug(name)}.json", changed), out)
    if not all(r["equal"] for r in results):
        raise SystemExit("error: the Triton relative shift differs from torch's (see above)")
    return out


if __name__ == "__main__":
    main()
