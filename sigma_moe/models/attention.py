"""Transformer-XL relative multi-head attention (Dai et al. 2019, Sec. 3.3; docs/REFERENCE.md).

    score(i, j) = scale * [ (q_i + u)^T k_j + (q_i + v)^T R_{i-j} ]

R are sinusoidal encodings of the offset, projected by a bias-free linear layer; u and v
are learned per-head biases (zero at init); `scale` is a learnable scalar initialised to
1/sqrt(head_dim). Queries come from the current segment, keys/values from
[memory ; current]. Head count and size are independent of d_model (WT-S: 10 x 41, 412).
The positional term reaches SDPA as an additive bias, shifted and masked by `position_bias`
(torch) or, on CUDA, by sigma_moe/kernels/triton_relshift.py (one coalesced pass each way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigma_moe import kernels
from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn.base import trunc_normal_


@dataclass(frozen=True)
class AttentionConfig:
    d_model: int
    n_heads: int
    head_dim: int
    n_layers: int  # only for the init std

    def __post_init__(self) -> None:
        if self.d_model % 2:
            raise ConfigError(f"model.d_model={self.d_model} must be even (sinusoidal encodings)")


def sinusoid_encoding(distances_L: torch.Tensor, d_model: int) -> torch.Tensor:
    """[L] offsets -> [L, d_model] sinusoids (sin half, cos half)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=distances_L.device) / d_model))
    angles_LF = distances_L.float()[:, None] * inv_freq[None]
    return torch.cat([angles_LF.sin(), angles_LF.cos()], dim=-1)


def bd_width(L: int) -> int:
    """P, the row length of the positional scores bd_HBTP [H, B, T, P]: the L offsets and at
    least one spare column (the shift needs P >= L + 1), rounded up to 8 elements so that
    bd's rows are 16-byte aligned. With L + 1 = 1025 columns (WT-B), run 4b's H200 step
    profile has three cuBLAS `align1` kernels, one call a layer each in both models, which
    only bd's product and its two gradients explain: 35 + 25 + 16 ms of a 486 ms step
    (benchmarks/gpu_h200.md, item 17)."""
    return (L + 1 + 7) // 8 * 8


def head_pad(C: int) -> int:
    """Zero columns that take a head of C up to a multiple of 8 (16-byte rows in bf16)."""
    return -C % 8


def zero_pad(t: torch.Tensor, n: int, dim: int = -1) -> torch.Tensor:
    """t with n zeros appended along dim; t itself when n == 0 (F.pad would copy)."""
    if not n:
        return t
    return F.pad(t, [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, n])


def padded_heads(w_ND: torch.Tensor, n_heads: int, C: int) -> torch.Tensor:
    """A projection's weight [n * H * C, D] (n groups of H heads of C rows) with zero rows
    that take each head to C + head_pad(C): its products come out with padded heads."""
    return zero_pad(w_ND.view(-1, n_heads, C, w_ND.shape[-1]), head_pad(C), dim=2).flatten(0, 2)


def shifted_view(bd_HBTP: torch.Tensor, L: int) -> torch.Tensor:
    """Transformer-XL's relative shift as a strided view, no copy. bd_HBTP [H, B, T, P]
    holds scores over offsets [L-1 .. 0] in its first L columns, spare ones after them
    (P >= L + 1); the view [B, H, T, L] is out[b, h, i, j] = bd[h, b, i, j + T - 1 - i]
    (offset M + i - j). That element sits at i * P + j + T - 1 - i = i * (P - 1) + j + T - 1
    in its (h, b) block: a row stride of P - 1 from offset T - 1. Entries with j > M + i
    read the spare columns or the start of the next row; the mask removes them. (The usual
    pad-and-reshape shift makes two copies of the layer's largest tensor.)"""
    H, B, T, P = bd_HBTP.shape
    if not bd_HBTP.is_contiguous() or P < L + 1:  # the strides below assume both
        raise ValueError(f"shifted_view needs contiguous [H, B, T, P >= L + 1] scores, got "
                         f"{list(bd_HBTP.shape)} with L={L}")
    return bd_HBTP.as_strided((B, H, T, L), (T * P, B * T * P, P - 1, 1),
                              bd_HBTP.storage_offset() + T - 1)


def future_mask(T: int, L: int, device) -> torch.Tensor:
    """[T, L] bool, True where key j is after query i: j > M + i (M = L - T memory keys)."""
    return torch.ones(T, L, dtype=torch.bool, device=device).triu(L - T + 1)


def position_bias(bd_HBTP: torch.Tensor, L: int) -> torch.Tensor:
    """bd_HBTP [H, B, T, P] -> the additive attention bias [B, H, T, L]: the shifted view,
    -inf on the future keys. The reference of sigma_moe/kernels/triton_relshift.py."""
    T = bd_HBTP.shape[2]
    shifted_BHTL = shifted_view(bd_HBTP, L)
    # explicit [B, H, T, L] layout for SDPA (the view's strides are ordered H, B)
    bias_BHTL = bd_HBTP.new_empty(shifted_BHTL.shape)
    neg_inf = bd_HBTP.new_full((), float("-inf"))  # where(out=) takes tensors only
    return torch.where(future_mask(T, L, bd_HBTP.device), neg_inf, shifted_BHTL,
                       out=bias_BHTL)


def position_bias_grad(grad_BHTL: torch.Tensor, P: int) -> torch.Tensor:
    """`position_bias`'s backward: the bias's gradient [B, H, T, L] laid back into the
    [H, B, T, P] layout, zeros outside the window and on the future keys."""
    B, H, T, L = grad_BHTL.shape
    grad_HBTP = grad_BHTL.new_zeros(H, B, T, P)  # (the view leaves gaps where P > L + 1)
    torch.where(future_mask(T, L, grad_BHTL.device), grad_BHTL.new_zeros(()), grad_BHTL,
                out=shifted_view(grad_HBTP, L))
    return grad_HBTP


class _PositionBias(torch.autograd.Function):
    """`position_bias` with its backward; `fast`: by the Triton kernels (one coalesced pass
    each way, sigma_moe/kernels/triton_relshift.py) instead of torch.where on the strided view."""

    @staticmethod
    def forward(ctx, bd_HBTP: torch.Tensor, L: int, fast: bool) -> torch.Tensor:
        ctx.fast, ctx.P = fast, bd_HBTP.shape[-1]
        return (kernels.relshift_bias if fast else position_bias)(bd_HBTP, L)

    @staticmethod
    def backward(ctx, grad_BHTL: torch.Tensor):
        grad_fn = kernels.relshift_bias_grad if ctx.fast else position_bias_grad
        return grad_fn(grad_BHTL, ctx.P), None, None


class RelativeAttention(nn.Module):
    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        inner = cfg.n_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.pos = nn.Linear(cfg.d_model, inner, bias=False)
        self.out = nn.Linear(inner, cfg.d_model, bias=False)
        self.u_HC = nn.Parameter(torch.zeros(cfg.n_heads, cfg.head_dim))
        self.v_HC = nn.Parameter(torch.zeros(cfg.n_heads, cfg.head_dim))
        self.scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(cfg.head_dim)))
        for lin in (self.qkv, self.pos, self.out):
            trunc_normal_(lin.weight, math.sqrt(2 / (cfg.n_layers * lin.in_features)))

    def forward(self, h_BTD: torch.Tensor, mem_BMD: torch.Tensor | None) -> torch.Tensor:
        cfg = self.cfg
        B, T, D = h_BTD.shape
        H, C = cfg.n_heads, cfg.head_dim
        # heads zero-padded to a multiple of 8 wherever they meet, by zero rows in the
        # weights (no activation copies): no dot product changes, and SDPA can take its
        # fused kernels, which need C % 8 == 0 (WT-S's 41 fell back to the math kernel, in
        # fp32), and bd's product cuBLAS's aligned ones
        C8 = C + head_pad(C)
        w_q, w_kv = (padded_heads(w, H, C) for w in self.qkv.weight.split([H * C, 2 * H * C]))
        cat_BLD = h_BTD if mem_BMD is None else torch.cat([mem_BMD.to(h_BTD.dtype), h_BTD], 1)
        L = cat_BLD.shape[1]  # M = L - T memory positions, then the segment
        # one weight, two products: queries of the segment, keys/values of memory + segment
        q_BTHC = F.linear(h_BTD, w_q).view(B, T, H, C8)
        k_BHLC, v_BHLC = kernels.key_value(cat_BLD, w_kv, H)

        dist_L = torch.arange(L - 1, -1, -1, device=h_BTD.device)
        r_LD = sinusoid_encoding(dist_L, D).to(h_BTD.dtype)
        r_HLC = F.linear(r_LD, padded_heads(self.pos.weight, H, C)).view(L, H, C8).transpose(0, 1)
        # u, v and the scale in the activations' dtype: under autocast, fp32 parameters would
        # promote q (+u) and, through it, the [B, H, T, L] bias to fp32, which SDPA's autocast
        # then casts back: two full copies of the largest tensor of the layer, each way
        u_HC, v_HC = (zero_pad(p.to(q_BTHC.dtype), C8 - C) for p in (self.u_HC, self.v_HC))
        scale = self.scale.to(q_BTHC.dtype)
        # the positional scores over L offsets plus spare zero columns (bd_width), for the
        # strided shift; the scale goes on the [B, T, H, C] operand, not the [B, H, T, L] one
        P = bd_width(L)
        r_HCP = zero_pad(r_HLC, P - L, dim=1).transpose(1, 2)
        qv_HNC = ((q_BTHC + v_HC) * scale).permute(2, 0, 1, 3).reshape(H, B * T, C8)
        bd_HBTP = torch.bmm(qv_HNC, r_HCP).view(H, B, T, P)
        # shifted to key positions; key j is visible to query i iff j <= M + i (all memory
        # plus the causal past), -inf elsewhere
        bias_BHTL = _PositionBias.apply(bd_HBTP, L, kernels.relshift_available(bd_HBTP))
        # scale * [(q+u).k + bd]: fold the learnable scale into q, the positional term
        # into the additive mask, and let SDPA pick a fused kernel.
        q_BHTC = ((q_BTHC + u_HC) * scale).transpose(1, 2)
        o_BHTC = F.scaled_dot_product_attention(q_BHTC, k_BHLC, v_BHLC, attn_mask=bias_BHTL,
                                                scale=1.0)
        return self.out(o_BHTC[..., :C].transpose(1, 2).reshape(B, T, H * C))
