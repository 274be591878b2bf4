"""Block sizes of the CVMM Triton kernels (sigma_moe/kernels/triton_cvmm.py) and how they are tuned.

Block sizes are autotuned per (N, KD) (and, by Triton, per dtype) on a GPU, among the
configs whose tiles fit the device's shared memory (`fitting_configs`), each config timed on
CUDA-graph replays (`graph_bench`: the GPU time, not the host's launch cost). Where Triton
can (>= 3.4, `cache_results`), the choice is stored in Triton's cache directory: a restarted
or resumed run on the same GPU model takes the block sizes of the run before it, so it sums
in the same order and gets the same bits (block sizes set the summation order: without the
cache, two processes could tune differently). Delete the cache (TRITON_CACHE_DIR, default
~/.triton/cache) to tune again. Once a key is tuned, its launches skip the autotuner's
per-launch bookkeeping (`launch_kernel`). Under TRITON_INTERPRET=1 (CPU tests) autotune is
skipped -- it would time every config in the interpreter -- and one small block config
runs, with every tile upcast to fp32. The launchers that use all this are in
sigma_moe/kernels/triton_launch.py.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import NamedTuple

import torch
import triton
from triton.runtime.autotuner import Autotuner

from sigma_moe.kernels.triton_cvmm import INTERPRET

_INTERPRET_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}


def minor_version(version: str) -> tuple[int, int]:
    """"3.6.0+git1" -> (3, 6)."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def interpreter_problem(triton_version: str = triton.__version__,
                        numpy_version: str | None = None) -> str | None:
    """Why the Triton interpreter cannot run these kernels here (None: it can).

    The interpreter passes scalar arguments as 1-element arrays; before Triton 3.7 a loop
    bound over one (`range(0, KD, ...)`) calls int() on it, which numpy 2.4 refuses
    ("only 0-dimensional arrays can be converted"). Measured: Triton 3.6.0 fails with numpy
    2.4.6 and passes with 2.3.5; Triton 3.7.1 passes with both. Only CPU runs are affected.
    Older still, the interpreter of Triton 3.0 and 3.1 (torch 2.4, 2.5) loses every store
    with numpy 2, which this project needs: a kernel leaves its output as it was, no error
    (measured: 3.0.0 and 3.1.0 with numpy 2.3.5 and 2.4.6; 3.2.0 to 3.5.0 store).
    """
    if numpy_version is None:
        import numpy

        numpy_version = numpy.__version__
    if minor_version(triton_version) < (3, 2) and minor_version(numpy_version) >= (2, 0):
        return (f"the interpreter of Triton {triton_version} writes nothing with numpy "
                f"{numpy_version}: install torch >= 2.6 (with its Triton, 3.2 or newer)")
    if minor_version(triton_version) < (3, 7) and minor_version(numpy_version) >= (2, 4):
        return (f"the interpreter of Triton {triton_version} cannot run with numpy "
                f"{numpy_version}: pip install 'numpy<2.4' (or triton>=3.7)")
    return None


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host. triton.cdiv (and triton.next_power_of_2) are constexpr
    functions: ~1.4 us a call from Python (Triton 3.6 and 3.7), a hundred times plain
    arithmetic, and a launch makes several."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), on the host (see `cdiv`)."""
    return 1 << max(n - 1, 0).bit_length()


def _cfg(bm, bn, bk, warps, stages, **more):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, **more},
                         num_warps=warps, num_stages=stages)


# rows x columns x reduction; G = 64..512 and d_model = 256..4096 are the shapes that matter.
# Few configs: each is compiled for every kernel variant the first time it runs.
# gather (up-projection, d pre-ReLU): N = G is narrow, the reduction d_model long. sm_90,
# bf16 (ptxas, Triton 3.6 and 3.7): a 128 x 128 fp32 accumulator takes 128 registers a
# thread in one warpgroup (4 warps: 235-255 with the rest; the backward epilogue spills at
# 128 x 128 x 32), 64 in two; 128 x 128 x 64 / 8 warps / 3 stages is the one with two
# programs an SM (98 KB, 128 registers) in the forward.
MM_CONFIGS = [
    _cfg(128, 128, 64, 8, 4), _cfg(128, 128, 32, 4, 4), _cfg(128, 64, 64, 4, 4),
    _cfg(64, 128, 64, 4, 4), _cfg(128, 256, 64, 8, 3), _cfg(64, 64, 64, 4, 3),
    _cfg(256, 128, 64, 8, 3), _cfg(128, 128, 64, 8, 3),
]
# scatter (down-projection, dx): N = d_model is wide, the reduction G short (2-4 steps), and
# every tile also reads and writes its output rows (the earlier slots' sums): few stages and
# small tiles leave room for more programs per SM, whose reads overlap each other; EARLY_Y
# reads the sums before the product (H200, first measurements: 128x128x32 / 4 warps / 4
# stages took 71 us a slot, 2.3x its memory time; 128x128x64 / 8 / 3 with EARLY_Y 79 us;
# run 3 chose 64x256x64 / 8 / 2 with EARLY_Y, 70 us, at 176 registers a thread (ptxas,
# `python -m sigma_moe.kernels.triton_aot --all-configs --spills`): one block, 8 warps, an SM.
# 64x64x64 / 4 / 2 needs 96 (EARLY_Y) and 32 KB: five blocks, 20 warps, more output reads in flight.
# The 256-wide tiles move the fewest bytes from L2 per product (gpu_h200.md item 13: an
# accumulating slot's 64x128 tiles 346 MB, 128x256 250 MB); bf16 and fp16: 220-250
# registers, no spills (with EARLY_Y 128x256 spills: left out); fp32 spills up to 1 KB.
SCATTER_CONFIGS = [
    _cfg(128, 128, 32, 4, 4), _cfg(128, 128, 64, 8, 3, EARLY_Y=True),
    _cfg(64, 128, 64, 4, 2), _cfg(64, 128, 64, 4, 2, EARLY_Y=True),
    _cfg(128, 64, 64, 4, 2), _cfg(128, 64, 64, 4, 2, EARLY_Y=True),
    _cfg(128, 128, 64, 8, 2), _cfg(64, 256, 64, 8, 2, EARLY_Y=True),
    _cfg(64, 64, 64, 4, 2), _cfg(64, 64, 64, 4, 2, EARLY_Y=True),
    _cfg(128, 256, 64, 8, 2), _cfg(256, 128, 64, 8, 2),
    # N_TILES column tiles per program, the whole reduction in one A tile (KD <= BLOCK_K:
    # G <= 128), the next W tile fetched while this one's sums are read and written, and
    # with EARLY_Y the next tile's sums too (run 4a, H200: the one-tile programs above ran
    # slot 0, a plain product, at 168 TFLOP/s, 0.45x cuBLAS's bmm of the same FLOPs; 4b:
    # 64x64x128, N_TILES 8, EARLY_Y taken for all four scatters at d_model 1024, their 8
    # launches 482 -> 393 us). bf16, sm_90: 75-129 registers without the gate scale,
    # 112-246 with it, no spills
    _cfg(64, 128, 128, 4, 3, N_TILES=4), _cfg(64, 128, 128, 4, 3, N_TILES=8, EARLY_Y=True),
    _cfg(64, 128, 128, 8, 3, N_TILES=8, EARLY_Y=True), _cfg(128, 128, 128, 8, 3, N_TILES=4),
    _cfg(128, 64, 128, 4, 3, N_TILES=8), _cfg(64, 64, 128, 4, 3, N_TILES=8),
    _cfg(64, 64, 128, 4, 3, N_TILES=8, EARLY_Y=True),
    _cfg(64, 64, 128, 4, 2, N_TILES=8, EARLY_Y=True),
    _cfg(64, 64, 128, 4, 3, N_TILES=16, EARLY_Y=True),
]
# output tile (M x N of one expert's dW) x rows walked per step; larger tiles read fewer
# bytes per product from L2 (H200, runs 1-3: 128 x 128 / 8 warps / 4 stages, ~105 us each,
# a third of peak). The rows' token ids are loaded in the loop, so the gathered rows are a
# load behind a load, and Triton's pipeliner gives the index load stages of its own: of
# num_stages S, (S + 1) // 2 buffers of operand tiles (sm_90, Triton 3.6 and 3.7: S = 3 or
# 4 keeps 2, i.e. one step of rows in flight while the tensor cores take ~0.3 us a step and
# a load ~1 us; S = 5: 3, S = 7: 4). `smem_bytes` counts them.
WGRAD_CONFIGS = [
    _cfg(128, 128, 64, 8, 7), _cfg(128, 128, 64, 8, 5), _cfg(128, 128, 32, 4, 7),
    _cfg(64, 128, 64, 4, 7), _cfg(128, 64, 64, 4, 7), _cfg(128, 256, 64, 8, 5),
    _cfg(256, 128, 64, 8, 5),
    _cfg(128, 128, 64, 8, 4),  # runs 1-3's choice, one step in flight: the baseline
]
# the smallest tiles, for GPUs where no config above fits (e.g. fp32 with 64 KB per block)
SMALL_CONFIG = _cfg(64, 64, 32, 4, 2)
# fp32 without TF32 (torch's default) runs on FMA units, not tensor cores: every larger
# tile needs over 255 registers per thread on sm_90 and spills (ptxas, Triton 3.7.1); so do
# 64x64x64 with 4 warps (the backward gather epilogue) and with 8 warps and 3 stages (the
# accumulating scatter): `python -m sigma_moe.kernels.triton_aot fp32-ieee --all-configs --spills`
IEEE_CONFIGS = [_cfg(64, 64, 64, 8, 4), _cfg(64, 64, 64, 8, 2), SMALL_CONFIG]
# SIGMA_MOE_TRITON_AUTOTUNE=0: the first config that fits, no timing trials of the others
# (tests/conftest.py: the GPU tests compile one config per kernel variant, not six; the
# disk cache keys on the config list, so benchmarks and training still tune in full)
AUTOTUNE = os.environ.get("SIGMA_MOE_TRITON_AUTOTUNE", "1") != "0"
_MIN_BLOCK_N = (_INTERPRET_BLOCKS["BLOCK_N"] if INTERPRET
                else min(c.kwargs["BLOCK_N"] for c in [*MM_CONFIGS, SMALL_CONFIG, *IEEE_CONFIGS]))


def smem_bytes(cfg: triton.Config, elem_bytes: int, wgrad: bool = False) -> int:
    """Shared memory of a config. Gather/scatter kernels: num_stages buffers of an A tile
    (M x K) and a W tile (K x N) in the input dtype. The wgrad kernel: (num_stages + 1) // 2
    (at least 2) such buffers and one fewer of its rows' int32 token ids (WGRAD_CONFIGS).
    Exact on sm_90 (wgrad with 2 stages, and the scatter's N_TILES loop -- num_stages W
    and output tiles, one A tile -- upper bounds); tests compare them with compiled
    kernels (`python -m sigma_moe.kernels.triton_aot --all-configs`)."""
    k = cfg.kwargs
    if k.get("N_TILES", 1) > 1:  # scatter_mm_kernel's column loop: an upper bound (sm_90)
        return (cfg.num_stages * (k["BLOCK_K"] + k["BLOCK_M"]) * k["BLOCK_N"]
                + k["BLOCK_M"] * k["BLOCK_K"]) * elem_bytes
    tiles = (k["BLOCK_M"] + k["BLOCK_N"]) * k["BLOCK_K"] * elem_bytes
    if not wgrad:
        return cfg.num_stages * tiles
    buffers = max(2, (cfg.num_stages + 1) // 2)
    return buffers * tiles + (buffers - 1) * k["BLOCK_K"] * 4


# shared memory per block on sm_90 (227 KB), what Triton reports as max_shared_mem on an H100
H100_SMEM = 232448


def fitting_configs(configs: list, max_smem: int, elem_bytes: int, wgrad: bool = False) -> list:
    """The configs that fit `max_smem` bytes (H100: 227 KB, A100: 163 KB, consumer GPUs:
    99 KB), else the small one. Triton would compile the others only to fail at launch
    (two fp32 configs on an H100), and when none fits it would launch one anyway."""
    return ([c for c in configs if smem_bytes(c, elem_bytes, wgrad) <= max_smem]
            or [SMALL_CONFIG])


def max_shared_mem(device_index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(device_index)[
        "max_shared_mem"]


def _prune_to_smem(configs, named_args, wgrad=False, **kwargs):
    """The configs autotune tries for this launch (`kwargs`: its constexprs)."""
    a = named_args["a_ptr"]
    if kwargs.get("DOT_F32") and kwargs.get("PRECISION") == "ieee":
        configs = IEEE_CONFIGS
    # the scatter's column loop holds the whole reduction in one tile
    configs = [c for c in configs
               if c.kwargs.get("N_TILES", 1) == 1 or named_args["KD"] <= c.kwargs["BLOCK_K"]]
    fitting = fitting_configs(configs, max_shared_mem(a.device.index), a.element_size(), wgrad)
    return fitting if AUTOTUNE else fitting[:1]


def _prune_wgrad_to_smem(configs, named_args, **kwargs):
    return _prune_to_smem(configs, named_args, wgrad=True, **kwargs)


# Triton >= 3.4 keeps autotune results on disk when asked (see the module docstring)
_CACHE_RESULTS = ({"cache_results": True}
                  if "cache_results" in inspect.signature(triton.autotune).parameters else {})
GRAPH_BENCH_REP_MS = 20  # GPU time of one config's replays (some 100-300 launches)


def graph_bench(kernel_call, quantiles):
    """How the autotuner times a config: CUDA-graph replays of its launch, the GPU time alone.

    triton.testing.do_bench (the default) puts two events around each launch, behind an L2
    flush. Where issuing a launch takes the host longer than the flush takes the GPU (the
    H200 VM: ~185 us of Python a Triton launch, ~60 us of flush), the GPU idles between the
    first event and the kernel, so every config measured ~100 us of host time plus its
    own, and the host's jitter decided between configs a few us apart.
    do_bench_cudagraph runs on a stream of its own, which does not wait for the caller's:
    the device sync first lets the caller's kernels finish writing this launch's inputs (the
    earlier slots' sums that `restore_value` copies). Where the capture fails, the config
    is timed by do_bench after all (a warning says so)."""
    import warnings

    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    if torch.cuda.is_current_stream_capturing():  # a sync would break the capture
        raise RuntimeError("autotune: a kernel shape was first launched inside a CUDA-graph "
                           "capture, where its configs cannot be timed; run the same "
                           "shapes once before capturing (a warm-up step)")
    torch.cuda.synchronize()
    try:
        return do_bench_cudagraph(kernel_call, rep=GRAPH_BENCH_REP_MS, quantiles=quantiles)
    except RuntimeError as err:  # a timing method must not fail the layer it tunes
        warnings.warn(f"autotune: timing on CUDA-graph replays failed ({err}); timing "
                      "launches one by one instead", stacklevel=2)
        torch.cuda.synchronize()
        return do_bench(kernel_call, quantiles=quantiles)


# where triton.autotune takes a timing function (Triton >= 3.2)
_DO_BENCH = ({"do_bench": graph_bench}
             if "do_bench" in inspect.signature(triton.autotune).parameters else {})


class Tuned(NamedTuple):
    """One autotuned kernel: its launcher (the autotuner; under the interpreter the kernel
    itself), the configs it tries, and the arguments its choice is keyed on (Triton adds
    every tensor argument's dtype to the key)."""
    launcher: object
    configs: list
    key: list


# every autotuned kernel by name: what sigma_moe/kernels/triton_aot.py compiles,
# scripts/autotune_table.py names and profile_moe.py reports
TUNED: dict[str, Tuned] = {}


def _autotune(kernel, configs, key, prune, **hooks):
    """`kernel` autotuned over the configs that `prune` keeps for the device, timed by
    `graph_bench`, and registered in TUNED. Under the interpreter: the kernel itself (its
    launchers pass `_blocks()`)."""
    launcher = kernel if INTERPRET else triton.autotune(
        configs, key=key, prune_configs_by={"early_config_prune": prune},
        **hooks, **_CACHE_RESULTS, **_DO_BENCH)(kernel)
    TUNED[kernel.fn.__name__] = Tuned(launcher, configs, key)
    return launcher


_CHOSEN: dict = {}  # (tuner, key argument values, pointer dtypes) -> the config it chose


@functools.cache
def _key_plan(tuner: Autotuner) -> tuple[tuple, tuple]:
    """(where each of the tuner's key arguments is, the positions of its pointer arguments:
    every `*_ptr` of these kernels is a tensor)."""
    names = tuner.arg_names
    return (tuple((names.index(k), k) for k in tuner.keys),
            tuple(i for i, n in enumerate(names) if n.endswith("_ptr")))


def launch_kernel(kernel, grid, *args, **consts) -> None:
    """kernel[grid](*args, **consts): pointers (tensors) and scalars positional,
    constexprs by keyword.

    Through an autotuner, each launch pays for its key: a dict of every argument and the
    str() of every tensor's dtype, ~8 us of Python a launch (Triton 3.6 and 3.7; this CPU,
    a gather launch: 19 us through the autotuner, 11 us straight to the kernel), about 5x
    that on the H200 VM, where the eager layer is bound by its host time. Once the
    autotuner holds a config for a key, launches with the same key arguments and pointer
    dtypes (all that its key holds) go straight to the kernel with that config: the same
    launch. A choice is kept for the process, as the autotuner's own cache keeps it. Where
    Triton's key were built otherwise, the lookup below would find nothing and every
    launch would go through the autotuner, as before. While `Autotuner.run` is not
    Triton's own (`precompile` swaps in compiles), every launch goes through it."""
    if (not isinstance(kernel, Autotuner)
            or Autotuner.run.__module__ != Autotuner.__module__):
        kernel[grid](*args, **consts)
        return
    key_at, ptrs = _key_plan(kernel)
    values = tuple(args[i] if i < len(args) else consts[k] for i, k in key_at)
    dtypes = tuple(args[i].dtype for i in ptrs)
    config = _CHOSEN.get((kernel, values, dtypes))
    if config is None:
        kernel[grid](*args, **consts)
        # Autotuner.run's key (Triton 3.6, 3.7), not `best_config`, which another thread's
        # launch may have set meanwhile
        config = kernel.cache.get((*values, *map(str, dtypes)))
        if config is not None and config.pre_hook is None:  # (these kernels' configs have none)
            _CHOSEN[kernel, values, dtypes] = config
        return
    kernel.fn.run(*args, grid=grid, warmup=False, **consts, **config.all_kwargs())


def _blocks(**interpret_only) -> dict:
    """The block sizes under the interpreter (on a GPU the autotuner sets them)."""
    return {**_INTERPRET_BLOCKS, **interpret_only} if INTERPRET else {}


def tf32_allowed(matmul=None, backends=None) -> bool:
    """Whether torch lets fp32 matmuls use TF32, set by the legacy flag or the newer
    `fp32_precision` API (torch >= 2.9: once the new one is used, reading `allow_tf32`
    raises "mix of the legacy and new APIs"; "none" defers to the global setting)."""
    matmul = matmul or torch.backends.cuda.matmul
    backends = backends or torch.backends
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:  # torch < 2.9: the legacy flag only
        return bool(matmul.allow_tf32)
    if precision == "none":
        precision = getattr(backends, "fp32_precision", "none")
    return precision == "tf32"


def _dot_args(dtype: torch.dtype) -> dict:
    if INTERPRET:
        return {"DOT_F32": True, "PRECISION": "ieee"}
    if dtype == torch.float32:
        return {"DOT_F32": True, "PRECISION": "tf32" if tf32_allowed() else "ieee"}
    return {"DOT_F32": False, "PRECISION": "tf32"}  # 16-bit tiles: tensor cores, fp32 acc
