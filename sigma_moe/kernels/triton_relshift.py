"""Transformer-XL's relative shift with the causal mask, one Triton pass each way
(Dai et al. 2019, App. B; sigma_moe/models/attention.py builds the scores, SDPA takes the bias).

    bias[b, h, i, j] = bd[h, b, i, j + T - 1 - i]  if j <= M + i  else -inf      (forward)
    dbd[h, b, i, p]  = dbias[b, h, i, p - T + 1 + i]  where 0 <= that <= M + i, else 0

bd_HBTP [H, B, T, P] holds each query's positional scores over the offsets L-1 .. 0 in its
first L columns, spare ones after them (P >= L + 1, sigma_moe/models/attention.bd_width); M = L - T
memory positions. In plain torch (sigma_moe/models/attention.py, the reference these kernels are
tested against) both directions are a `torch.where` over a strided view of bd with a
broadcast [T, L] mask: TensorIterator cannot vectorise it (the view's (h, b) blocks are not
contiguous with each other), and at WT-B's [64, 16, 512, 1024] each call took 1.55 ms on an
H200 where moving its 2.1 GB takes ~0.5 ms: 36 calls and 56 ms of a 486 ms step. Here a
program copies ROWS rows, each row a contiguous run of the source and of the destination;
no mask tensor is read.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from sigma_moe.kernels.triton_launch import _on_tensor_device
from sigma_moe.kernels.triton_tuning import cdiv

ROWS, BLOCK_C, WARPS = 8, 256, 4  # 2048 elements a tile: a bandwidth kernel, ~16 a thread


@triton.jit
def relshift_kernel(src_ptr, dst_ptr, n_rows, H, B, T, L, P, FILL: tl.constexpr,
                    BACKWARD: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    # rows in bd's [H, B, T] order; the bias's row of the same (b, h, i) is m
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    i = n % T
    hb = n // T
    m = ((hb % B) * H + hb // B) * T + i
    n64, m64 = n.to(tl.int64), m.to(tl.int64)
    shift = T - 1 - i  # bd column of the bias's column j = 0
    last = L - T + i  # the last visible key, M + i
    row_ok = n < n_rows
    width = P if BACKWARD else L  # the destination's row
    for c0 in range(0, width, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        if BACKWARD:  # destination bd column c, source bias column j
            j = c[None, :] - shift[:, None]
            src = src_ptr + m64[:, None] * L + j
            dst = dst_ptr + n64[:, None] * P + c[None, :]
        else:
            j = c[None, :] + tl.zeros_like(shift)[:, None]
            src = src_ptr + n64[:, None] * P + (j + shift[:, None])
            dst = dst_ptr + m64[:, None] * L + c[None, :]
        in_dst = row_ok[:, None] & (c[None, :] < width)
        visible = (j >= 0) & (j <= last[:, None])
        tl.store(dst, tl.load(src, mask=in_dst & visible, other=FILL), mask=in_dst)


def _shapes(src: Tensor, width: int, backward: bool) -> tuple[tuple, tuple]:
    """-> ((H, B, T, L, P), the result's shape) of a relshift of `src`."""
    if backward:  # src: the bias's gradient [B, H, T, L]; width: bd's P
        B, H, T, L = src.shape
        return (H, B, T, L, width), (H, B, T, width)
    H, B, T, P = src.shape  # src: bd [H, B, T, P]; width: the bias's L
    return (H, B, T, width, P), (B, H, T, width)


@torch.library.custom_op("sigma_moe::relshift", mutates_args=())
def relshift(src: Tensor, width: int, backward: bool) -> Tensor:
    """Forward: bd [H, B, T, P] -> the masked, shifted bias [B, H, T, L = width]; backward:
    the bias's gradient [B, H, T, L] -> bd's [H, B, T, P = width] (zero where unread)."""
    (H, B, T, L, P), shape = _shapes(src, width, backward)
    if not T <= L < P:
        raise ValueError(f"relshift: needs T <= L < P (queries, keys, bd's row), got T={T}, "
                         f"L={L}, P={P}")
    dst = src.new_empty(shape)
    if dst.numel():
        _launch(src.contiguous(), dst, H, B, T, L, P, backward)
    return dst


@relshift.register_fake
def _(src, width, backward):
    return src.new_empty(_shapes(src, width, backward)[1])


@_on_tensor_device  # Triton launches on the current device, not on the tensors'
def _launch(src: Tensor, dst: Tensor, H: int, B: int, T: int, L: int, P: int,
            backward: bool) -> None:
    n_rows = H * B * T
    relshift_kernel[(cdiv(n_rows, ROWS),)](
        src, dst, n_rows, H, B, T, L, P, FILL=0.0 if backward else float("-inf"),
        BACKWARD=backward, ROWS=ROWS, BLOCK_C=BLOCK_C, num_warps=WARPS)


def relshift_bias(bd_HBTP: Tensor, L: int) -> Tensor:
    """bd_HBTP [H, B, T, P] -> the masked, shifted bias [B, H, T, L]."""
    return relshift(bd_HBTP, L, False)


def relshift_bias_grad(grad_BHTL: Tensor, P: int) -> Tensor:
    """The bias's gradient [B, H, T, L] -> bd's [H, B, T, P] (zero where unread)."""
    return relshift(grad_BHTL, P, True)
