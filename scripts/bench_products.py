"""Where the fused layer's matrix products lose time (paper Eq. `cvmm`): each Triton kernel
of the layer beside the same FLOPs as one batched cuBLAS product (`torch.bmm` over equal
expert blocks), and beside itself on rearranged inputs that isolate one cause.

    python scripts/bench_products.py               # GPU: issue 4's target case, bf16
    python scripts/bench_products.py --chunks 8 32

  product      the layer's launch            rearranged                       reference
  gather fwd   x rows gathered, ReLU         rows pre-gathered (tok[r] = r)   bmm
  wgrad dW1    an expert's rows slot by slot token-interleaved (C chunks)     bmm
  wgrad dW2    (the same two orders)                                          bmm
  scatter fwd  K slot launches, gate scale   -                                bmm (no RMW)

What each comparison answers (benchmarks/gpu_h200.md items 8 and 9):
- gather: pre-gathered rows against bmm (both read the R x D gathered rows, 4x x's bytes)
  say what the tile and its pipeline cost; against the layer's launch, what the row gather
  (cp.async of scattered rows, with a token's K reads close in time for L2) costs or saves.
- wgrad: a token's K rows belong to K experts, each walked by its own programs, slot
  segment after slot segment: the token's reads come a quarter of a walk apart (~67 MB of
  other rows between them, about the L2) even where all those programs run at once. The
  routing's token chunks (kernels/routing.py, `make_routing(n_chunks=C)`) order an
  expert's rows (chunk, slot, token), so the K reads come close in time: a faster
  interleaved order says they came from DRAM, and the layer's wgrad should walk that order.
- scatter: its time over bmm's is what the read-modify-write of the token rows costs.

Every rearranged variant is checked against the layer's launch first (a line `check
<product>: ok` or FAIL; exit status 1 after the JSON if one is off by more than a change of
summation order allows). Times are medians of CUDA-graph replays in interleaved rounds
(eager under the interpreter), with ratios to the layer's launch and to bmm in the same
round; the JSON also keeps the configs the autotuners chose. torch + triton only (no
Hydra). JSON to runs/bench/products_<device>.json (or --out).
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
from scripts.profile_moe import autotuned  # noqa: E402

LAYER, BMM = "layer", "bmm"  # every product's first and last variant
# the rearranged variants sum the same terms in another order: tighter than a dtype's
# tolerance against the float64 reference (bf16: 4e-2, where one segment's rows left out
# of a weight gradient can be a few per cent)
REORDER_TOL = 1e-2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_case_args(p, GPU_TARGET)
    p.add_argument("--chunks", type=positive, nargs="+", default=[4, 16, 64],
                   help="token chunks C of the interleaved wgrad orders (default 4 16 64)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=positive, default=20)
    p.add_argument("--out", type=Path, help="JSON path (default runs/bench/products_<gpu>.json)")
    args = p.parse_args(argv)
    check_k(p, args.k, args.n_experts)
    if args.tokens * args.k < args.n_experts:
        p.error(f"--tokens {args.tokens} x --k {args.k} rows cannot fill {args.n_experts} "
                "expert blocks of the bmm reference: raise --tokens")
    return args


def products(args, device) -> dict[str, dict]:
    """product -> variant -> fn: the layer's launch first, bmm last (see the docstring)."""
    from kernels.routing import make_routing
    from kernels.triton_launch import EPI_RELU, gather_mm, scatter_mm, wgrad

    T, D, E, G, K = args.tokens, args.d_model, args.n_experts, args.expert_size, args.k
    R, dtype = T * K, DTYPES[args.dtype]
    gen = torch.Generator(device).manual_seed(0)
    randn = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
    expert_TK = torch.rand(T, E, generator=gen, device=device).argsort(-1)[:, :K]
    rt = make_routing(expert_TK, E)
    tok, off = rt.tok_R, rt.off_S
    x, dy = randn(T, D), randn(T, D)
    w1, w2 = randn(E, D, G) * D ** -0.5, randn(E, G, D) * G ** -0.5
    # the backward's R x G operands by flat index t*K + k, then in each routing's row order
    gpre_F, gh_F = randn(R, G), randn(R, G)
    gate = torch.rand(R, generator=gen, device=device).to(dtype)
    gpre, gh = gpre_F[rt.order_R], gh_F[rt.order_R]
    # bmm: the same FLOPs in E equal blocks of n rows (the random routing's are within a few
    # per cent of R / E); its operands are other rows of the same tensors
    n = R // E
    x_R, ident_R = x[tok.long()], torch.arange(R, device=device, dtype=tok.dtype)
    xb, gpreb, ghb, dyb = (t[: n * E].view(E, n, -1) for t in (x_R, gpre, gh, dy[tok.long()]))
    out = {
        "gather fwd": {
            LAYER: lambda: gather_mm(x, w1, tok, off, epilogue=EPI_RELU),
            "rows pre-gathered": lambda: gather_mm(x_R, w1, ident_R, off, epilogue=EPI_RELU),
            BMM: lambda: torch.bmm(xb, w1)},
        "wgrad dW1": {LAYER: lambda: wgrad(x, gpre, tok, off, E, True, False)},
        "wgrad dW2": {LAYER: lambda: wgrad(gh, dy, tok, off, E, False, True)},
        "scatter fwd": {
            LAYER: lambda: scatter_mm(gh, w2, tok, off, T, scale=gate, order_R=rt.order_R),
            BMM: lambda: torch.bmm(ghb, w2)},
    }
    for c in args.chunks:
        rc = make_routing(expert_TK, E, n_chunks=c)
        gpre_c, gh_c = gpre_F[rc.order_R], gh_F[rc.order_R]
        name = f"interleaved C={c}"
        out["wgrad dW1"][name] = lambda rc=rc, g=gpre_c: wgrad(x, g, rc.tok_R, rc.off_S, E,
                                                                True, False)
        out["wgrad dW2"][name] = lambda rc=rc, g=gh_c: wgrad(g, dy, rc.tok_R, rc.off_S, E,
                                                              False, True)
    out["wgrad dW1"][BMM] = lambda: torch.bmm(xb.transpose(1, 2), gpreb)
    out["wgrad dW2"][BMM] = lambda: torch.bmm(ghb.transpose(1, 2), dyb)
    return out


def check(prods: dict, dtype: torch.dtype) -> bool:
    """Every rearranged variant against its product's layer launch (bmm computes other
    rows: not compared). Prints a `check` line per product that has such variants; runs
    every launch once, so the autotuners tune here, not under graph capture. -> whether
    all agree."""
    ok, tol = True, min(TOLERANCE[dtype], REORDER_TOL)
    for prod, fns in prods.items():
        want, errs = fns[LAYER](), {}
        for v, fn in fns.items():
            got = fn()
            if v not in (LAYER, BMM):
                errs[v] = rel_err(got, want)
        if not errs:
            continue
        bad = {v: e for v, e in errs.items() if not e <= tol}  # NaN fails
        ok &= not bad
        print(f"check {prod}: {'FAIL ' + str(bad) if bad else 'ok'} (largest difference "
              f"{max(errs.values()):.1e}, at most {tol:.0e})")
    return ok


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, name = triton_device("bench_products.py")
    cuda = device == "cuda"
    dtype = DTYPES[args.dtype]
    T, D, E, G, K = args.tokens, args.d_model, args.n_experts, args.expert_size, args.k
    flops = 2 * T * K * D * G  # every product here; bmm's: 2 * n * E * D * G
    print(f"{name}, {args.dtype}, T={T} D={D} E={E} G={G} K={K}: {flops / 1e9:.1f} GFLOP a "
          f"product")
    prods = products(args, device)
    precompile(*(fn for fns in prods.values() for fn in fns.values()))
    ok = check(prods, dtype)  # before any timing, which also autotunes the layer's launches
    flat = {(p, v): fn for p, fns in prods.items() for v, fn in fns.items()}
    ms = (graph_times(flat, args.warmup, args.reps) if cuda
          else time_all(flat, device, args.warmup, args.reps))
    out = {**case_record(name, args), "timing": "cuda graph replays" if cuda else "eager",
           "flops": flops, "results": []}
    print(f"{'product':12} {'variant':20} {'ms':>8} {'TFLOP/s':>8} {'x layer':>8} {'x bmm':>7}")
    bmm_rows = (T * K // E) * E
    for (prod, variant), times in ms.items():
        f = flops if variant != BMM else 2 * bmm_rows * D * G
        row = {"product": prod, "variant": variant, "ms_all": times,
               "ms": statistics.median(times), "flops": f}
        row["tflop_s"] = f / row["ms"] / 1e9
        row["x_layer"], row["x_layer_quartiles"] = paired_ratio(times, ms[prod, LAYER])
        row["x_bmm"], row["x_bmm_quartiles"] = paired_ratio(times, ms[prod, BMM])
        out["results"].append(row)
        print(f"{prod:12} {variant:20} {row['ms']:8.3f} {row['tflop_s']:8.1f} "
              f"{row['x_layer']:8.3f} {row['x_bmm']:7.3f}")
    out["autotuned"] = autotuned()
    write_json(args.out or ROOT / "runs" / "bench" / f"products_{device_slug(name)}.json", out)
    if not ok:
        sys.exit("error: a rearranged variant disagrees with the layer's launch (check lines)")
    return out


if __name__ == "__main__":
    main()
