"""MoE expert kernels (CVMM). Importable with torch (+ triton) alone: no Hydra here.

`moe_mlp` is the one entry point the FFN variants call; for now it is the plain PyTorch
reference (the fast paths land with the kernel issue).
"""
from kernels.reference import moe_mlp_reference


def moe_mlp(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout=0.0, training=False,
            backend="auto"):
    """y_t = sum_k gate[t,k] * W2[e_tk]^T dropout(relu(W1[e_tk]^T x_t)); see reference.py."""
    return moe_mlp_reference(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout, training)


__all__ = ["moe_mlp", "moe_mlp_reference"]
