"""torch.library custom ops over the CVMM Triton kernels (paper Eq. `cvmm` and `moe_out`).

Unfused (the paper's CVMM as a standalone op; ReLU, dropout and gate in PyTorch between):
    sigma_moe::cvmm_gather   C_RN = cvmm(x_TD[tok_R], e_R, W)       token rows -> sorted rows
    sigma_moe::cvmm_scatter  Y_TN[t] = sum_k cvmm(A_RD, e_R, W)     sorted rows -> token rows
    sigma_moe::cvmm_wgrad    dW[e] = sum_{r of e} A^T B             (deterministic)
  gather and scatter are each other's input gradient (with W^T, a stride swap).

Fused sigma-MoE expert path (dropout cannot be fused: the dispatcher uses the unfused one):
    sigma_moe::fused_fwd     h_RG = relu(x[tok] W1);  y_TD = sum_k gate * h W2   (2 kernels)
    sigma_moe::fused_bwd     d(gate*h) -> d pre-ReLU, d gate and gate*h in one epilogue,
                             dW2, dW1 (each a wgrad and its chunk reduction), dx (a
                             slot-ordered scatter): 5 kernels + K*C slot launches
  Saved for the backward: x, gate, h_RG (R x G) and the routing -- never the T*K*D output.
  Every slot-ordered scatter is K launches of one kernel, one per slot in slot order
  (sigma_moe/kernels/triton_launch.scatter_mm).

Each op has a fake impl (shapes only) and registered autograd, so `torch.compile` traces
through them with fullgraph=True; the backward calls ops too, so AOTAutograd traces it.
Every op takes the routing's token chunks C (n_chunks; a chunks_in_slots routing,
sigma_moe/kernels/routing.py): the scatters then run chunk by chunk.
"""
# no `from __future__ import annotations`: torch < 2.5 infers the custom ops' schemas from
# the annotation objects and rejects strings
import torch
from torch import Tensor

from sigma_moe.kernels import triton_launch as launch
from sigma_moe.kernels.triton_launch import EPI_GATE_RELU_BWD, EPI_RELU


def _n_tokens(tok_R: Tensor, off_S: Tensor, n_exp: int, n_chunks: int) -> int:
    return tok_R.shape[0] // launch._slots(off_S, n_exp, n_chunks)


# ----------------------------------------------------------------------------- unfused CVMM
@torch.library.custom_op("sigma_moe::cvmm_gather", mutates_args=())
def cvmm_gather(x_TD: Tensor, w_EDN: Tensor, tok_R: Tensor, off_S: Tensor,
                n_chunks: int) -> Tensor:
    """C[r] = x[tok[r]] @ W[e_r], rows r in sorted order."""
    return launch.gather_mm(x_TD, w_EDN, tok_R, off_S, n_chunks=n_chunks)


@cvmm_gather.register_fake
def _(x_TD, w_EDN, tok_R, off_S, n_chunks):
    return x_TD.new_empty(tok_R.shape[0], w_EDN.shape[2])


@torch.library.custom_op("sigma_moe::cvmm_scatter", mutates_args=())
def cvmm_scatter(a_RD: Tensor, w_EDN: Tensor, tok_R: Tensor, off_S: Tensor,
                 n_chunks: int) -> Tensor:
    """Y[t] = sum over the K sorted rows r of token t of A[r] @ W[e_r]."""
    T = _n_tokens(tok_R, off_S, w_EDN.shape[0], n_chunks)
    return launch.scatter_mm(a_RD, w_EDN, tok_R, off_S, T, n_chunks=n_chunks)


@cvmm_scatter.register_fake
def _(a_RD, w_EDN, tok_R, off_S, n_chunks):
    return a_RD.new_empty(_n_tokens(tok_R, off_S, w_EDN.shape[0], n_chunks), w_EDN.shape[2])


@torch.library.custom_op("sigma_moe::cvmm_wgrad", mutates_args=())
def cvmm_wgrad(a: Tensor, b: Tensor, tok_R: Tensor, off_S: Tensor, n_experts: int,
               gather_a: bool, gather_b: bool) -> Tensor:
    """dW[e] = sum_{r of e} A[ia_r]^T B[ib_r]; ia_r = tok[r] if gather_a else r (same for b)."""
    return launch.wgrad(a, b, tok_R, off_S, n_experts, gather_a, gather_b)


@cvmm_wgrad.register_fake
def _(a, b, tok_R, off_S, n_experts, gather_a, gather_b):
    return a.new_empty(n_experts, a.shape[1], b.shape[1])


def _save_cvmm(ctx, inputs, output):
    *tensors, ctx.n_chunks = inputs
    ctx.save_for_backward(*tensors)


def _cvmm_gather_bwd(ctx, gc_RN):
    x_TD, w_EDN, tok_R, off_S = ctx.saved_tensors
    gc_RN = gc_RN.contiguous()
    gx = gw = None
    if ctx.needs_input_grad[0]:
        gx = cvmm_scatter(gc_RN, w_EDN.transpose(1, 2), tok_R, off_S, ctx.n_chunks)
    if ctx.needs_input_grad[1]:
        gw = cvmm_wgrad(x_TD, gc_RN, tok_R, off_S, w_EDN.shape[0], True, False)
    return gx, gw, None, None, None


def _cvmm_scatter_bwd(ctx, gy_TN):
    a_RD, w_EDN, tok_R, off_S = ctx.saved_tensors
    gy_TN = gy_TN.contiguous()
    ga = gw = None
    if ctx.needs_input_grad[0]:
        ga = cvmm_gather(gy_TN, w_EDN.transpose(1, 2), tok_R, off_S, ctx.n_chunks)
    if ctx.needs_input_grad[1]:
        gw = cvmm_wgrad(a_RD, gy_TN, tok_R, off_S, w_EDN.shape[0], False, True)
    return ga, gw, None, None, None


cvmm_gather.register_autograd(_cvmm_gather_bwd, setup_context=_save_cvmm)
cvmm_scatter.register_autograd(_cvmm_scatter_bwd, setup_context=_save_cvmm)


def _chunks(routing) -> int:
    """The routing's C, which the ops take; ValueError for an order they cannot run."""
    if routing.n_chunks > 1 and not routing.chunks_in_slots:
        raise ValueError("the Triton ops take token chunks in the chunks_in_slots order "
                         "(sigma_moe/kernels/routing.py): make_routing(..., chunks_in_slots=True)")
    return routing.n_chunks


def moe_mlp_triton_unfused(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p=0.0, training=False):
    """Eq. `moe_out` from the standalone CVMM ops; ReLU, dropout and gate in PyTorch."""
    C = _chunks(routing)
    h_RG = torch.relu(cvmm_gather(x_TD, w1_EDG, routing.tok_R, routing.off_S, C))
    h_RG = torch.nn.functional.dropout(h_RG, p, training)
    gate_R = gate_TK.reshape(-1)[routing.order_R]  # order_R is a permutation: no collisions
    return cvmm_scatter(h_RG * gate_R[:, None], w2_EGD, routing.tok_R, routing.off_S, C)


# ------------------------------------------------------------------------ fused sigma-MoE
@torch.library.custom_op("sigma_moe::fused_fwd", mutates_args=())
def fused_fwd(x_TD: Tensor, gate_TK: Tensor, w1_EDG: Tensor, w2_EGD: Tensor,
              tok_R: Tensor, order_R: Tensor, off_S: Tensor, n_chunks: int
              ) -> tuple[Tensor, Tensor]:
    """-> (y_TD, h_RG): up-projection + ReLU in one kernel, gate-scaled down-projection
    summed over the K slots in place (K launches of one kernel, C*K with token chunks)."""
    h_RG = launch.gather_mm(x_TD, w1_EDG, tok_R, off_S, epilogue=EPI_RELU, n_chunks=n_chunks)
    y_TD = launch.scatter_mm(h_RG, w2_EGD, tok_R, off_S, x_TD.shape[0],
                             scale=gate_TK.reshape(-1), order_R=order_R, n_chunks=n_chunks)
    return y_TD, h_RG


@fused_fwd.register_fake
def _(x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, n_chunks):
    return x_TD.new_empty(x_TD.shape), x_TD.new_empty(tok_R.shape[0], w1_EDG.shape[2])


@torch.library.custom_op("sigma_moe::fused_bwd", mutates_args=())
def fused_bwd(gy_TD: Tensor, x_TD: Tensor, gate_TK: Tensor, w1_EDG: Tensor, w2_EGD: Tensor,
              tok_R: Tensor, order_R: Tensor, off_S: Tensor, n_chunks: int, h_RG: Tensor,
              need_x: bool, need_w1: bool, need_w2: bool
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> grads of (x, gate, w1, w2); one not needed is an empty tensor, its kernels
    skipped (frozen weights: no wgrad launches)."""
    E = w1_EDG.shape[0]
    T, K = gate_TK.shape
    gate_flat = gate_TK.reshape(-1)
    # d(gate*h) = gy[tok] W2^T, then in the epilogue: d gate, d pre-ReLU = gate*d(gate*h)*[h>0]
    # and gate*h, the down-projection's input (its weight gradient needs no per-row scale)
    gpre_RG, gpart, gh_RG = launch.gather_mm(gy_TD, w2_EGD.transpose(1, 2), tok_R, off_S,
                                             EPI_GATE_RELU_BWD, h=h_RG, gate=gate_flat,
                                             order_R=order_R, n_chunks=n_chunks)
    gw2 = (launch.wgrad(gh_RG, gy_TD, tok_R, off_S, E, gather_a=False, gather_b=True,
                        dtype=w2_EGD.dtype) if need_w2 else w2_EGD.new_empty(0))
    gw1 = (launch.wgrad(x_TD, gpre_RG, tok_R, off_S, E, gather_a=True, gather_b=False,
                        dtype=w1_EDG.dtype) if need_w1 else w1_EDG.new_empty(0))
    gx_TD = (launch.scatter_mm(gpre_RG, w1_EDG.transpose(1, 2), tok_R, off_S, T,
                               n_chunks=n_chunks) if need_x else x_TD.new_empty(0))
    gg_TK = gpart.sum(0).view(T, K).to(gate_TK.dtype)
    return gx_TD, gg_TK, gw1, gw2


@fused_bwd.register_fake
def _(gy_TD, x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, n_chunks, h_RG,
      need_x, need_w1, need_w2):
    # contiguous, as the kernels' outputs are (empty_like would keep a transposed input's
    # strides, and torch.compile would plan with those)
    return tuple(t.new_empty(t.shape if need else 0) for t, need in
                 ((x_TD, need_x), (gate_TK, True), (w1_EDG, need_w1), (w2_EGD, need_w2)))


def _fused_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # h gets no gradient: don't build a zero R x G for it
    *tensors, ctx.n_chunks = inputs
    ctx.save_for_backward(*tensors, output[1])


def _fused_backward(ctx, gy_TD, _gh):
    if gy_TD is None:
        return (None,) * 8
    *inputs, h_RG = ctx.saved_tensors
    need_x, _, need_w1, need_w2 = ctx.needs_input_grad[:4]
    grads = fused_bwd(gy_TD.contiguous(), *inputs, ctx.n_chunks, h_RG, need_x, need_w1,
                      need_w2)
    return *(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), *[None] * 4


fused_fwd.register_autograd(_fused_backward, setup_context=_fused_setup)


def moe_mlp_triton(x_TD, gate_TK, w1_EDG, w2_EGD, routing):
    """Eq. `moe_out` in two fused kernels forward, four (+ K-1 slot launches) backward."""
    # (the gate goes as it is: the launchers make every 1-D argument contiguous)
    y_TD, _ = fused_fwd(x_TD.contiguous(), gate_TK, w1_EDG, w2_EGD,
                        routing.tok_R, routing.order_R, routing.off_S, _chunks(routing))
    return y_TD
