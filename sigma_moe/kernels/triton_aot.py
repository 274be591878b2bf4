"""Compile the CVMM kernels (paper Eq. `cvmm`) for a GPU target on a machine without one.

The Triton interpreter (the CPU tests) runs the kernels but never compiles them: it accepts
code that real Triton rejects. This compiles every kernel variant the layer launches down to
a cubin for sm_90 (Hopper), with the specialisations a real launch gets (unit strides
become constants, pointers and row strides are 16-byte aligned), and reports what matters
for speed: shared memory, whether the products use wgmma, whether the K loop is
software-pipelined (cp.async) and how many copy groups its waits leave in flight, and with
--spills the registers and spilled bytes (ptxas).

    python -m sigma_moe.kernels.triton_aot            # JSON lines, one per kernel variant (bf16)
    python -m sigma_moe.kernels.triton_aot fp32 --all-configs  # every autotune config: fits?
    python -m sigma_moe.kernels.triton_aot fp32-ieee --all-configs --spills   # fp32 without TF32

Must run without TRITON_INTERPRET (the interpreter replaces triton.language).
"""
from __future__ import annotations

import inspect
import json
import os
import re
import sys


def aot_problem() -> str | None:
    """Why this Triton cannot run compile_all (None: it can)."""
    import triton

    from sigma_moe.kernels.triton_tuning import minor_version

    if minor_version(triton.__version__) < (3, 6):
        return (f"sigma_moe/kernels/triton_aot.py uses the compile API of Triton >= 3.6 "
                f"(checked with 3.6.0 and 3.7.1); this is Triton {triton.__version__}")
    return None


def variants(dt: str = "bf16", blocks: dict | None = None):
    """(kernel name, constexprs, unit-stride args, 16-divisible args, pointer types).
    dt "fp32-ieee": fp32 products without TF32 (torch's default), on FMA units."""
    from sigma_moe.kernels.triton_launch import _seg_p2

    # what the launchers pass at issue 4's target case: the gather searches E*K = 128
    # segments, a slot of the scatter E = 32
    seg, seg_slot = {"SEG_P2": _seg_p2(32 * 4)}, {"SEG_P2": _seg_p2(32)}
    precision = "ieee" if dt == "fp32-ieee" else "tf32"
    dt = "fp32" if dt == "fp32-ieee" else dt
    base = {"DOT_F32": dt == "fp32", "PRECISION": precision,
            **(blocks or {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64})}
    g_ptr = {"a_ptr": dt, "w_ptr": dt, "c_ptr": dt, "tok_ptr": "i32", "off_ptr": "i32",
             "h_ptr": dt, "gate_ptr": dt, "order_ptr": "i64", "gpart_ptr": "fp32",
             "gh_ptr": dt}
    s_ptr = {"a_ptr": dt, "w_ptr": dt, "y_ptr": dt, "tok_ptr": "i32", "off_ptr": "i32",
             "scale_ptr": dt, "order_ptr": "i64"}
    w_div = ["M", "N", "stride_am", "stride_bm", "stride_we", "stride_wm"]
    w_ptr = {"a_ptr": dt, "b_ptr": dt, "dw_ptr": dt, "ws_ptr": "fp32", "tok_ptr": "i32",
             "off_ptr": "i32"}
    return [
        # up-projection + ReLU: x [T, D], W1[e, d, g]
        ("gather_mm_kernel", {**base, **seg, "EPILOGUE": 1},
         ["stride_ak", "stride_wn", "stride_cn"],
         ["N", "KD", "stride_am", "stride_we", "stride_wk", "stride_cm"], g_ptr),
        # fused backward of gate*ReLU: dy [T, D], W = W2^T (unit stride along k)
        ("gather_mm_kernel", {**base, **seg, "EPILOGUE": 2},
         ["stride_ak", "stride_wk", "stride_cn"],
         ["N", "KD", "stride_am", "stride_we", "stride_wn", "stride_cm"], g_ptr),
        # gate-scaled down-projection of one slot: h [R, G], W2[e, g, d]
        ("scatter_mm_kernel", {**base, **seg_slot, "HAS_SCALE": True, "ACCUMULATE": True},
         ["stride_ak", "stride_wn", "stride_yn"],
         ["N", "KD", "stride_am", "stride_we", "stride_wk", "stride_ym"], s_ptr),
        # dx of one slot: d pre-ReLU [R, G], W = W1^T
        ("scatter_mm_kernel", {**base, **seg_slot, "HAS_SCALE": False, "ACCUMULATE": False},
         ["stride_ak", "stride_wk", "stride_yn"],
         ["N", "KD", "stride_am", "stride_we", "stride_wn", "stride_ym"], s_ptr),
        # dW2 = (gate h)^T dy[tok]  and  dW1 = x[tok]^T d pre-ReLU
        ("wgrad_kernel", {**base, **seg_slot, "GATHER_A": False, "GATHER_B": True},
         ["stride_ak", "stride_bn", "stride_wn"], w_div, w_ptr),
        ("wgrad_kernel", {**base, **seg_slot, "GATHER_A": True, "GATHER_B": False},
         ["stride_ak", "stride_bn", "stride_wn"], w_div, w_ptr),
    ]


def ptxas_usage(ptx: str, capability: int) -> dict:
    """Registers per thread and spilled bytes (stores + loads) of `ptx`, from `ptxas -v`
    (Triton's own ptxas; its compile cache would skip the log of a cached kernel)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    arch = sm_arch_from_capability(capability)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([get_ptxas(capability).path, "-v", f"--gpu-name={arch}", src,
                              "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    regs = re.search(r"Used (\d+) registers", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else None}


def compile_kernel(fn, constexprs: dict, ptrs: dict, div16=(), capability: int = 90,
                   **options):
    """`fn` (a @triton.jit kernel) compiled for `capability` as a launch specialises it:
    `constexprs`, pointer element types `ptrs` (16-byte aligned, as torch allocates),
    integer arguments `div16` divisible by 16, every other argument a plain i32.
    `options`: num_warps, num_stages."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: "constexpr" if n in constexprs else (f"*{ptrs[n]}" if n in ptrs else "i32")
           for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in [*ptrs, *div16]}
    return triton.compile(ASTSource(fn, sig, constexprs, attrs),
                          target=GPUTarget("cuda", capability, 32), options=options)


def compile_all(dt: str = "bf16", capability: int = 90, warps: int = 8, stages: int = 4,
                blocks: dict | None = None, kernel: str | None = None, spills: bool = False):
    """Reports of every variant (of `kernel` only, if given); `blocks`: BLOCK_M/N/K;
    `spills`: add registers and spilled bytes (a ptxas run each)."""
    from sigma_moe.kernels import triton_cvmm

    for name, cex, ones, div16, ptrs in variants(dt, blocks):
        if kernel is not None and name != kernel:
            continue
        fn = getattr(triton_cvmm, name)
        defaults = {n: p.default for n, p in inspect.signature(fn.fn).parameters.items()
                    if p.default is not inspect.Parameter.empty}  # e.g. EARLY_Y
        cex = {**defaults, **cex, **{n: 1 for n in ones}}
        compiled = compile_kernel(fn, cex, ptrs, div16, capability, num_warps=warps,
                                  num_stages=stages)
        ttgir = compiled.asm["ttgir"]
        waits = re.findall(r"cp\.async\.wait_group\s+(\d+)", compiled.asm["ptx"])
        yield {"kernel": name, "variant": {k: v for k, v in cex.items() if k.isupper()},
               "shared_bytes": compiled.metadata.shared,
               "wgmma": ttgir.count("warp_group_dot "),
               "async_copies": ttgir.count("async_copy_global_to_local"),
               # the most copy groups a wait leaves in flight: 0 = each loop step waits
               # for all its loads (benchmarks/gpu_h200.md item 9)
               "copies_left_in_flight": max(map(int, waits), default=0),
               **(ptxas_usage(compiled.asm["ptx"], capability) if spills else {})}


def main(argv=None) -> None:
    import argparse

    from sigma_moe.kernels import triton_launch  # noqa: F401 (its autotuners fill TUNED)
    from sigma_moe.kernels import triton_tuning as tl

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dtype", nargs="?", default="bf16",
                   choices=["bf16", "fp16", "fp32", "fp32-ieee"],
                   help="input dtype of the kernels (default bf16); fp32-ieee: fp32 without "
                        "TF32, torch's default, with its own autotune configs")
    p.add_argument("--all-configs", action="store_true",
                   help="every autotune config (sigma_moe/kernels/triton_tuning.py), with the "
                        "shared memory that fitting_configs estimates for it (`estimate`) and "
                        "whether it fits an H100's 227 KB per block (`fits`)")
    p.add_argument("--kernels", nargs="+", choices=list(tl.TUNED), default=list(tl.TUNED),
                   help="only these kernels (default: all)")
    p.add_argument("--spills", action="store_true",
                   help="add registers per thread and spilled bytes (runs ptxas -v on each)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile")
    if problem := aot_problem():
        sys.exit(problem)
    if not args.all_configs:
        launched = {}
        if args.dtype == "fp32-ieee":  # launched with its own configs only
            cfg = tl.IEEE_CONFIGS[0]
            launched = dict(warps=cfg.num_warps, stages=cfg.num_stages, blocks=cfg.kwargs)
        for name in args.kernels:
            for report in compile_all(args.dtype, kernel=name, spills=args.spills, **launched):
                print(json.dumps(report), flush=True)
        return
    elem = 4 if args.dtype.startswith("fp32") else 2
    # `fits`: whether the compiled kernel fits an H100; fitting_configs decides from `estimate`
    for name in args.kernels:
        wgrad = name == "wgrad_kernel"
        configs = ([*tl.TUNED[name].configs, tl.SMALL_CONFIG]
                   if args.dtype != "fp32-ieee" else tl.IEEE_CONFIGS)
        for cfg in configs:
            for report in compile_all(args.dtype, warps=cfg.num_warps, stages=cfg.num_stages,
                                      blocks=cfg.kwargs, kernel=name, spills=args.spills):
                report.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                              estimate=tl.smem_bytes(cfg, elem, wgrad),
                              fits=report["shared_bytes"] <= tl.H100_SMEM)
                print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
