"""Triton kernels of the CVMM (paper App. "A Few Words on the CUDA Kernel", Eq. `cvmm`).

    cvmm(V, S, M)[n, l] = sum_m V[n, m] M[S[n], m, l]

on rows sorted by expert (sigma_moe/kernels/routing.py). Three kernels cover the whole sigma-MoE
layer (Eq. `moe_out`) and its backward:

- `gather_mm_kernel`: C[r] = epilogue(A[tok[r]] @ W[e_r]) -- the input-row gather is fused
  into the load (A is token-indexed, C is in sorted order). Epilogues: none, ReLU (fused
  up-projection), or the fused backward of gate*relu (d gate partial sums, d pre-ReLU,
  and gate*h for the down-projection's weight gradient).
- `scatter_mm_kernel`: Y[tok[r]] (+)= scale_r * (A[r] @ W[e_r]) for the rows of ONE slot k.
  Launched for k = 0..K-1 in order: inside a slot every token occurs once, so the K expert
  outputs of a token are summed in a fixed order, in place, with no atomics and no
  T*K*D buffer (the down-projection, and the input gradient of any gathered CVMM). With
  C token chunks, chunk by chunk: a chunk's K launches touch only its output rows.
- `wgrad_kernel`: dW[e] = sum_{r of e} A[ia_r]^T B[ib_r]. One program owns one output tile
  of one chunk of an expert's rows and walks it in order; an expert of several chunks gets
  fp32 partials that `wgrad_reduce_kernel` sums in chunk order: deterministic, no atomics
  (the original and its Triton successor used atomics).

Weights come in as W[e, k, n] with arbitrary strides, so W^T (the input gradients) is a
stride swap, not a copy. Accumulation is fp32; DOT_F32 upcasts the tiles (fp32 inputs, and
the interpreter, which computes bf16 dots wrongly).
"""
import os

import triton
import triton.language as tl

EPI_NONE, EPI_RELU, EPI_GATE_RELU_BWD = 0, 1, 2


def _segment_tile(pid_m, off_ptr, n_seg, seg_stride, seg_first, seg_len, reverse,
                  BLOCK_M: tl.constexpr, SEG_P2: tl.constexpr):
    """Row tile number pid_m of the segments s < n_seg, each cut into BLOCK_M-row tiles.

    Segment s spans rows off[s*seg_stride + seg_first] : off[s*seg_stride + seg_first +
    seg_len]: seg_len consecutive segments of sigma_moe/kernels/routing.py (the gather's (expert,
    slot) segment is C chunk sub-segments, a scatter launch takes one of them). Tiles are
    numbered round by round -- tile 0 of every segment, then tile 1 of every segment, ... --
    so the programs running at the same time cover the same token range in every expert and
    slot (rows are token-sorted inside a segment): L2 serves each gathered x / dy row once
    for its K uses, and the slot kernel's output rows are written by programs close in time.
    `reverse` numbers from the end: alternate launches of the scatter kernel first re-read
    the output rows that the launch before wrote last (still in L2). Computed in-kernel (no
    host-side tile table) so that BLOCK_M can be autotuned; the binary search takes
    log2(tiles per segment) steps.
    -> (s, first row of the tile, end row of s); s == n_seg when there is no such tile.
    """
    s = tl.arange(0, SEG_P2)
    valid = s < n_seg
    start = tl.load(off_ptr + s * seg_stride + seg_first, mask=valid, other=0)
    end = tl.load(off_ptr + s * seg_stride + seg_first + seg_len, mask=valid, other=0)
    n_blk = tl.where(valid, (end - start + BLOCK_M - 1) // BLOCK_M, 0)
    total = tl.sum(n_blk, 0)
    pid_m = pid_m + reverse * (total - 1 - 2 * pid_m)  # arithmetic: `reverse` may be constexpr
    has_tile = (pid_m >= 0) & (pid_m < total)
    # round j = the largest j with sum_s min(n_blk[s], j) <= pid_m: binary search on [lo, hi)
    # (empty for the programs with no tile: the grid's upper bound makes up to E*K of them)
    lo = pid_m * 0
    hi = tl.where(has_tile, tl.max(n_blk, 0), lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        go = tl.sum(tl.minimum(n_blk, mid), 0) <= pid_m
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    # within round lo: the rank-th segment that still has a tile
    rank = pid_m - tl.sum(tl.minimum(n_blk, lo), 0)
    seg = tl.sum((tl.cumsum((n_blk > lo).to(tl.int32), 0) <= rank).to(tl.int32), 0)
    here = s == seg
    row0 = tl.sum(tl.where(here, start, 0), 0) + lo * BLOCK_M
    row_end = tl.sum(tl.where(here, end, 0), 0)
    seg = tl.where(has_tile, seg, n_seg)
    return seg, row0, row_end


def _expert_chunks(off_ptr, n_exp, segs_per_expert, chunk_rows, SEG_P2: tl.constexpr):
    """Every expert's rows cut into chunks of at most chunk_rows (an expert without rows:
    one empty chunk), a lane an expert. -> (lanes s, first row, end row, chunks of s)."""
    s = tl.arange(0, SEG_P2)
    valid = s < n_exp
    start = tl.load(off_ptr + s * segs_per_expert, mask=valid, other=0)
    end = tl.load(off_ptr + (s + 1) * segs_per_expert, mask=valid, other=0)
    n_chunks = tl.where(valid, tl.maximum((end - start + chunk_rows - 1) // chunk_rows, 1), 0)
    return s, start, end, n_chunks


def _first_slot(s, e, n_chunks):
    """Expert e's first partial slot: the partials of the experts before it that have more
    than one chunk come first."""
    return tl.sum(tl.where((s < e) & (n_chunks > 1), n_chunks, 0), 0)


def _wgrad_item(item, off_ptr, n_exp, segs_per_expert, chunk_rows, SEG_P2: tl.constexpr):
    """Work item `item` of the weight gradient: the chunks of `_expert_chunks`, numbered
    expert by expert. -> (e, first row, end row, the number of chunks of e, the partial
    slot of this chunk); e == n_exp when there is no such item."""
    s, start, end, n_chunks = _expert_chunks(off_ptr, n_exp, segs_per_expert, chunk_rows,
                                             SEG_P2)
    upto = tl.cumsum(n_chunks, 0)  # items of the experts <= s
    e = tl.sum(((s < n_exp) & (upto <= item)).to(tl.int32), 0)
    here = s == e
    n_e = tl.sum(tl.where(here, n_chunks, 0), 0)
    c = item - tl.sum(tl.where(here, upto, 0), 0) + n_e
    row0 = tl.sum(tl.where(here, start, 0), 0) + c * chunk_rows
    row_end = tl.minimum(tl.sum(tl.where(here, end, 0), 0), row0 + chunk_rows)
    return e, row0, row_end, n_e, _first_slot(s, e, n_chunks) + c


INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# The interpreter re-patches triton.language at every call of a @triton.jit helper; there
# the helper runs as the plain Python it is.
if not INTERPRET:
    _segment_tile = triton.jit(_segment_tile)
    _expert_chunks = triton.jit(_expert_chunks)
    _first_slot = triton.jit(_first_slot)
    _wgrad_item = triton.jit(_wgrad_item)


@triton.jit
def _rows_times_expert(
    a_ptr, w_ptr, a_rows, row_ok, cols, col_ok, e, KD,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn,
    DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """fp32 tile A[a_rows, :] @ W[e][:, cols], walking the shared dimension KD."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak
    w_ptrs = (w_ptr + e.to(tl.int64) * stride_we
              + ks[:, None] * stride_wk + cols[None, :] * stride_wn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KD, BLOCK_K):
        k_ok = ks < KD - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def gather_mm_kernel(
    a_ptr, w_ptr, c_ptr, tok_ptr, off_ptr,
    h_ptr, gate_ptr, order_ptr, gpart_ptr, gh_ptr,  # EPI_GATE_RELU_BWD only
    n_exp, n_slots, n_chunks, N, KD, stride_gpart,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_cm, stride_cn,
    EPILOGUE: tl.constexpr, DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr, SEG_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """C[r, :] = epilogue(A[tok[r], :] @ W[e_r]), r over expert segments.

    EPI_GATE_RELU_BWD: the product is d loss/d(gate*h); with h (same layout as C) and the
    gate it stores C = d loss/d pre-ReLU, GH = gate*h (the down-projection's input, for its
    weight gradient) and the partial d gate of this column tile.
    """
    pid = tl.program_id(0)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    pid_n = pid % n_tiles_n  # N tiles innermost: neighbours share the A rows in L2
    pid_m = pid // n_tiles_n
    # slot segments (not whole experts): tiles of all K slots of a token range run together;
    # with token chunks (chunks_in_slots routing) a slot segment is n_chunks sub-segments
    seg, row0, row_end = _segment_tile(pid_m, off_ptr, n_exp * n_slots, n_chunks, 0,
                                       n_chunks, 0, BLOCK_M, SEG_P2)
    if seg >= n_exp * n_slots:
        return
    e = seg // n_slots
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    a_rows = tl.load(tok_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    rows64 = rows.to(tl.int64)
    mask = row_ok[:, None] & col_ok[None, :]
    c_off = rows64[:, None] * stride_cm + cols[None, :] * stride_cn
    # FMA products (fp32 without TF32) have no registers to spare for an early h tile (ptxas
    # spills); tensor-core ones load it before the product, to hide its latency behind it
    EARLY_H: tl.constexpr = EPILOGUE == 2 and PRECISION != "ieee"
    if EARLY_H:
        h = tl.load(h_ptr + c_off, mask=mask, other=0.0)
    acc = _rows_times_expert(a_ptr, w_ptr, a_rows, row_ok, cols, col_ok, e, KD,
                             stride_am, stride_ak, stride_we, stride_wk, stride_wn,
                             DOT_F32, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    if EPILOGUE == 1:
        acc = tl.maximum(acc, 0.0)
    if EPILOGUE == 2:
        if not EARLY_H:
            h = tl.load(h_ptr + c_off, mask=mask, other=0.0)
        h = h.to(tl.float32)
        flat = tl.load(order_ptr + rows, mask=row_ok, other=0)
        g = tl.load(gate_ptr + flat, mask=row_ok, other=0.0).to(tl.float32)
        # d gate = <d(gate*h)_r, h_r> over this column tile, stored at the row's flat index
        # t*K+k; the caller adds the tiles in a fixed order (deterministic, no atomics)
        tl.store(gpart_ptr + pid_n * stride_gpart + flat, tl.sum(acc * h, 1), mask=row_ok)
        # h > 0 is the ReLU mask (and the dropout mask, when h was dropped out)
        acc = tl.where(h > 0, acc * g[:, None], 0.0)
        tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=mask)
        tl.store(gh_ptr + c_off, (h * g[:, None]).to(gh_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scaled_sum(acc, y_old, scale, HAS_SCALE: tl.constexpr, ACCUMULATE: tl.constexpr):
    """A scatter tile's fp32 output: scale_r * product (+ the earlier slots' sums y_old);
    y_old and scale are read only where ACCUMULATE and HAS_SCALE say. scale * product + sums
    is one rounding in every config, written out: the compiler fuses a multiply and an add
    only where both sit in one basic block, so the code around them would decide the last
    bit (run 4: a multiply and an add a branch apart differed from this by one bf16 ulp)."""
    if ACCUMULATE:
        if HAS_SCALE:
            acc = tl.fma(acc, scale[:, None], y_old.to(tl.float32))
        else:
            acc += y_old.to(tl.float32)
    elif HAS_SCALE:
        acc = acc * scale[:, None]
    return acc


@triton.jit
def _scatter_row_tile(
    a_ptr, w_ptr, y_ptr, tok_ptr, scale_ptr, order_ptr, e, row0, row_end, tile_n0, N, KD,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
    HAS_SCALE: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, N_TILES: tl.constexpr, EARLY_Y: tl.constexpr,
):
    """`scatter_mm_kernel`'s column tiles tile_n0 .. tile_n0 + N_TILES - 1 of one row tile,
    in a loop: the whole reduction (KD <= BLOCK_K) in one A tile loaded once. EARLY_Y: read
    the next tile's earlier sums while this one's product runs (the pipeliner fetches only
    the W tiles ahead: a load that feeds a product)."""
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < KD
    a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :] * stride_ak,
                mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
    if DOT_F32:
        a = a.to(tl.float32)
    if HAS_SCALE:
        flat = tl.load(order_ptr + rows, mask=row_ok, other=0)
        scale = tl.load(scale_ptr + flat, mask=row_ok, other=0.0).to(tl.float32)
    out_rows = tl.load(tok_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    cols = tile_n0 * BLOCK_N + tl.arange(0, BLOCK_N)
    w_ptrs = (w_ptr + e.to(tl.int64) * stride_we + ks[:, None] * stride_wk
              + cols[None, :] * stride_wn)
    y_ptrs = y_ptr + out_rows[:, None] * stride_ym + cols[None, :] * stride_yn
    if ACCUMULATE and EARLY_Y:
        y_next = tl.load(y_ptrs, mask=row_ok[:, None] & (cols < N)[None, :], other=0.0)
    for j in range(0, N_TILES):
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if DOT_F32:
            w = w.to(tl.float32)
        if ACCUMULATE:
            if EARLY_Y:
                y_old = y_next
                ahead = (cols + BLOCK_N < N) & (j + 1 < N_TILES)
                y_next = tl.load(y_ptrs + BLOCK_N * stride_yn,
                                 mask=row_ok[:, None] & ahead[None, :], other=0.0)
            else:
                y_old = tl.load(y_ptrs, mask=mask, other=0.0)
        acc = _scaled_sum(tl.dot(a, w, input_precision=PRECISION),
                          y_old if ACCUMULATE else None, scale if HAS_SCALE else None,
                          HAS_SCALE, ACCUMULATE)
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        cols += BLOCK_N
        w_ptrs += BLOCK_N * stride_wn
        y_ptrs += BLOCK_N * stride_yn


# unspecialised: Triton would compile `seg` or `reverse` of 1 as a variant of its own, and
# segs_per_expert (K*C) 16 or 32 as one with 16-divisible offsets, one compile more for
# every config of each scatter
@triton.jit(do_not_specialize=["segs_per_expert", "seg", "reverse"])
def scatter_mm_kernel(
    a_ptr, w_ptr, y_ptr, tok_ptr, off_ptr, scale_ptr, order_ptr,
    n_exp, segs_per_expert, seg, reverse, N, KD,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
    HAS_SCALE: tl.constexpr, ACCUMULATE: tl.constexpr, DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr, SEG_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EARLY_Y: tl.constexpr = False, N_TILES: tl.constexpr = 1,
):
    """Y[tok[r], :] (+)= scale[order[r]] * (A[r, :] @ W[e_r]) for the rows r of one slot
    (of one token chunk): segment `seg` of every expert, off[e*segs_per_expert + seg].

    EARLY_Y (an autotuned choice): read the earlier slots' sums before the product (in the
    column loop: one tile ahead), so the read overlaps it, at the cost of registers (fewer
    programs per SM).
    N_TILES > 1 (autotuned; only where KD <= BLOCK_K): one program walks N_TILES column
    tiles of its rows in a loop, with the A rows loaded once. The reduction is short (G,
    1-2 steps of BLOCK_K), so a one-tile program is load, product, read-add-write in
    series; in the loop the pipeliner fetches the next tile's W while this one's sums are
    read and written."""
    pid = tl.program_id(0)
    n_tiles_n = tl.cdiv(tl.cdiv(N, BLOCK_N), N_TILES)  # column tiles (of N_TILES) per row tile
    pid_n = pid % n_tiles_n
    pid_m = pid // n_tiles_n
    e, row0, row_end = _segment_tile(pid_m, off_ptr, n_exp, segs_per_expert, seg, 1, reverse,
                                     BLOCK_M, SEG_P2)
    if e >= n_exp:
        return
    if N_TILES > 1:
        _scatter_row_tile(a_ptr, w_ptr, y_ptr, tok_ptr, scale_ptr, order_ptr, e, row0,
                          row_end, pid_n * N_TILES, N, KD, stride_am, stride_ak, stride_we,
                          stride_wk, stride_wn, stride_ym, stride_yn, HAS_SCALE, ACCUMULATE,
                          DOT_F32, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, N_TILES, EARLY_Y)
        return
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    out_rows = tl.load(tok_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    y_ptrs = y_ptr + out_rows[:, None] * stride_ym + cols[None, :] * stride_yn
    mask = row_ok[:, None] & col_ok[None, :]
    # slots before this one already wrote these tokens; no other program of this one does
    if ACCUMULATE and EARLY_Y:
        y_old = tl.load(y_ptrs, mask=mask, other=0.0)
    if HAS_SCALE:
        flat = tl.load(order_ptr + rows, mask=row_ok, other=0)
        scale = tl.load(scale_ptr + flat, mask=row_ok, other=0.0).to(tl.float32)
    acc = _rows_times_expert(a_ptr, w_ptr, rows.to(tl.int64), row_ok, cols, col_ok, e, KD,
                             stride_am, stride_ak, stride_we, stride_wk, stride_wn,
                             DOT_F32, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    if ACCUMULATE and not EARLY_Y:
        y_old = tl.load(y_ptrs, mask=mask, other=0.0)
    acc = _scaled_sum(acc, y_old if ACCUMULATE else None, scale if HAS_SCALE else None,
                      HAS_SCALE, ACCUMULATE)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["segs_per_expert", "n_exp", "chunk_rows"])
def wgrad_kernel(
    a_ptr, b_ptr, dw_ptr, ws_ptr, tok_ptr, off_ptr,
    segs_per_expert, n_exp, chunk_rows, M, N,
    stride_am, stride_ak, stride_bm, stride_bn, stride_we, stride_wm, stride_wn,
    GATHER_A: tl.constexpr, GATHER_B: tl.constexpr,
    DOT_F32: tl.constexpr, PRECISION: tl.constexpr, SEG_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dW[e, m, n] = sum over rows r of expert e of A[ia_r, m] * B[ib_r, n].

    A program owns one output tile of one chunk of an expert's rows (`_wgrad_item`) and
    walks the chunk in sorted order: an expert of one chunk (or none: an exact zero) gets
    its tile written here; an expert of several (one that routing gave more than
    chunk_rows rows) gets an fp32 partial per chunk in ws, which wgrad_reduce_kernel sums
    in chunk order. Every sum has a fixed order: deterministic, no atomics.
    """
    pid = tl.program_id(0)
    e, start, end, n_e, slot = _wgrad_item(tl.program_id(1), off_ptr, n_exp, segs_per_expert,
                                           chunk_rows, SEG_P2)
    if e >= n_exp:  # past the last chunk (the grid's bound is the most there can be)
        return
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // n_tiles_n
    pid_n = pid % n_tiles_n
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = ms < M
    n_ok = ns < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        rows = r0 + tl.arange(0, BLOCK_K)
        r_ok = rows < end
        if GATHER_A:
            ra = tl.load(tok_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        else:
            ra = rows.to(tl.int64)
        if GATHER_B:
            rb = tl.load(tok_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        else:
            rb = rows.to(tl.int64)
        at = tl.load(a_ptr + ra[None, :] * stride_am + ms[:, None] * stride_ak,
                     mask=m_ok[:, None] & r_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + rb[:, None] * stride_bm + ns[None, :] * stride_bn,
                    mask=r_ok[:, None] & n_ok[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        if DOT_F32:
            at = at.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(at, b, acc, input_precision=PRECISION)
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if n_e == 1:
        dw_ptrs = (dw_ptr + e.to(tl.int64) * stride_we
                   + ms[:, None] * stride_wm + ns[None, :] * stride_wn)
        tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=tile_ok)
    else:  # ws [slots, M, N], contiguous fp32
        ws_ptrs = ws_ptr + (slot.to(tl.int64) * M + ms[:, None]) * N + ns[None, :]
        tl.store(ws_ptrs, acc, mask=tile_ok)


@triton.jit(do_not_specialize=["segs_per_expert", "n_exp", "chunk_rows"])
def wgrad_reduce_kernel(
    ws_ptr, dw_ptr, off_ptr, segs_per_expert, n_exp, chunk_rows, M, N,
    stride_we, stride_wm, stride_wn,
    SEG_P2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dW[e] of an expert in more than one chunk: its chunks' partials summed, first chunk
    first (wgrad_kernel wrote every other expert's)."""
    pid = tl.program_id(0)
    e = tl.program_id(1)
    s, _, _, n_chunks = _expert_chunks(off_ptr, n_exp, segs_per_expert, chunk_rows, SEG_P2)
    n_e = tl.sum(tl.where(s == e, n_chunks, 0), 0)
    if n_e == 1:
        return
    slot = _first_slot(s, e, n_chunks)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    ms = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile_ok = (ms < M)[:, None] & (ns < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c in range(0, n_e):
        ws_ptrs = ws_ptr + ((slot + c).to(tl.int64) * M + ms[:, None]) * N + ns[None, :]
        acc += tl.load(ws_ptrs, mask=tile_ok, other=0.0)
    dw_ptrs = (dw_ptr + e.to(tl.int64) * stride_we
               + ms[:, None] * stride_wm + ns[None, :] * stride_wn)
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=tile_ok)
