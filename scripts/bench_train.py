"""Whole training steps, dense vs sigma-MoE (paper Sec. 5: sigma-MoE trains faster than its
parameter-equal dense twin). torch (+ triton) only, no Hydra, so it runs on GPU machines.

    python scripts/bench_train.py                       # GPU: WT-S and WT-B shapes, bf16
    python scripts/bench_train.py --device cpu          # CPU: the mini shapes, fp32
    python scripts/bench_train.py --chunks 4            # + sigma-MoE in 4 token chunks

Times forward + backward + Adam step of the Transformer-XL (memory included) after warm-up,
at the paper's batch (halved until a step fits the GPU; `--batch` sets it), alternating the
two models step by step; prints the median ms/step, tokens/s, peak memory
and the median (and quartiles) of the per-round MoE/dense ratios, as
scripts/bench_moe.py does, and writes JSON to
benchmarks/train_<device>.json: the run with the device's defaults only; any other run
writes under runs/bench/ unless `--out` says where (scripts/gpu_check.sh does:
benchmarks/gpu_h200.md names the command behind each committed GPU file).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.bench_common import (  # noqa: E402
    DTYPES,
    check_device,
    device_slug,
    kernel_table,
    out_path,
    paired_ratio,
    parse_with_defaults,
    positive,
    sync,
    write_json,
)
from sigma_moe.models.ffn.dense import DenseConfig  # noqa: E402
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig  # noqa: E402
from sigma_moe.models.transformer_xl import TransformerXL, TransformerXLConfig, n_params  # noqa: E402

# name: (d_model, layers, heads, head_dim, ctx, batch, vocab, dense d_ff, N_E, G, K,
#        dropout, expert dropout delta, gamma) of configs/exp/ wt103_small_*, wt103_big_*
#        and mini_* (tests/test_bench_train.py checks them)
SHAPES = {
    "wt_small": (412, 16, 10, 41, 256, 64, 8000, 2053, 16, 128, 4, 0.1, 0.0, 1e-3),
    "wt_big": (1024, 18, 16, 64, 512, 64, 8000, 4110, 32, 128, 4, 0.2, 0.1, 1e-3),
    "mini": (256, 4, 4, 64, 128, 16, 201, 1030, 16, 64, 4, 0.0, 0.0, 1e-3),
}


# issue 4's GPU target: a WT-B sigma-MoE step at most 0.6x its dense twin's time (bf16)
STEP_TARGETS = {"wt_big": 0.6}


def build(shape: str, kind: str, n_chunks: int | None = None
          ) -> tuple[TransformerXL, int, int]:
    D, L, H, C, ctx, _, vocab, d_ff, n_e, g, k, dropout, delta, gamma = SHAPES[shape]
    ffn = (DenseConfig(D, L, d_ff) if kind == "dense" else
           SigmaMoEConfig(D, L, n_e, g, k, expert_dropout=delta, reg_gamma=gamma,
                          n_chunks=n_chunks))
    cfg = TransformerXLConfig(vocab, D, L, H, C, dropout, ctx, 4 * ctx, kind, ffn)
    return TransformerXL(cfg), ctx, vocab


def make_step(model, ctx, batch, vocab, device, dtype):
    """-> step(): one timed training step (forward with memory, backward, clip, Adam)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    amp = (torch.autocast(device.type, dtype=dtype) if dtype != torch.float32
           else nullcontext())
    tokens = torch.randint(0, vocab, (batch, ctx + 1), device=device)
    state = {"mems": None}

    def step() -> float:
        sync(device.type)
        t0 = time.perf_counter()
        with amp:
            logits, state["mems"] = model(tokens[:, :-1], state["mems"])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            reg = model.pop_loss()
            loss = loss if reg is None else loss + reg
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device.type)
        return time.perf_counter() - t0

    return step


def bench_shape(shape, device, dtype, warmup, reps, batch=None, profile=0, chunks=()) -> dict:
    """`bench_batch` at the shape's batch (or `batch`); on a GPU that cannot hold a step of
    it, at half the batch, and so on (a WT-B step at the paper's 64 x 512 tokens keeps
    roughly 60-100 GB of activations, estimated on a CPU). Both twins always run the same
    batch, which the result records."""
    batch = batch or SHAPES[shape][5]
    while True:
        try:
            return bench_batch(shape, device, dtype, warmup, reps, batch, profile, chunks)
        except torch.cuda.OutOfMemoryError:
            if batch == 1:
                raise
        gc.collect()  # outside the except block: the traceback no longer holds the tensors
        torch.cuda.empty_cache()
        print(f"{shape}: out of GPU memory at batch {batch}; measuring batch {batch // 2}")
        batch //= 2


def moe_kinds(chunks=()) -> dict[str, int | None]:
    """The sigma-MoE models timed beside the dense one, by name: the default, and one a C
    of `chunks` (its expert layers in C token chunks, `ffn.n_chunks`) -> their n_chunks."""
    return {"sigma_moe": None, **{f"sigma_moe C={c}": c for c in chunks}}


def bench_batch(shape, device, dtype, warmup, reps, batch, profile=0, chunks=()) -> dict:
    """Both twins of one shape (and the sigma-MoE twin in token chunks, per C of `chunks`):
    warm-up (and peak memory) one model at a time, then `reps` rounds of one step of each,
    so that a drift of the machine's speed hits all alike; a ratio is the median of the
    per-round ratios. `profile` > 0: then one profiled step per model, its `profile`
    slowest GPU kernels printed and kept."""
    row, steps = {"batch": batch}, {}
    if device.type == "cuda":  # cuBLAS's workspaces, allocated by the first product, stay:
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):  # in both
            torch.ones(8, 8, device=device, requires_grad=True).mm(  # twins' baseline
                torch.ones(8, 8, device=device)).sum().backward()
    for kind, n_chunks in {"dense": None, **moe_kinds(chunks)}.items():
        torch.manual_seed(0)
        model, ctx, vocab = build(shape, "dense" if kind == "dense" else "sigma_moe", n_chunks)
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        model.to(device).train()
        # the layers' kernels compiled ahead at their shapes: WT-S's d_model of 412, no
        # multiple of 16, makes kernels of its own, which the kernel benchmarks' did not
        if kind != "dense" and (said := model.cfg.ffn.precompile(batch * ctx, device, dtype)):
            print(said.line)
        steps[kind] = make_step(model, ctx, batch, vocab, device, dtype)
        # the first step creates Adam's state (counted: it stays) and autotunes the Triton
        # kernels (not counted: their 256 MB cache-flush buffer is freed after tuning)
        steps[kind]()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(max(warmup - 1, 1)):
            steps[kind]()
        peak = ((torch.cuda.max_memory_allocated() - base) / 2**20
                if device.type == "cuda" else None)
        row[kind] = {"peak_mb": peak, "n_params": n_params(model), "tokens": batch * ctx,
                     "ms_all": []}
    for _ in range(reps):
        for kind in steps:
            row[kind]["ms_all"].append(1000 * steps[kind]())
    for kind in steps:
        r = row[kind]
        r["ms"] = statistics.median(r["ms_all"])
        r["tokens_per_s"] = r.pop("tokens") / r["ms"] * 1000
    for kind in moe_kinds(chunks):
        row[kind]["over_dense"], row[kind]["over_dense_quartiles"] = paired_ratio(
            row[kind]["ms_all"], row["dense"]["ms_all"])
    row["moe_over_dense_time"] = row["sigma_moe"]["over_dense"]
    row["moe_over_dense_quartiles"] = row["sigma_moe"]["over_dense_quartiles"]
    if profile and device.type == "cuda":
        for kind in steps:
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                steps[kind]()
            rows = kernel_table(prof, 1)
            row[kind]["kernels"] = rows[:profile]
            print(f"{shape} {kind}: {sum(r['us'] for r in rows) / 1e3:.1f} ms of GPU kernels "
                  "in one step; the slowest:")
            for r in rows[:profile]:
                print(f"  {r['us'] / 1e3:8.2f} ms {100 * r['share']:5.1f}% {r['calls']:5.0f}x  "
                      f"{r['kernel'][:100]}")
    return row


# flags that change neither the timings nor what is timed
NOT_RESULTS = {"device", "out", "profile"}


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """-> (arguments with the device's defaults filled in, the flags set to other values than
    those defaults: a run with any is not the one behind the committed results)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--device", choices=("cuda", "cpu"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", nargs="*", choices=list(SHAPES))
    ap.add_argument("--dtype", choices=list(DTYPES))
    ap.add_argument("--warmup", type=int, default=3, help="steps per model before timing")
    ap.add_argument("--reps", type=positive, default=10, help="timed rounds (one step of each)")
    ap.add_argument("--batch", type=positive,
                    help="sequences per step for every shape (default: the paper's, halved "
                         "until a step fits the GPU)")
    ap.add_argument("--chunks", type=positive, nargs="*", default=[],
                    help="also time the sigma-MoE model with its expert layers in C token "
                         "chunks (ffn.n_chunks), one model a C, in the same rounds")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="GPU: after timing, profile one step per model and print its N "
                         "slowest kernels (where the step's time goes)")
    ap.add_argument("--out", type=Path,
                    help="JSON path; default benchmarks/train_<device name>.json for the "
                         "device's defaults, else runs/bench/train_<device name>.json")

    def resolved(args):
        cuda = args.device == "cuda"
        check_device(ap, args.device)
        args.shapes = args.shapes or (["wt_small", "wt_big"] if cuda else ["mini"])
        args.dtype = args.dtype or ("bf16" if cuda else "fp32")
        return args

    return parse_with_defaults(ap, argv, resolved, NOT_RESULTS)


def main(argv=None) -> dict:
    args, changed = parse_args(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if args.profile > 0 and device.type != "cuda":
        print(f"note: --profile times CUDA kernels; not on {device.type} (ignored)",
              file=sys.stderr)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    path = args.out or out_path(f"train_{device_slug(name)}.json", changed)
    out = {"device": name, "dtype": str(dtype), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "results": {}}
    w = max(10, *(len(k) for k in moe_kinds(args.chunks)))
    print(f"{'shape':10} {'ffn':{w}} {'params':>8} {'ms/step':>9} {'tok/s':>9} {'peak MB':>9}")
    for shape in args.shapes:
        row = bench_shape(shape, device, dtype, args.warmup, args.reps, args.batch,
                          args.profile, args.chunks)
        for kind in ("dense", *moe_kinds(args.chunks)):
            r = row[kind]
            peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "-"
            print(f"{shape:10} {kind:{w}} {r['n_params'] / 1e6:7.1f}M {r['ms']:9.1f} "
                  f"{r['tokens_per_s']:9.0f} {peak:>9}")
        for kind in moe_kinds(args.chunks):
            q1, q3 = row[kind]["over_dense_quartiles"]
            name = kind.replace("sigma_moe", "sigma-MoE")
            print(f"{shape:10} {name} / dense step time: {row[kind]['over_dense']:.2f}x "
                  f"(batch {row['batch']}, median of {args.reps} paired rounds, quartiles "
                  f"{q1:.2f}-{q3:.2f})")
        if shape in STEP_TARGETS and device.type == "cuda" and dtype == torch.bfloat16:
            limit = STEP_TARGETS[shape]
            row["target"] = {"limit": limit, "pass": row["moe_over_dense_time"] <= limit}
            print(f"{shape:10} target: sigma-MoE step <= {limit}x dense: "
                  f"{'PASS' if row['target']['pass'] else 'FAIL'}")
        out["results"][shape] = row
    write_json(path, out)
    return out


if __name__ == "__main__":
    main()
