"""The selection network's product with the expert path's input (paper Sec. 3.3 and 4).

    logits = W3 x                                                   (Eq. `moe_out`'s sel(x))
    dL/dx  = W3^T dL/dlogits + (dL/dx of the experts)               (one addmm)

A MoE layer reads x twice: the selector's product and the experts. Left to autograd, under
autocast each use casts x on its own (two [T, D] copies, both kept for the backward), and
the backward casts each x gradient back and adds them in a separate pass over three [T, D]
tensors. `selector_logits` casts x once, hands the experts that same tensor, and gets both
gradients in one backward: the selector's x gradient is one addmm onto the experts'. Plain
autograd (`x @ w3.T`, and x passed on) is the reference it is tested against
(tests/test_kernels_selector.py).
"""
from __future__ import annotations

import torch


class _SelectorLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_TD: torch.Tensor, w_ED: torch.Tensor, dtype: torch.dtype):
        xc_TD, wc_ED = x_TD.to(dtype), w_ED.to(dtype)  # no copy where already in `dtype`
        ctx.save_for_backward(xc_TD, wc_ED)
        ctx.dtypes = (x_TD.dtype, w_ED.dtype)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not zeros
        return xc_TD @ wc_ED.T, xc_TD

    @staticmethod
    def backward(ctx, dlogits_TE: torch.Tensor | None, dxc_TD: torch.Tensor | None):
        xc_TD, wc_ED = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        dx_TD = dw_ED = None
        if ctx.needs_input_grad[0]:
            if dlogits_TE is None:
                dx_TD = dxc_TD
            elif dxc_TD is None:
                dx_TD = dlogits_TE @ wc_ED
            else:  # the experts' x gradient is the product's C operand: no separate add
                dx_TD = torch.addmm(dxc_TD, dlogits_TE, wc_ED)
            dx_TD = None if dx_TD is None else dx_TD.to(x_dtype)
        if ctx.needs_input_grad[1] and dlogits_TE is not None:
            dw_ED = (dlogits_TE.T @ xc_TD).to(w_dtype)
        return dx_TD, dw_ED, None


def compute_dtype(x_TD: torch.Tensor) -> torch.dtype:
    """The dtype products of x compute in (a MoE layer, the selector's and the attention's
    key-value products): autocast's where it is on (custom ops would see mixed dtypes
    otherwise), except for float64, which autocast leaves alone."""
    if torch.is_autocast_enabled(x_TD.device.type) and x_TD.dtype != torch.float64:
        return torch.get_autocast_dtype(x_TD.device.type)
    return x_TD.dtype


def selector_logits(x_TD: torch.Tensor, w_ED: torch.Tensor, backend: str = "auto"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits_TE = x_TD @ w_ED.T, x_TD for the experts), both in `compute_dtype(x_TD)`.
    Pass the second to `moe_mlp` (with the same `backend`) in place of x: the backward then
    adds the two x gradients inside the selector's product. The reference backend computes
    in its inputs' own dtypes: it gets x as given, beside plain autograd's product."""
    if x_TD.dim() != 2:
        raise ValueError(f"selector_logits takes x as [tokens, d_model], not "
                         f"{list(x_TD.shape)}: flatten its leading dims first")
    if backend == "reference":
        return x_TD @ w_ED.T, x_TD
    return _SelectorLogits.apply(x_TD, w_ED, compute_dtype(x_TD))
