"""Expert selection's top-K in one Triton kernel (paper Eq. `moe_out`: E_x = argtopk(s, K)).

    expert_TK[t] = the K largest s[t, :], largest first; NaN ranks above everything,
    +inf included (as torch.topk); ties to the lower expert id (torch.topk's tie order
    is unspecified: the values match, the ids of equal scores may not)

The rows are short (E = 8-512 experts) and many (32768 tokens): torch.topk sorts each row's
K results in a second kernel and took 79 us of the fused layer's 1275 (H200, bf16, T 32768,
E 32, K 4), where reading s takes ~1 us. Here a program holds BLOCK_T whole rows in
registers and takes K maxima. Only the ids come from the kernel: the caller gathers the
gates from s, so autograd (the gather's backward) needs no kernel of its own.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from sigma_moe.kernels.triton_launch import _on_tensor_device
from sigma_moe.kernels.triton_tuning import cdiv, next_power_of_2


@triton.jit
def topk_kernel(s_ptr, idx_ptr, T, E, stride_t, stride_e,
                K: tl.constexpr, E_P2: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, E_P2)
    row_ok = rows < T
    col_ok = cols < E
    s = tl.load(s_ptr + rows[:, None].to(tl.int64) * stride_t + cols[None, :] * stride_e,
                mask=row_ok[:, None] & col_ok[None, :], other=float("-inf")).to(tl.float32)
    nan = s != s
    # a chosen -inf is still the max of what is left: mark taken ids instead of overwriting
    free = col_ok[None, :] & (rows[:, None] >= 0)  # [BLOCK_T, E_P2]
    for k in range(K):
        # NaN ranks above everything (+inf included), as in torch.topk
        free_nan = free & nan
        has_nan = tl.max(free_nan.to(tl.int32), 1) > 0
        best = tl.max(tl.where(free & ~nan, s, float("-inf")), 1)
        hit = tl.where(has_nan[:, None], free_nan, free & (s == best[:, None]))
        idx = tl.min(tl.where(hit, cols[None, :], E_P2), 1)
        tl.store(idx_ptr + rows.to(tl.int64) * K + k, idx.to(tl.int64), mask=row_ok)
        free = free & (cols[None, :] != idx[:, None])


def _block_t(e_p2: int) -> int:
    # ~4096 values a program (32 per thread with 4 warps): many programs, no spills
    return max(1, min(128, 4096 // e_p2))


@_on_tensor_device  # Triton launches on the current device, not on the tensors'
def _launch(s_TE: Tensor, idx_TK: Tensor) -> None:
    T, E = s_TE.shape
    e_p2 = next_power_of_2(E)
    block_t = _block_t(e_p2)
    topk_kernel[(cdiv(T, block_t),)](s_TE, idx_TK, T, E, s_TE.stride(0), s_TE.stride(1),
                                     K=idx_TK.shape[1], E_P2=e_p2, BLOCK_T=block_t)


@torch.library.custom_op("sigma_moe::topk_ids", mutates_args=())
def topk_ids(s_TE: Tensor, k: int) -> Tensor:
    """int64 [T, K]: the ids of the K largest entries of each row, largest first."""
    if s_TE.dim() != 2 or not 1 <= k <= s_TE.shape[1]:
        raise ValueError(f"topk_ids: needs s_TE [T, E] and 1 <= k <= E, got {list(s_TE.shape)} "
                         f"and k={k}")
    idx_TK = torch.empty(s_TE.shape[0], k, dtype=torch.int64, device=s_TE.device)
    if s_TE.shape[0] > 0:
        _launch(s_TE, idx_TK)
    return idx_TK


@topk_ids.register_fake
def _(s_TE, k):
    return s_TE.new_empty(s_TE.shape[0], k, dtype=torch.int64)
