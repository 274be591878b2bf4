"""sigma_moe/kernels/selector.py: the selector's product sharing x with the experts, against plain
autograd (`x @ w.T`, and x itself passed on), whose backward adds the two x gradients."""
import pytest
import torch

from sigma_moe.kernels import moe_mlp, selector_logits
from sigma_moe.kernels.testing import random_case


def _loss(logits_TE, xe_TD, a_TE, b_TD, use=("logits", "x")):
    # a nonlinear use of each output, so that each gets its own gradient
    loss = logits_TE.new_zeros((), dtype=torch.float64)
    if "logits" in use:
        loss = loss + (torch.sigmoid(logits_TE).double() * a_TE).sum()
    if "x" in use:
        loss = loss + (xe_TD.double().square() * b_TD).sum()
    return loss


def _grads(fn, x_TD, w_ED, use):
    x_TD, w_ED = x_TD.clone().requires_grad_(), w_ED.clone().requires_grad_()
    gen = torch.Generator().manual_seed(1)
    a_TE = torch.randn(x_TD.shape[0], w_ED.shape[0], generator=gen, dtype=torch.float64)
    b_TD = torch.randn(x_TD.shape, generator=gen, dtype=torch.float64)
    logits_TE, xe_TD = fn(x_TD, w_ED)
    loss = _loss(logits_TE, xe_TD, a_TE, b_TD, use)
    return (logits_TE, xe_TD), torch.autograd.grad(loss, (x_TD, w_ED), allow_unused=True)


def _plain(x_TD, w_ED):
    return x_TD @ w_ED.T, x_TD


@pytest.mark.parametrize("use", [("logits", "x"), ("logits",), ("x",)])
def test_matches_plain_autograd(use):
    """Both gradients and either one alone (the other output unused: its gradient is None
    in the backward, not zeros)."""
    x_TD = torch.randn(13, 7, dtype=torch.float64)
    w_ED = torch.randn(5, 7, dtype=torch.float64)
    (logits, xe), grads = _grads(selector_logits, x_TD, w_ED, use)
    (logits_ref, _), grads_ref = _grads(_plain, x_TD, w_ED, use)
    torch.testing.assert_close(logits, logits_ref)
    assert torch.equal(xe, x_TD)
    for g, r in zip(grads, grads_ref):
        if r is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, r)


def test_under_autocast_x_is_cast_once():
    """Under autocast: both outputs in the autocast dtype, the gradients in the inputs'
    float32 and equal to plain autograd's up to bf16 rounding."""
    x_TD, w_ED = torch.randn(24, 16), torch.randn(6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (logits, xe), grads = _grads(selector_logits, x_TD, w_ED, ("logits", "x"))
        _, grads_ref = _grads(_plain, x_TD, w_ED, ("logits", "x"))
    assert logits.dtype == xe.dtype == torch.bfloat16
    assert [g.dtype for g in grads] == [torch.float32, torch.float32]
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-2)


def _layer(x_TD, w3_ED, w1_EDG, w2_EGD, shared: bool):
    """selector -> sigmoid -> top-2 -> moe_mlp (torch path), x shared or used twice."""
    logits_TE, xe_TD = selector_logits(x_TD, w3_ED) if shared else _plain(x_TD, w3_ED)
    gate_TK, expert_TK = torch.sigmoid(logits_TE).topk(2, dim=-1)
    return moe_mlp(xe_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, backend="torch")


def test_layer_under_autocast_keeps_one_copy_of_x():
    """The layer's backward keeps one bf16 copy of x, not one a use."""
    case = random_case(T=24, D=16, E=5, G=8, K=2)
    ins = [case["x_TD"].requires_grad_(), torch.randn(5, 16).requires_grad_(),
           case["w1_EDG"].requires_grad_(), case["w2_EGD"].requires_grad_()]

    def copies(shared):
        saved = {}

        def pack(t):
            if t.shape == ins[0].shape and t.dtype == torch.bfloat16:
                saved[t.untyped_storage().data_ptr()] = t
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _layer(*ins, shared=shared)
        return len(saved)

    assert (copies(shared=True), copies(shared=False)) == (1, 2)


def test_float64_under_autocast_stays_float64():
    x_TD = torch.randn(5, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, xe = selector_logits(x_TD, torch.randn(3, 4, dtype=torch.float64))
    assert logits.dtype == xe.dtype == torch.float64


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_x_with_batch_dims_is_refused(backend):
    """Its backward's products are 2-D: a [B, T, D] x went through the forward and failed
    in the backward."""
    with pytest.raises(ValueError, match=r"not \[2, 5, 8\]: flatten its leading dims"):
        selector_logits(torch.randn(2, 5, 8), torch.randn(3, 8), backend)


def test_compile_fullgraph_traces_the_layer():
    """selector -> sigmoid -> top-K -> moe_mlp, compiled whole, against eager."""
    case = random_case(T=21, D=16, E=5, G=8, K=2)
    ins = [case["x_TD"].requires_grad_(), torch.randn(5, 16).requires_grad_(),
           case["w1_EDG"].requires_grad_(), case["w2_EGD"].requires_grad_()]

    def loss(*ins):
        return _layer(*ins, shared=True).square().sum()

    got = torch.compile(loss, fullgraph=True, backend="aot_eager")(*ins)
    grads = torch.autograd.grad(got, ins)
    want = loss(*ins)
    torch.testing.assert_close(got, want)
    for g, r in zip(grads, torch.autograd.grad(want, ins)):
        torch.testing.assert_close(g, r)
