"""Plain-PyTorch reference for the MoE expert computation (paper Eq. `moe_out`).

    y_t = sum_k gate[t, k] * W2[e_tk]^T dropout(relu(W1[e_tk]^T x_t))

The slow, obvious per-expert loop that every fast path (Triton, grouped_mm) is tested
against. Shapes: x_TD [tokens, d_model], expert_TK / gate_TK [tokens, K],
w1_EDG [N_E, d_model, G], w2_EGD [N_E, G, d_model].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_mlp_reference(
    x_TD: torch.Tensor,
    expert_TK: torch.Tensor,
    gate_TK: torch.Tensor,
    w1_EDG: torch.Tensor,
    w2_EGD: torch.Tensor,
    hidden_dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    T, K = expert_TK.shape
    y_TD = torch.zeros(T, w2_EGD.shape[-1], dtype=x_TD.dtype, device=x_TD.device)
    flat_expert = expert_TK.reshape(-1)
    flat_token = torch.arange(T, device=x_TD.device).repeat_interleave(K)
    flat_gate = gate_TK.reshape(-1)
    # an expert with no rows still runs (on none): y stays in the autograd graph with no
    # tokens at all (T = 0), as every other backend's does
    for e in range(w1_EDG.shape[0]):
        rows = (flat_expert == e).nonzero(as_tuple=True)[0]
        tok = flat_token[rows]
        h_RG = F.relu(x_TD[tok] @ w1_EDG[e])
        h_RG = F.dropout(h_RG, hidden_dropout, training)
        out_RD = (h_RG * flat_gate[rows, None].to(h_RG.dtype)) @ w2_EGD[e]
        y_TD = y_TD.index_add(0, tok, out_RD.to(y_TD.dtype))
    return y_TD
