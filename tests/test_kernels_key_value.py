"""sigma_moe/kernels/key_value.py against the plain autograd path it replaces (one product, view,
permute, unpack into k and v): the same k, v and gradients bit for bit, and no stack of dk
and dv in the backward."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from sigma_moe.kernels import key_value

B, L, D, H, C = 2, 7, 12, 3, 5


def plain(x_BLD, w_ND, n_heads):
    B, L, _ = x_BLD.shape
    kv = F.linear(x_BLD, w_ND).view(B, L, 2, n_heads, -1).permute(2, 0, 3, 1, 4)
    k_BHLC, v_BHLC = kv
    return k_BHLC, v_BHLC


def run(fn, x_BLD, w_ND, autocast):
    x_BLD, w_ND = x_BLD.clone().requires_grad_(), w_ND.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        k, v = fn(x_BLD, w_ND, H)
        # SDPA's gradients come back [B, L, H, C]-ordered: mimic that layout
        gk, gv = (torch.randn(B, L, H, C, generator=torch.Generator().manual_seed(s))
                  .to(k.dtype).transpose(1, 2) for s in (1, 2))
    grads = torch.autograd.grad((k, v), (x_BLD, w_ND), (gk, gv))
    return k, v, *grads


@pytest.mark.parametrize("autocast", [False, True])
def test_key_value_equals_plain_autograd_bit_for_bit(autocast):
    x_BLD, w_ND = torch.randn(B, L, D), torch.randn(2 * H * C, D)
    got = run(key_value, x_BLD, w_ND, autocast)
    want = run(plain, x_BLD, w_ND, autocast)
    assert got[0].shape == (B, H, L, C)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_key_value_backward_stacks_nothing():
    """The plain path's backward stacks dk and dv (a cat) and copies the result into the
    product's layout; key_value's joins their rows in one cat and copies nothing else."""
    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    def backward_ops(fn):
        x_BLD = torch.randn(B, L, D, requires_grad=True)
        k, v = fn(x_BLD, torch.randn(2 * H * C, D, requires_grad=True), H)
        grads = [torch.randn(B, L, H, C).transpose(1, 2) for _ in range(2)]
        with Ops() as ops:
            torch.autograd.backward((k, v), grads)
        return [n for n in ops.names if n.split(".")[0] in ("stack", "cat", "clone", "copy_",
                                                            "_unsafe_view", "contiguous")]

    assert "stack.default" in backward_ops(plain)
    assert backward_ops(key_value) == ["cat.default"]


@pytest.mark.gpu
def test_gpu_sdpa_returns_key_value_gradients_row_ordered():
    """What key_value's backward relies on to read dk and dv as plain [B * L, HC] rows:
    SDPA (with a bias, bf16: the memory-efficient kernel, WT-B's head size) returns them
    [B, L, H, C]-contiguous. Checked on the view it gets them through."""
    x_BLD = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_ND = torch.randn(2 * 2 * 64, 128, device="cuda", dtype=torch.bfloat16)
    k, v = key_value(x_BLD, w_ND, 2)
    q = torch.randn(2, 2, 32, 64, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(2, 2, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    seen = []
    k.register_hook(lambda g: seen.append(g.transpose(1, 2).is_contiguous()))
    v.register_hook(lambda g: seen.append(g.transpose(1, 2).is_contiguous()))
    F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()
    assert seen == [True, True]
