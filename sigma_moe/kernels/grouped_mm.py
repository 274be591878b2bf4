"""sigma-MoE expert path on `torch._grouped_mm` (paper Eq. `moe_out`), for comparison.

    xs_RD = x[tok_R];  h_RG = relu(grouped_mm(xs, W1));  y_t = sum_k (gate * h) W2

One grouped GEMM per projection over the expert-sorted rows (sigma_moe/kernels/routing.py); plain
PyTorch autograd does the rest. Unlike the fused Triton path it materialises the gathered
input (R x D) and the K-times-expanded output (R x D) before summing the K slots -- the
layout of ScatterMoE / MegaBlocks-style MoEs, kept here as the baseline to beat.
The sum over slots is a gather through the inverse permutation, not an index_add, so it is
deterministic on a GPU too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_mm_problem(x_TD: torch.Tensor, w1_EDG: torch.Tensor) -> str | None:
    """Why this path cannot run on these inputs, or None when it can."""
    if not hasattr(torch, "_grouped_mm"):
        return "torch._grouped_mm does not exist in this torch (needs torch >= 2.8)"
    if x_TD.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {x_TD.dtype} (needs float32, float16 or bfloat16)"
    if x_TD.is_cuda:
        if x_TD.dtype != torch.bfloat16:
            return f"dtype {x_TD.dtype} on CUDA (torch._grouped_mm needs bfloat16 there)"
        if torch.cuda.get_device_capability(x_TD.device) < (9, 0):
            return "a CUDA device older than sm90 (torch._grouped_mm needs Hopper or newer)"
    elif torch.compiler.is_compiling() and x_TD.dtype != torch.bfloat16:
        return f"dtype {x_TD.dtype} under torch.compile (its fake kernel takes bfloat16 only)"
    D, G = w1_EDG.shape[1:]
    multiple = 16 // x_TD.element_size()
    if D % multiple or G % multiple:
        return (f"d_model={D}, G={G}: both must be multiples of {multiple} for {x_TD.dtype} "
                f"(16-byte rows)")
    return None


def moe_mlp_grouped_mm(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p=0.0, training=False):
    T, K = gate_TK.shape
    # cumulative end row of every expert; contiguous: the CUDA kernel reads the raw pointer
    # (a strided view gives it the wrong boundaries; only the CPU fallback honours strides)
    S = K * routing.n_chunks  # an expert's segments, in either order of routing.py
    offs_E = routing.off_S[S::S].contiguous()
    xs_RD = x_TD[routing.tok_R.long()]
    h_RG = F.relu(torch._grouped_mm(xs_RD, w1_EDG, offs=offs_E))
    h_RG = F.dropout(h_RG, p, training)
    gate_R = gate_TK.reshape(-1)[routing.order_R]
    out_RD = torch._grouped_mm(h_RG * gate_R[:, None], w2_EGD, offs=offs_E)
    return out_RD[routing.inverse_R()].view(T, K, w2_EGD.shape[2]).sum(1)
