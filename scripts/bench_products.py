"""Where the fused layer's matrix products lose time (paper Eq. `cvmm`): each Triton kernel
of the layer beside the same FLOPs as one batched cuBLAS product (`torch.bmm` over equal
expert blocks), and beside itself on rearranged inputs that isolate one cause.

    python scripts/bench_products.py               # GPU: issue 4's target case, bf16
    python scripts/bench_products.py --chunks 8 32

  product      the layer's launch            rearranged                       reference
  gather fwd   x rows gathered, ReLU         rows pre-gathered (tok[r] = r)   bmm
  wgrad dW1    an expert's rows slot by slot token-interleaved (C chunks)     bmm
  wgrad dW2    (the same two orders)                                          bmm
  scatter fwd  K slot launches, gate scale   chunk by chunk (C token chunks)  bmm (no RMW)
  wgrad dW1 skewed, wgrad dW2 skewed: the weight gradients on uneven routing (the busiest
               expert ~4x the mean, as a WT-B layer's at init), the layer's launch (an
               expert's rows in chunks) against one program walking all of an expert's rows

What each comparison answers (benchmarks/gpu_h200.md items 8 and 9):
- gather: pre-gathered rows against bmm (both read the R x D gathered rows, 4x x's bytes)
  say what the tile and its pipeline cost; against the layer's launch, what the row gather
  (cp.async of scattered rows, with a token's K reads close in time for L2) costs or saves.
- wgrad: a token's K rows belong to K experts, each walked by its own programs, slot
  segment after slot segment: the token's reads come a quarter of a walk apart (~67 MB of
  other rows between them, about the L2) even where all those programs run at once. The
  routing's token chunks (sigma_moe/kernels/routing.py, `make_routing(n_chunks=C)`) order an
  expert's rows (chunk, slot, token), so the K reads come close in time: a faster
  interleaved order says they came from DRAM, and the layer's wgrad should walk that order.
- wgrad skewed: one program an output tile and expert waits on the busiest expert; the
  layer's launch cuts an expert's rows into chunks of at most 1.25x the mean
  (sigma_moe/kernels/triton_launch.py WGRAD_CHUNK) and sums the chunks' partials: `one chunk an
  expert` over it (`x layer` > 1) is what the chunks save.
- scatter: its time over bmm's is what the read-modify-write of the token rows costs. Its
  K launches each read and write all T output rows (67 MB at the target case, more than
  the L2 holds); chunk by chunk (`moe_mlp(n_chunks=C)`, a chunks_in_slots routing) a
  chunk's K launches touch only its T/C rows: a faster chunked scatter says the rows came
  from DRAM between launches, and the layer should run chunk by chunk.

Beside each Triton variant: what its tiles move through L2 (`L2 MB`, the model of
benchmarks/gpu_h200.md item 13 for the block sizes its autotuner chose: each tile loads a
BLOCK_M-row slab of A and a BLOCK_N-column slab of W, and writes, or reads and writes, its
outputs), that over its time (`L2 TB/s`), and against what a plain read of an L2-resident
buffer reaches on the same GPU (`x probe`, the probe line first): near 1, the product waits
on L2.

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
from scripts.bench_common import exit_without_triton  # noqa: E402

exit_without_triton(__name__, __file__)  # before Triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

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
from sigma_moe.kernels import triton_launch as L  # noqa: E402
from sigma_moe.kernels.testing import TOLERANCE, rel_err, uneven_experts  # noqa: E402
from sigma_moe.kernels.triton_launch import EPI_RELU  # noqa: E402
from sigma_moe.kernels.triton_tuning import _INTERPRET_BLOCKS, _dot_args, cdiv  # noqa: E402

LAYER, BMM = "layer", "bmm"  # every product's first and last variant
# the rearranged variants sum the same terms in another order: tighter than a dtype's
# tolerance against the float64 reference (bf16: 4e-2, where one segment's rows left out
# of a weight gradient can be a few per cent)
REORDER_TOL = 1e-2
# the probe: reads of a buffer that fits L2 (an H100's and H200's is 50 MB), repeated
PROBE_MB, PROBE_REPS, PROBE_BLOCK, PROBE_STEPS = 16, 40, 1024, 8


@triton.jit
def l2_read_kernel(x_ptr, out_ptr, reps, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """out[pid] = the sum, reps times over, of this program's STEPS x BLOCK elements of x,
    read past L1 (.cg, as the products' cp.async copies are); each pass starts one block
    further on, so no pass repeats the one before it load for load."""
    pid = tl.program_id(0)
    base = x_ptr + pid.to(tl.int64) * (STEPS * BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(reps):
        for i in range(STEPS):
            step = (i + r) % STEPS
            acc += tl.load(base + step * BLOCK + tl.arange(0, BLOCK),
                           cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def l2_probe(warmup: int, reps: int) -> float:
    """TB/s of `l2_read_kernel` over a PROBE_MB bf16 buffer (CUDA-graph replays, median):
    what the L2 serves to plain, coalesced reads on this GPU."""
    per_program = PROBE_STEPS * PROBE_BLOCK
    programs = (PROBE_MB << 20) // 2 // per_program
    x = torch.randn(programs * per_program, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(programs, device="cuda", dtype=torch.float32)

    def run():
        l2_read_kernel[(programs,)](x, out, PROBE_REPS, BLOCK=PROBE_BLOCK, STEPS=PROBE_STEPS)

    ms = statistics.median(graph_times({"probe": run}, warmup, reps)["probe"])
    return x.numel() * x.element_size() * PROBE_REPS / ms / 1e9


def chosen_blocks(tuner, key: dict) -> tuple[int, int, int] | None:
    """(BLOCK_M, BLOCK_N, N_TILES: the column tiles a program walks, 1 but for the scatter's
    column loop) of the config `tuner` chose for launches with these key values (the first
    of its cache's entries that match, whatever the dtypes), None if it chose none; the
    interpreter's blocks where the kernel has no autotuner."""
    if not hasattr(tuner, "cache"):
        return _INTERPRET_BLOCKS["BLOCK_M"], _INTERPRET_BLOCKS["BLOCK_N"], 1
    values = tuple(key[name] for name in tuner.keys)
    return next(((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs.get("N_TILES", 1))
                 for k, c in tuner.cache.items() if k[:len(values)] == values), None)


def _tiles(lengths: list[int], block: int) -> int:
    return sum(cdiv(n, block) for n in lengths)


def l2_bytes(product: str, blocks: dict, seg_rows: list[int], D: int, G: int, E: int, K: int,
             elem: int) -> int | None:
    """Bytes the layer's launches of `product` move between L2 and the SMs (gpu_h200.md item
    13): a tile loads the rows of A it covers (masked rows move nothing) over the whole
    reduction, and its slab of W; writes its outputs; an accumulating slot also reads them;
    a scatter program that walks N_TILES column tiles loads its A rows once.
    blocks: launch kind -> (BLOCK_M, BLOCK_N, N_TILES) or None (not known: -> None) ("gather",
    "wgrad dW1", "wgrad dW2", "slot 0", "slot k"); seg_rows: rows of each (expert, slot)
    segment, expert-major."""
    R = sum(seg_rows)
    kinds = {"gather fwd": ["gather"], "scatter fwd": ["slot 0", "slot k"]}.get(product,
                                                                                [product])
    if any(blocks.get(kind) is None for kind in kinds):
        return None
    if product == "gather fwd":  # x rows [R, D] @ W1[e] [D, G] -> h [R, G]
        bm, bn, _ = blocks["gather"]
        return elem * (cdiv(G, bn) * R * D + _tiles(seg_rows, bm) * D * G + R * G)
    if product in ("wgrad dW1", "wgrad dW2"):  # dW[e] [M, N] = sum of its rows' A^T B
        M, N = (D, G) if product == "wgrad dW1" else (G, D)
        bm, bn, _ = blocks[product]
        return elem * (R * M * cdiv(N, bn) + R * N * cdiv(M, bm) + E * M * N)
    # scatter fwd, per slot: gate*h rows [T, G] @ W2[e] [G, D] -> Y [T, D]
    total = 0
    for k in range(K):
        bm, bn, nt = blocks["slot 0" if k == 0 else "slot k"]
        slot_rows = seg_rows[k::K]
        T = sum(slot_rows)
        total += (cdiv(cdiv(D, bn), nt) * T * G + _tiles(slot_rows, bm) * G * D
                  + T * D * (1 if k == 0 else 2))
    return elem * total


def product_blocks(dtype: torch.dtype, D: int, G: int, K: int) -> dict:
    """Launch kind -> the (BLOCK_M, BLOCK_N, N_TILES) its autotuner chose at this case (the
    layer's launches: no token chunks, K segments an expert)."""
    p = _dot_args(dtype)["PRECISION"]
    return {
        "gather": chosen_blocks(L._gather_mm, dict(N=G, KD=D, EPILOGUE=EPI_RELU, PRECISION=p)),
        "wgrad dW1": chosen_blocks(L._wgrad, dict(M=D, N=G, GATHER_A=True, GATHER_B=False,
                                                  PRECISION=p)),
        "wgrad dW2": chosen_blocks(L._wgrad, dict(M=G, N=D, GATHER_A=False, GATHER_B=True,
                                                  PRECISION=p)),
        "slot 0": chosen_blocks(L._scatter_mm, dict(N=D, KD=G, HAS_SCALE=True,
                                                    ACCUMULATE=False, PRECISION=p,
                                                    segs_per_expert=K)),
        "slot k": chosen_blocks(L._scatter_mm, dict(N=D, KD=G, HAS_SCALE=True,
                                                    ACCUMULATE=True, PRECISION=p,
                                                    segs_per_expert=K)),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_case_args(p, GPU_TARGET)
    p.add_argument("--chunks", type=positive, nargs="+", default=[4, 16, 64],
                   help="token chunks C of the interleaved wgrad orders (default 4 16 64)")
    p.add_argument("--scatter-chunks", type=positive, nargs="*", default=[2, 4],
                   help="token chunks C of the chunk-by-chunk scatters (default 2 4)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=positive, default=20)
    p.add_argument("--out", type=Path, help="JSON path (default runs/bench/products_<gpu>.json)")
    args = p.parse_args(argv)
    check_k(p, args.k, args.n_experts)
    if args.tokens * args.k < args.n_experts:
        p.error(f"--tokens {args.tokens} x --k {args.k} rows cannot fill {args.n_experts} "
                "expert blocks of the bmm reference: raise --tokens")
    return args


def products(args, device) -> tuple[dict[str, dict], list[int]]:
    """(product -> variant -> fn: the layer's launch first, bmm last (see the docstring);
    the rows of each (expert, slot) segment of the layer's routing)."""
    from sigma_moe.kernels.routing import make_routing

    # looked up when called: a test swaps in a launcher of its own
    from sigma_moe.kernels.triton_launch import gather_mm, scatter_mm, wgrad

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
            LAYER: lambda: scatter_mm(gh, w2, tok, off, T, scale=gate, order_R=rt.order_R)},
    }
    for c in args.scatter_chunks:  # the same rows in the same order, finer segments
        rc = make_routing(expert_TK, E, n_chunks=c, chunks_in_slots=True)
        out["scatter fwd"][f"chunked C={c}"] = lambda rc=rc, c=c: scatter_mm(
            gh, w2, tok, rc.off_S, T, scale=gate, order_R=rt.order_R, n_chunks=c)
    for c in args.chunks:
        rc = make_routing(expert_TK, E, n_chunks=c)
        gpre_c, gh_c = gpre_F[rc.order_R], gh_F[rc.order_R]
        name = f"interleaved C={c}"
        out["wgrad dW1"][name] = lambda rc=rc, g=gpre_c: wgrad(x, g, rc.tok_R, rc.off_S, E,
                                                                True, False)
        out["wgrad dW2"][name] = lambda rc=rc, g=gh_c: wgrad(g, dy, rc.tok_R, rc.off_S, E,
                                                              False, True)
    rs = make_routing(uneven_experts(T, E, K, gen, device), E)
    gpre_s, gh_s = gpre_F[rs.order_R], gh_F[rs.order_R]
    out["wgrad dW1 skewed"] = {
        LAYER: lambda: wgrad(x, gpre_s, rs.tok_R, rs.off_S, E, True, False),
        "one chunk an expert": lambda: wgrad(x, gpre_s, rs.tok_R, rs.off_S, E, True, False,
                                             chunk_rows=R)}
    out["wgrad dW2 skewed"] = {
        LAYER: lambda: wgrad(gh_s, dy, rs.tok_R, rs.off_S, E, False, True),
        "one chunk an expert": lambda: wgrad(gh_s, dy, rs.tok_R, rs.off_S, E, False, True,
                                             chunk_rows=R)}
    out["scatter fwd"][BMM] = lambda: torch.bmm(ghb, w2)
    for prod in ("wgrad dW1", "wgrad dW1 skewed"):
        out[prod][BMM] = lambda: torch.bmm(xb.transpose(1, 2), gpreb)
    for prod in ("wgrad dW2", "wgrad dW2 skewed"):
        out[prod][BMM] = lambda: torch.bmm(ghb.transpose(1, 2), dyb)
    return out, rt.off_S.diff().tolist()


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
    prods, seg_rows = products(args, device)
    precompile(*(fn for fns in prods.values() for fn in fns.values()))
    ok = check(prods, dtype)  # before any timing, which also autotunes the layer's launches
    flat = {(p, v): fn for p, fns in prods.items() for v, fn in fns.items()}
    ms = (graph_times(flat, args.warmup, args.reps) if cuda
          else time_all(flat, device, args.warmup, args.reps))
    probe = None
    if cuda:  # a measurement beside the others: it must not cost them the run
        try:
            probe = l2_probe(args.warmup, args.reps)
            print(f"L2 probe: {PROBE_MB} MB read {PROBE_REPS} times, {probe:.2f} TB/s")
        except Exception as err:  # (a probe that fails costs its line only)
            print(f"L2 probe failed ({type(err).__name__}: {err})")
    blocks = product_blocks(dtype, D, G, K)
    out = {**case_record(name, args), "timing": "cuda graph replays" if cuda else "eager",
           "flops": flops, "l2_probe_tb_s": probe, "l2_blocks": blocks, "results": []}
    print(f"{'product':12} {'variant':20} {'ms':>8} {'TFLOP/s':>8} {'x layer':>8} {'x bmm':>7} "
          f"{'L2 MB':>7} {'L2 TB/s':>8} {'x probe':>8}")
    bmm_rows = (T * K // E) * E
    for (prod, variant), times in ms.items():
        f = flops if variant != BMM else 2 * bmm_rows * D * G
        row = {"product": prod, "variant": variant, "ms_all": times,
               "ms": statistics.median(times), "flops": f}
        row["tflop_s"] = f / row["ms"] / 1e9
        row["x_layer"], row["x_layer_quartiles"] = paired_ratio(times, ms[prod, LAYER])
        row["x_bmm"], row["x_bmm_quartiles"] = paired_ratio(times, ms[prod, BMM])
        l2 = ""
        # the same launches on other rows: the same tiles, the same bytes (none where a
        # tuner's choice was not found; none for the chunked scatters, tuned apart, whose
        # question is DRAM between launches, not L2)
        moved = (l2_bytes(prod, blocks, seg_rows, D, G, E, K, dtype.itemsize)
                 if variant != BMM and not variant.startswith("chunked") else None)
        if moved is not None:
            row["l2_mb"] = moved / 1e6
            row["l2_tb_s"] = row["l2_mb"] / row["ms"] / 1e3  # MB / ms = GB/s
            row["x_probe"] = row["l2_tb_s"] / probe if probe else None
            l2 = (f" {row['l2_mb']:7.0f} {row['l2_tb_s']:8.2f} "
                  f"{'-' if probe is None else format(row['x_probe'], '.2f'):>8}")
        out["results"].append(row)
        print(f"{prod:12} {variant:20} {row['ms']:8.3f} {row['tflop_s']:8.1f} "
              f"{row['x_layer']:8.3f} {row['x_bmm']:7.3f}{l2}")
    out["autotuned"] = autotuned()
    write_json(args.out or ROOT / "runs" / "bench" / f"products_{device_slug(name)}.json", out)
    if not ok:
        sys.exit("error: a rearranged variant disagrees with the layer's launch (check lines)")
    return out


if __name__ == "__main__":
    main()
