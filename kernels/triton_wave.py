"""The down-projection's slot-ordered scatter (paper Eq. `moe_out`) in ONE launch: "wave".

    Y[t] = sum_k scale_tk * (A[r(t,k)] @ W[e_tk])      summed over k = 0..K-1 in that order

`scatter_mm` (kernels/triton_launch.py) launches once per slot k: every launch reads and
writes all T x N of Y, 2K - 1 passes (K = 4, d_model 1024: 448 MB, more than the 50 MB
L2, so from DRAM), and K launches of host time. Here the tokens are cut into B blocks of
TB tokens; group (b, k) is the rows of slot k whose token lies in block b, and the tiles
(BLOCK_M rows of one expert) of one launch go group by group along the diagonals
d = b + k. Group (b, k) waits only for (b, k-1) -- every token occurs once per slot, so
no other group touches its rows -- which ran one diagonal earlier: the K groups of a
diagonal overlap instead of waiting, and the rows of block b are read back while they
are still in L2. The sum of a token's K outputs keeps the slot order, as `scatter_mm`'s:
deterministic, no atomics on Y, no T*K*N buffer. Tiles start at block boundaries instead of
segment starts; on a GPU a row's product does not depend on its place in the tile, so the
bits should equal `scatter_mm`'s (the GPU tests assert it); the interpreter's numpy
products do depend on it (1 ulp apart at B > 1).

Why it cannot deadlock: a program takes the next tile from an atomic counter, so all
tiles before its own were taken by programs already running, and it waits only on those.
Visibility: a tile's writer stores Y, passes a block barrier, then releases (atomic add
with release semantics) its group's counter; a reader acquires it and reads Y past L1.

`wave_table_kernel` (one program) builds the tile table of a routing: binary searches
find where block b starts in each (expert, slot) segment (rows are token-sorted in it,
kernels/routing.py), then tiles are numbered in the wave order.
Not yet run on a GPU, hence opt-in: SIGMA_MOE_SCATTER=wave (kernels/triton_ops.py), or the
benchmarks' `triton_wave` layer; scripts/bench_scatter.py times it against the per-slot
launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_cvmm import INTERPRET, _rows_times_expert, _tile_to_tokens
from kernels.triton_launch import (
    _INTERPRET_BLOCKS,
    _autotune,
    _blocks,
    _cfg,
    _dot_args,
    _n_slots,
    _on_tensor_device,
    _prune_to_smem,
    cdiv,
    launch_kernel,
    next_power_of_2,
)

# the table kernel holds [groups x experts] (and [groups x groups]) in one program
MAX_GROUPS, MAX_LANES = 64, 4096  # (ptxas: 64 x 128 lanes spill 2 KB)


@triton.jit
def _lower_bound(tok_ptr, lo, hi, target):
    """First row r in [lo, hi) with tok[r] >= target (hi if none), lane by lane."""
    while tl.max(tl.max(hi - lo, 1), 0) > 0:
        active = lo < hi
        mid = lo + (hi - lo) // 2
        below = tl.load(tok_ptr + mid, mask=active, other=0) < target
        lo = tl.where(active & below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    return lo


@triton.jit
def wave_table_kernel(tok_ptr, off_ptr, tab_ptr, need_ptr, sync_ptr, n_exp, n_slots, n_blk,
                      blk_tokens, BLOCK_M: tl.constexpr, G_P2: tl.constexpr,
                      E_P2: tl.constexpr):
    """tab[tile] = (e, row0, row_end, g) in wave order; need[g] = tiles of group g - 1 (the
    same block's previous slot; 0 for slot 0); need[n_grp] = the number of tiles; sync[:
    n_grp + 2] = 0, the scatter's counters (here rather than a memset launch of their own)."""
    g = tl.arange(0, G_P2)[:, None]  # group b*K + k                        [G_P2, 1]
    e = tl.arange(0, E_P2)[None, :]  # expert                               [1, E_P2]
    n_grp = n_blk * n_slots
    b = g // n_slots
    k = g % n_slots
    ok = (g < n_grp) & (e < n_exp)  # [G_P2, E_P2]
    seg_lo = tl.load(off_ptr + e * n_slots + k, mask=ok, other=0)
    seg_hi = tl.load(off_ptr + e * n_slots + k + 1, mask=ok, other=0)
    start = _lower_bound(tok_ptr, seg_lo, seg_hi, b * blk_tokens)
    # block b ends where block b + 1 (lane g + K) starts: one search, not two (its steps are
    # dependent loads, the kernel's latency). Lanes trade starts through the table's first
    # G x E int32 words (it has 4 x bound >= G x E), which the rows overwrite after the
    # second barrier.
    lane = g * n_exp + e
    tl.store(tab_ptr + lane, start, mask=ok)
    tl.debug_barrier()
    nxt = ok & (b + 1 < n_blk)
    end = tl.where(nxt, tl.load(tab_ptr + lane + n_slots * n_exp, mask=nxt, other=0), seg_hi)
    tl.debug_barrier()
    n_tiles = tl.where(ok, (end - start + BLOCK_M - 1) // BLOCK_M, 0)  # [G_P2, E_P2]
    per_grp = tl.sum(n_tiles, 1)  # [G_P2]
    # wave order: by diagonal d = b + k, then by slot; groups of a diagonal are independent
    gg = tl.arange(0, G_P2)
    rank = tl.where(gg < n_grp, (gg // n_slots + gg % n_slots) * n_slots + gg % n_slots,
                    2 * G_P2 * G_P2)
    earlier = rank[None, :] < rank[:, None]  # [G_P2 (g), G_P2 (g')]: g' runs before g
    grp_first = tl.sum(tl.where(earlier, per_grp[None, :], 0), 1)  # [G_P2]
    first = grp_first[:, None] + tl.cumsum(n_tiles, 1) - n_tiles  # [G_P2, E_P2]
    prev = (gg[None, :] == gg[:, None] - 1) & (gg[:, None] % n_slots > 0)
    tl.store(need_ptr + gg, tl.sum(tl.where(prev, per_grp[None, :], 0), 1), mask=gg < n_grp)
    tl.store(need_ptr + n_grp, tl.sum(per_grp, 0))
    i = tl.arange(0, 4 * G_P2)  # >= n_grp + 2 for any n_grp >= 1
    tl.store(sync_ptr + i, 0, mask=i < n_grp + 2)
    e_full = e + 0 * g
    g_full = g + 0 * e
    for j in range(0, tl.max(tl.max(n_tiles, 1), 0)):
        has = j < n_tiles
        row = tab_ptr + (first + j).to(tl.int64) * 4
        tl.store(row, e_full, mask=has)
        tl.store(row + 1, start + j * BLOCK_M, mask=has)
        tl.store(row + 2, end, mask=has)
        tl.store(row + 3, g_full, mask=has)


@triton.jit
def _row_scale(scale_ptr, order_ptr, rows, row_ok):
    """scale[order[r]] of the tile's rows, fp32."""
    flat = tl.load(order_ptr + rows, mask=row_ok, other=0)
    return tl.load(scale_ptr + flat, mask=row_ok, other=0.0).to(tl.float32)


@triton.jit
def scatter_wave_kernel(
    a_ptr, w_ptr, y_ptr, tok_ptr, tab_ptr, need_ptr, sync_ptr, scale_ptr, order_ptr,
    n_slots, n_grp, N, KD,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
    HAS_SCALE: tl.constexpr, DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
    WAIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Y[tok[r], :] (+)= scale[order[r]] * (A[r, :] @ W[e_r]) for one tile of the table.

    sync: [0] tiles taken, [1 + g] tiles of group g done, [n_grp + 1] waits that would
    have blocked (WAIT=False, the interpreter: it runs programs one by one, so a wait that
    is not already satisfied would never end; the launcher raises on it)."""
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    taken = tl.atomic_add(sync_ptr, 1)
    tile = taken // n_tiles_n
    pid_n = taken % n_tiles_n  # column tiles innermost: neighbours share the A rows
    if tile >= tl.load(need_ptr + n_grp):
        return
    e = tl.load(tab_ptr + tile * 4)
    row0 = tl.load(tab_ptr + tile * 4 + 1)
    row_end = tl.load(tab_ptr + tile * 4 + 2)
    g = tl.load(tab_ptr + tile * 4 + 3)
    rows, row_ok, cols, col_ok, y_ptrs, mask = _tile_to_tokens(
        tok_ptr, y_ptr, row0, row_end, pid_n, N, stride_ym, stride_yn, BLOCK_M, BLOCK_N)
    acc = _rows_times_expert(a_ptr, w_ptr, rows.to(tl.int64), row_ok, cols, col_ok, e, KD,
                             stride_am, stride_ak, stride_we, stride_wk, stride_wn,
                             DOT_F32, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    if g % n_slots > 0:  # the product is done: now wait for the block's previous slot
        need = tl.load(need_ptr + g) * n_tiles_n
        done = tl.atomic_add(sync_ptr + g, 0, sem="acquire")  # sync[1 + (g - 1)]
        if WAIT:
            while done < need:
                done = tl.atomic_add(sync_ptr + g, 0, sem="acquire")
        else:
            tl.atomic_add(sync_ptr + n_grp + 1, (done < need).to(tl.int32))
        # .cg: past this SM's L1, which may hold these rows from before the other tile wrote
        y_old = tl.load(y_ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        # one rounding, as scatter_mm_kernel's (run 4: a multiply before the wait and the add
        # after it, in another basic block, left 1-ulp differences in bf16); the scale is read
        # here, not kept across the wait (fp32 without TF32: spills)
        if HAS_SCALE:
            acc = tl.fma(acc, _row_scale(scale_ptr, order_ptr, rows, row_ok)[:, None], y_old)
        else:
            acc += y_old
    elif HAS_SCALE:
        acc = acc * _row_scale(scale_ptr, order_ptr, rows, row_ok)[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    tl.debug_barrier()  # every thread's stores happen before the release
    tl.atomic_add(sync_ptr + 1 + g, 1, sem="release")


# BLOCK_M is fixed (the table is cut in BLOCK_M-row tiles once per launch): 64 rows, the
# tensor-core tile; the autotuner picks the rest
WAVE_BLOCK_M = _INTERPRET_BLOCKS["BLOCK_M"] if INTERPRET else 64
WAVE_CONFIGS = [
    _cfg(64, 128, 64, 4, 2), _cfg(64, 64, 64, 4, 2), _cfg(64, 256, 64, 8, 2),
    _cfg(64, 128, 32, 4, 3), _cfg(64, 128, 64, 8, 3),
]


def _prune_to_table(configs, named_args, **kwargs):
    """The configs of `_prune_to_smem` (which may swap in the fp32 FMA ones) whose BLOCK_M is
    the table's: any other would add rows twice or leave them unwritten."""
    kept = [c for c in _prune_to_smem(configs, named_args, **kwargs)
            if c.kwargs["BLOCK_M"] == WAVE_BLOCK_M]
    assert kept, f"no scatter_wave_kernel config with BLOCK_M = {WAVE_BLOCK_M} fits"
    return kept


# every timing trial (and the run after them) starts from zeroed counters; a whole launch
# writes every row of Y (slot 0 does not read it), so Y needs no restoring
_scatter_wave = _autotune(scatter_wave_kernel, WAVE_CONFIGS,
                          ["N", "KD", "HAS_SCALE", "PRECISION"], _prune_to_table,
                          reset_to_zero=["sync_ptr"])

# tokens per block: the Y rows of one diagonal (K blocks) should stay well inside L2
L2_BUDGET_BYTES = 32 << 20  # of an H100's 50 MB


def wave_blocks(n_tokens: int, n_exp: int, n_slots: int, n_cols: int, elem_bytes: int) -> int:
    """B: enough blocks that a diagonal's K blocks of Y rows fit L2_BUDGET_BYTES, few enough
    that an (expert, slot, block) segment keeps about BLOCK_M rows or more (each segment
    ends in a part-filled tile), at most MAX_GROUPS / K and MAX_LANES / E."""
    want = cdiv(n_tokens * n_cols * elem_bytes * n_slots, L2_BUDGET_BYTES)
    cap = min(n_tokens // (n_exp * WAVE_BLOCK_M), MAX_GROUPS // n_slots,
              MAX_LANES // (next_power_of_2(n_exp) * n_slots))
    return max(1, min(want, cap))


def wave_problem(n_exp: int, n_slots: int, n_blocks: int = 1) -> str | None:
    """Why the one-launch scatter cannot take this routing (None: it can)."""
    groups = n_slots * n_blocks
    if groups > MAX_GROUPS or next_power_of_2(n_exp) * groups > MAX_LANES:
        return (f"E={n_exp}, K={n_slots}, {n_blocks} token blocks: the tile table holds at "
                f"most {MAX_GROUPS} slots x blocks and {MAX_LANES} experts (to a power of two) "
                "x slots x blocks")
    return None


def wave_table(tok_R, off_S, n_exp, n_tokens, n_blocks):
    """-> (tab [bound, 4], need [G + 1], sync [G + 2], all int32): the tiles of one launch
    (rows of the table past need[G] are garbage: scratch or unwritten), G = K * n_blocks
    groups, and the scatter's counters, zeroed."""
    K = _n_slots(off_S, n_exp)
    G = K * n_blocks
    bound = cdiv(tok_R.numel(), WAVE_BLOCK_M) + G * n_exp
    tab = torch.empty(bound, 4, dtype=torch.int32, device=tok_R.device)
    need = torch.empty(G + 1, dtype=torch.int32, device=tok_R.device)
    sync = torch.empty(G + 2, dtype=torch.int32, device=tok_R.device)
    wave_table_kernel[(1,)](
        tok_R, off_S, tab, need, sync, n_exp, K, n_blocks,
        cdiv(max(n_tokens, 1), n_blocks),
        BLOCK_M=WAVE_BLOCK_M, G_P2=next_power_of_2(G),
        E_P2=next_power_of_2(n_exp), num_warps=8)  # as kernels/triton_aot.py compiles it
    return tab, need, sync


@_on_tensor_device
def scatter_mm_wave(a_RK, w_EKN, tok_R, off_S, n_tokens, scale=None, order_R=None,
                    n_blocks=None):
    """`triton_launch.scatter_mm` in one launch (same arguments, same order of sums): Y [T, N]."""
    E, KD, N = w_EKN.shape
    K = _n_slots(off_S, E)
    B = n_blocks or wave_blocks(n_tokens, E, K, N, a_RK.element_size())
    if problem := wave_problem(E, K, B):
        raise ValueError(f"scatter_mm_wave: {problem}")
    tab, need, sync = wave_table(tok_R, off_S, E, n_tokens, B)
    y = torch.empty(n_tokens, N, dtype=a_RK.dtype, device=a_RK.device)
    grid = lambda META: (tab.shape[0] * cdiv(N, META["BLOCK_N"]),)  # noqa: E731
    launch_kernel(
        _scatter_wave, grid,
        a_RK, w_EKN, y, tok_R, tab, need, sync,
        scale if scale is not None else y, order_R if order_R is not None else tok_R,
        K, K * B, N, KD,
        a_RK.stride(0), a_RK.stride(1), *w_EKN.stride(), y.stride(0), y.stride(1),
        HAS_SCALE=scale is not None, WAIT=not INTERPRET,
        **_dot_args(a_RK.dtype), **_blocks(),  # (interpreter: BLOCK_M = WAVE_BLOCK_M)
    )
    if INTERPRET and int(sync[-1]) > 0:
        raise RuntimeError(f"scatter_mm_wave: {int(sync[-1])} tiles would wait on later ones")
    return y
