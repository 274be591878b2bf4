"""Compile the autotune configs of the CVMM kernels (paper Eq. `cvmm`) in parallel, ahead.

Triton's autotuner compiles each config of a launch the first time it times it, one after
the other: one sigma-MoE layer's forward and backward make 116 of them (the gather's two
epilogues x 8 configs, four scatter variants x 21, two weight gradients x 8), at a quarter
of a second to seconds each, and a benchmark's first steps spend minutes on that (on the
H200 lease, minutes of 15).
`precompile(fn)` runs fn() once with every autotuned launch replaced by the compiles of
the configs it would time, with the same arguments (so the same specialisation: the
autotuner's trials find them compiled), spread over a thread pool by Triton's
`AsyncCompileMode` (the compiler's passes run outside the GIL, ptxas is a process of its
own). No autotuned kernel runs meanwhile, nor those of COMPILE_ONLY (the weight gradient's
reduction, which only consumes them), so whatever fn computes from their outputs is
garbage; other launches (the top-K) run as usual, so fn must not need real values from an
autotuned kernel to decide what to launch.
"""
from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
import triton
from triton.runtime.autotuner import Autotuner

from sigma_moe.kernels.triton_cvmm import INTERPRET, wgrad_reduce_kernel

# kernels without an autotuner that precompile compiles without running (their launch
# arguments are all known ahead: plain JIT launches)
COMPILE_ONLY = (wgrad_reduce_kernel,)


def _compile_configs(self: Autotuner, *args, **kwargs):
    """`Autotuner.run` that compiles instead of timing and launching: every config the
    autotuner would try for these arguments (`prune_configs`, as `run` calls it)."""
    kwargs["warmup"] = True  # the launch's own: compile, do not run
    self.nargs = dict(zip(self.arg_names, args))
    try:
        for config in self.prune_configs(kwargs):
            self.fn.run(*args, **kwargs, **config.all_kwargs())
    finally:
        self.nargs = None


@contextlib.contextmanager
def compiling_only(workers: int):
    """Within: autotuned launches compile their configs on `workers` threads (finished on
    exit) and run nothing; so do COMPILE_ONLY's, their one variant each.

    AsyncCompileMode is a context variable of this thread; on CUDA autograd runs a
    backward on a worker thread of its own, whose launches would compile one by one: the
    backward runs on this thread instead (`set_multithreading_enabled` is thread-local)."""
    run = Autotuner.run
    Autotuner.run = _compile_configs
    # an instance attribute over JITFunction.run (put back as found: nested use, patches)
    own_runs = [vars(kernel).get("run") for kernel in COMPILE_ONLY]
    for kernel in COMPILE_ONLY:
        kernel.run = lambda *args, _run=kernel.run, warmup=False, **kw: _run(
            *args, warmup=True, **kw)
    try:
        # a config that fails to compile is left to the autotuner, which reports it
        with ThreadPoolExecutor(workers) as pool, triton.AsyncCompileMode(
                pool, ignore_errors=True), torch.autograd.set_multithreading_enabled(False):
            yield
    finally:
        Autotuner.run = run
        for kernel, own in zip(COMPILE_ONLY, own_runs, strict=True):
            if own is None:
                del kernel.run
            else:
                kernel.run = own


def precompile_problem() -> str | None:
    """Why `precompile` cannot compile ahead here (None: it can). SIGMA_MOE_PRECOMPILE=0
    turns it off (each config then compiles when the autotuner first times it)."""
    if os.environ.get("SIGMA_MOE_PRECOMPILE", "1") == "0":
        return "off (SIGMA_MOE_PRECOMPILE=0)"
    if INTERPRET:
        return "the Triton interpreter compiles nothing"
    if not hasattr(triton, "AsyncCompileMode"):
        return f"Triton {triton.__version__} has no AsyncCompileMode"
    return None


class Precompiled(NamedTuple):
    """What `precompile` did: a line that says it, and whether compiling ahead failed (the
    launches then compile when first timed, as without it: never a reason to stop a run)."""
    line: str
    failed: bool = False

    def __str__(self) -> str:
        return self.line


def precompile(fn, workers: int | None = None) -> Precompiled:
    """Run fn() compiling, not running, its autotuned Triton launches (module docstring).
    -> what it did (or why it did nothing: the launches then compile when first timed, as
    without it)."""
    if problem := precompile_problem():
        return Precompiled(f"precompile: skipped, {problem}")
    if not workers:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        # the processes of a multi-GPU node (torchrun's LOCAL_WORLD_SIZE) share its cores
        workers = max(1, min(32, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    t0 = time.perf_counter()
    try:
        with compiling_only(workers):
            fn()
    except Exception as err:  # compiling ahead is an optimisation: never fail a run on it
        return Precompiled(f"precompile: failed ({type(err).__name__}: {err}); the configs "
                           "compile when first timed", failed=True)
    return Precompiled(f"precompile: the autotune configs of the Triton launches compiled in "
                       f"{time.perf_counter() - t0:.1f} s on {workers} thread"
                       f"{'s' * (workers > 1)}")
