"""The attention's key and value projections, one product (Transformer-XL, Dai et al. 2019).

    [k ; v] = [W_k ; W_v] [memory ; segment]          ->  k, v as [B, H, L, C] views

Left to autograd, the usual `kv.view(B, L, 2, H, C).permute(2, 0, 3, 1, 4)` and unpacking
into k and v (unbind) cost two passes over the [B, L, 2HC] gradient in the backward: the
unbind's `stack` of dk and dv (a cat that reads both in SDPA's strided layout: run 4b's
`CatArrayBatchedCopy`, 0.53 ms a WT-B layer on an H200, 9.6 ms of the step) and the copy of
the stacked, permuted result into the product's [B * L, 2HC] rows. Here the backward joins
dk and dv row by row in one contiguous cat and runs the same two products as before: the
same values bit for bit (tests/test_kernels_key_value.py, against the plain autograd path).
"""
from __future__ import annotations

import torch

from sigma_moe.kernels.selector import compute_dtype


class _KeyValue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_BLD: torch.Tensor, w_ND: torch.Tensor, n_heads: int, dtype: torch.dtype):
        xc_BLD, wc_ND = x_BLD.to(dtype), w_ND.to(dtype)  # N = 2HC; no copy where in `dtype`
        ctx.save_for_backward(xc_BLD, wc_ND)
        ctx.dtypes = (x_BLD.dtype, w_ND.dtype)
        B, L, _ = xc_BLD.shape
        kv_BL2HC = torch.nn.functional.linear(xc_BLD, wc_ND).view(B, L, 2, n_heads, -1)
        return kv_BL2HC[:, :, 0].transpose(1, 2), kv_BL2HC[:, :, 1].transpose(1, 2)

    @staticmethod
    def backward(ctx, dk_BHLC: torch.Tensor, dv_BHLC: torch.Tensor):
        xc_BLD, wc_ND = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        B, L, D = xc_BLD.shape
        # [dk | dv] per row, the product's layout: SDPA hands back [B, L, H, C]-ordered
        # gradients, so each half is a plain [B * L, HC] view and the cat reads rows
        dkv_RN = torch.cat([g.transpose(1, 2).reshape(B * L, -1) for g in (dk_BHLC, dv_BHLC)],
                           dim=1)
        dx_BLD = dw_ND = None
        if ctx.needs_input_grad[0]:
            dx_BLD = (dkv_RN @ wc_ND).view(B, L, D).to(x_dtype)
        if ctx.needs_input_grad[1]:
            dw_ND = (dkv_RN.T @ xc_BLD.reshape(B * L, D)).to(w_dtype)
        return dx_BLD, dw_ND, None, None


def key_value(x_BLD: torch.Tensor, w_ND: torch.Tensor, n_heads: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """x_BLD [B, L, D] (memory + segment), w_ND [2 * n_heads * C, D] (keys' rows, then
    values') -> (k_BHLC, v_BHLC), in `compute_dtype(x_BLD)` (autocast's where it is on)."""
    return _KeyValue.apply(x_BLD, w_ND, n_heads, compute_dtype(x_BLD))
