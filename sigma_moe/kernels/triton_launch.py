"""Launchers of the CVMM Triton kernels (sigma_moe/kernels/triton_cvmm.py, paper Eq. `cvmm`): the
kernels' autotuners (block sizes: sigma_moe/kernels/triton_tuning.py), their grids and arguments.

Shapes: tok_R int32 [R], off_S int32 [E*K*C+1] (sigma_moe/kernels/routing.py; C token chunks in the
chunks_in_slots order), W[e, k, n] any strides.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from sigma_moe.kernels.triton_cvmm import (
    EPI_GATE_RELU_BWD,
    EPI_NONE,
    EPI_RELU,
    INTERPRET,
    gather_mm_kernel,
    scatter_mm_kernel,
    wgrad_kernel,
    wgrad_reduce_kernel,
)
from sigma_moe.kernels.triton_tuning import (  # TUNED: the autotuners below register in it
    _INTERPRET_BLOCKS,
    _MIN_BLOCK_N,
    MM_CONFIGS,
    SCATTER_CONFIGS,
    TUNED,
    WGRAD_CONFIGS,
    _autotune,
    _blocks,
    _dot_args,
    _prune_to_smem,
    _prune_wgrad_to_smem,
    cdiv,
    launch_kernel,
    next_power_of_2,
)

# gpart has a row per 64 columns; a config with wider tiles writes fewer rows, so rows a
# timing trial wrote would be summed into the gate gradient: zeroed before every run
_gather_mm = _autotune(gather_mm_kernel, MM_CONFIGS, ["N", "KD", "EPILOGUE", "PRECISION"],
                       _prune_to_smem, reset_to_zero=["gpart_ptr"])
# the slot kernel reads what it writes: every timing trial must start from the same Y.
# segs_per_expert (K*C) keys token chunks apart: a chunk's launches have 1/C of the rows
_scatter_mm = _autotune(scatter_mm_kernel, SCATTER_CONFIGS,
                        ["N", "KD", "HAS_SCALE", "ACCUMULATE", "PRECISION", "segs_per_expert"],
                        _prune_to_smem, restore_value=["y_ptr"])
_wgrad = _autotune(wgrad_kernel, WGRAD_CONFIGS, ["M", "N", "GATHER_A", "GATHER_B", "PRECISION"],
                   _prune_wgrad_to_smem)


# segment lanes of the in-kernel tile search (`_segment_tile`): a power of two, at least a
# warp's 32. Up to 32 segments (the scatter's E = 32 at issue 4's target case) its
# reductions stay inside a warp; 128 lanes span 4 warps, and the PTX before the first load
# had 22 block barriers (sm_90). Each lane count is a compiled variant of its own, which
# sigma_moe/kernels/triton_precompile.py compiles beside the others.
MIN_SEG_P2 = 32


def _seg_p2(n_seg: int) -> int:
    return max(MIN_SEG_P2, next_power_of_2(n_seg))


def _segs_per_expert(off_S: torch.Tensor, n_exp: int) -> int:
    """K*C: an expert's rows are off_S[e*K*C] : off_S[(e+1)*K*C]."""
    return (off_S.numel() - 1) // n_exp


def _slots(off_S: torch.Tensor, n_exp: int, n_chunks: int) -> int:
    """K, from a routing of C = n_chunks token chunks (ValueError if they do not divide)."""
    S = _segs_per_expert(off_S, n_exp)
    if n_chunks < 1 or S % n_chunks:
        raise ValueError(f"n_chunks={n_chunks} does not divide the {S} segments an expert "
                         "has in this routing")
    return S // n_chunks


def _on_tensor_device(launch):
    """Triton launches on the current CUDA device, not on its tensors' (cuda:1 tensors with
    cuda:0 current: "Pointer argument cannot be accessed from Triton"): make theirs current
    for the call, whoever calls (a run on cuda:N, analyze.py --device cuda:N).

    The kernels index the 1-D tensors (tok, off, order, gate / scale) as `ptr + i`: a
    strided view (`gate_TK.reshape(-1)` of a non-contiguous gate is one) would be read
    wrong, so each is made contiguous (no copy for the usual contiguous one)."""
    @functools.wraps(launch)
    def run(a, *args, **kwargs):
        args = [t.contiguous() if _is_vector(t) else t for t in args]
        kwargs = {k: t.contiguous() if _is_vector(t) else t for k, t in kwargs.items()}
        with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
            return launch(a, *args, **kwargs)
    return run


def _is_vector(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 1


@_on_tensor_device
def gather_mm(a, w_EKN, tok_R, off_S, epilogue=EPI_NONE, h=None, gate=None, order_R=None,
              n_chunks=1):
    """C[r] = epi(A[tok[r]] @ W[e_r]) -> C [R, N]; EPI_GATE_RELU_BWD: -> (C, d gate partials
    [N / 64, R], gate*h [R, N]). n_chunks: the routing's C (chunks_in_slots)."""
    E, KD, N = w_EKN.shape
    R = tok_R.numel()
    K = _slots(off_S, E, n_chunks)
    c = torch.empty(R, N, dtype=a.dtype, device=a.device)
    gpart = gh = None
    if epilogue == EPI_GATE_RELU_BWD:
        assert h is not None and h.stride() == c.stride(), "h must be a contiguous [R, N]"
        gpart = torch.zeros(cdiv(N, _MIN_BLOCK_N), R, dtype=torch.float32,
                            device=a.device)
        gh = torch.empty_like(c)
    dummy = c  # pointer arguments the chosen epilogue never reads
    # tiles of the E*K (expert, slot) segments: at most one partial tile each
    grid = lambda META: (  # noqa: E731
        (cdiv(R, META["BLOCK_M"]) + E * K) * cdiv(N, META["BLOCK_N"]),)
    launch_kernel(
        _gather_mm, grid,
        a, w_EKN, c, tok_R, off_S,
        h if h is not None else dummy, gate if gate is not None else dummy,
        order_R if order_R is not None else tok_R, gpart if gpart is not None else dummy,
        gh if gh is not None else dummy,
        E, K, n_chunks, N, KD, R,
        a.stride(0), a.stride(1), *w_EKN.stride(), c.stride(0), c.stride(1),
        EPILOGUE=epilogue, SEG_P2=_seg_p2(E * K),
        **_dot_args(a.dtype), **_blocks(),
    )
    return c if gpart is None else (c, gpart, gh)


@_on_tensor_device
def scatter_mm(a_RK, w_EKN, tok_R, off_S, n_tokens, scale=None, order_R=None, n_chunks=1):
    """Y[t] = sum over the K rows r of token t of scale_r * (A[r] @ W[e_r]) -> Y [T, N].

    One launch per slot, in slot order, each adding onto the last: a fixed summation order.
    With C = n_chunks token chunks (a chunks_in_slots routing), chunk by chunk: a chunk's K
    launches read and write only its T/C output rows, which L2 may hold between them.
    Y is accumulated in A's dtype (like the per-expert reference's index_add).
    """
    E, KD, N = w_EKN.shape
    S = _segs_per_expert(off_S, E)
    K = _slots(off_S, E, n_chunks)
    y = torch.empty(n_tokens, N, dtype=a_RK.dtype, device=a_RK.device)
    grid = lambda META: (  # noqa: E731  (a chunk holds at most ceil(T / C) tokens)
        (cdiv(cdiv(n_tokens, n_chunks), META["BLOCK_M"]) + E)
        * cdiv(cdiv(N, META["BLOCK_N"]), META.get("N_TILES", 1)),)
    for i in range(S):
        chunk, slot = divmod(i, K)
        launch_kernel(
            _scatter_mm, grid,
            a_RK, w_EKN, y, tok_R, off_S,
            scale if scale is not None else y, order_R if order_R is not None else tok_R,
            E, S, slot * n_chunks + chunk, i % 2, N, KD,
            a_RK.stride(0), a_RK.stride(1), *w_EKN.stride(), y.stride(0), y.stride(1),
            HAS_SCALE=scale is not None, ACCUMULATE=slot > 0, SEG_P2=_seg_p2(E),
            # the interpreter runs both ways of reading the earlier sums (odd / even slots)
            **_dot_args(a_RK.dtype), **_blocks(EARLY_Y=slot % 2 == 1),
        )
    return y


# An expert's rows are walked in chunks of at most WGRAD_CHUNK times the mean rows an
# expert gets. Routing is rarely even: at init the WT-B model gives its busiest expert 3.5-5x
# the mean (random tokens, CPU), and with one program per output tile and expert the
# weight gradient waits on that expert (run 4b: 218 us a call in the WT-B step against
# 88-100 us on the benchmark's uniform routing). Near-even routing stays in one chunk per
# expert, written directly, as before.
WGRAD_CHUNK = 1.25
MAX_GRID_Y = 65535  # CUDA's largest grid along its second axis


def wgrad_chunk_rows(n_rows: int, n_exp: int) -> int:
    """The default chunk: WGRAD_CHUNK x the mean rows an expert gets, rounded up to 64."""
    return max(64, cdiv(int(WGRAD_CHUNK * cdiv(n_rows, max(n_exp, 1))), 64) * 64)


@_on_tensor_device
def wgrad(a, b, tok_R, off_S, n_exp, gather_a, gather_b, dtype=None, chunk_rows=None):
    """dW[e] = sum_{r of e} A[ia_r]^T B[ib_r] -> dW [E, a.shape[1], b.shape[1]].
    chunk_rows: the most rows one program walks (default `wgrad_chunk_rows`); an expert
    with more is summed in fp32 partials, reduced in a fixed order (deterministic).
    Memory: the partials' fp32 workspace is sized for the worst routing, 2R / chunk_rows + 1
    tiles of M x N, about 1.6 E at the default chunk (1.6x an fp32 dW, 3.2x a bf16 one),
    held for the call: the layer's backward runs its two wgrads one after the other."""
    M, N = a.shape[1], b.shape[1]
    R = tok_R.numel()
    if n_exp >= MAX_GRID_Y:
        raise ValueError(f"wgrad: {n_exp} experts; the kernel's grid holds fewer than "
                         f"{MAX_GRID_Y}")
    # a work item a chunk, one more an expert, on the grid's second axis: CUDA's limit
    # bounds them, so a small chunk_rows with many rows gets larger chunks
    chunk_rows = max(chunk_rows or wgrad_chunk_rows(R, n_exp), cdiv(R, MAX_GRID_Y - n_exp))
    dw = torch.empty(n_exp, M, N, dtype=dtype or a.dtype, device=a.device)
    # an expert of n > 1 chunks has more than (n - 1) * chunk_rows rows: at most 2R / chunk
    # partials in all, and at most R / chunk items more than there are experts
    ws = torch.empty(2 * R // chunk_rows + 1, M, N, dtype=torch.float32, device=a.device)
    segs, seg_p2 = _segs_per_expert(off_S, n_exp), _seg_p2(n_exp)
    grid = lambda META: (  # noqa: E731
        cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]), n_exp + R // chunk_rows)
    launch_kernel(
        _wgrad, grid,
        a, b, dw, ws, tok_R, off_S, segs, n_exp, chunk_rows, M, N,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), *dw.stride(),
        GATHER_A=gather_a, GATHER_B=gather_b, SEG_P2=seg_p2,
        **_dot_args(a.dtype), **_blocks(),
    )
    block = _INTERPRET_BLOCKS["BLOCK_M"] if INTERPRET else 64
    wgrad_reduce_kernel[(cdiv(M, block) * cdiv(N, block), n_exp)](
        ws, dw, off_S, segs, n_exp, chunk_rows, M, N, *dw.stride(),
        SEG_P2=seg_p2, BLOCK_M=block, BLOCK_N=block)
    return dw


__all__ = ["EPI_GATE_RELU_BWD", "EPI_NONE", "EPI_RELU", "TUNED", "gather_mm", "scatter_mm",
           "wgrad", "wgrad_chunk_rows"]
