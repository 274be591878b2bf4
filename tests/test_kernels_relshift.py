"""sigma_moe/kernels/triton_relshift.py (on a GPU, else under TRITON_INTERPRET=1) against the
torch.where on the strided view of sigma_moe/models/attention.py: the shifted, masked bias and its
gradient, bit for bit (both only move values)."""
import json

import pytest
import torch

pytest.importorskip("triton")
from sigma_moe.kernels.triton_relshift import relshift_bias, relshift_bias_grad  # noqa: E402
from sigma_moe.models.attention import (  # noqa: E402
    _PositionBias,
    bd_width,
    position_bias,
    position_bias_grad,
)
from tests.triton_helpers import (  # noqa: E402
    DEVICE,
    TRITON_MARKS,
    need_hopper_toolchain,
    outside_interpreter,
)

pytestmark = TRITON_MARKS

# (H, B, T, M, spare columns of bd): memory or none, one query, rows not a multiple of
# ROWS, the row past one column block (256) so that the column loop runs twice with a ragged
# end, one spare column or bd_width's
SHAPES = [(2, 3, 5, 4, 1), (1, 2, 4, 0, 4), (3, 1, 1, 6, 1), (1, 1, 9, 290, 1),
          (2, 2, 7, 9, 8)]


@pytest.mark.parametrize("H,B,T,M,spare", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_relshift_matches_torch(H, B, T, M, spare, dtype):
    L = T + M
    P = L + spare
    bd = torch.randn(H, B, T, P, device=DEVICE).to(dtype)
    want = position_bias(bd, L)
    got = relshift_bias(bd, L)
    assert got.shape == (B, H, T, L) and got.is_contiguous() and got.dtype == dtype
    assert torch.equal(got, want)
    grad = torch.randn(B, H, T, L, device=DEVICE).to(dtype)
    want_grad = position_bias_grad(grad, P)
    got_grad = relshift_bias_grad(grad, P)
    assert got_grad.shape == (H, B, T, P) and torch.equal(got_grad, want_grad)


def test_relshift_reads_a_non_contiguous_gradient():
    grad = torch.randn(3, 2, 4, 7, device=DEVICE).transpose(0, 1)  # [B, H, T, L], not contiguous
    assert torch.equal(relshift_bias_grad(grad, 8), position_bias_grad(grad.contiguous(), 8))


def test_relshift_refuses_a_row_without_spare_column():
    with pytest.raises(ValueError, match="T <= L < P"):
        relshift_bias(torch.randn(1, 1, 3, 5, device=DEVICE), 5)
    with pytest.raises(ValueError, match="T <= L < P"):
        relshift_bias_grad(torch.randn(1, 1, 3, 5, device=DEVICE), 5)


def test_position_bias_function_fast_equals_plain():
    """The autograd Function on either path: same bias, same gradient."""
    bd = torch.randn(2, 3, 6, 16, device=DEVICE, requires_grad=True)
    gy = torch.randn(3, 2, 6, 9, device=DEVICE)
    out = [_PositionBias.apply(bd, 9, fast) for fast in (False, True)]
    grads = [torch.autograd.grad(o, bd, gy)[0] for o in out]
    assert torch.equal(out[0], out[1]) and torch.equal(grads[0], grads[1])


def test_relshift_empty_batch():
    assert relshift_bias(torch.randn(2, 0, 3, 8, device=DEVICE), 4).shape == (0, 2, 3, 4)
    assert relshift_bias_grad(torch.randn(0, 2, 3, 4, device=DEVICE), 8).shape == (2, 0, 3, 8)


@pytest.mark.gpu
def test_gpu_relshift_at_wt_b_shapes():
    """WT-B's heads, segment and memory (batch 4 of 64), bf16: 34M elements each way."""
    H, B, T, L = 16, 4, 512, 1024
    P = bd_width(L)
    bd = torch.randn(H, B, T, P, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(relshift_bias(bd, L), position_bias(bd, L))
    grad = torch.randn(B, H, T, L, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(relshift_bias_grad(grad, P), position_bias_grad(grad, P))


_COMPILE = """
import json, re
from sigma_moe.kernels.triton_aot import compile_kernel, ptxas_usage
from sigma_moe.kernels.triton_relshift import BLOCK_C, ROWS, WARPS, relshift_kernel
for dt in ("bf16", "fp32"):
    for bwd in (False, True):
        cex = {"FILL": 0.0 if bwd else float("-inf"), "BACKWARD": bwd, "ROWS": ROWS,
               "BLOCK_C": BLOCK_C}
        # what a launch at WT-B's shapes specialises: aligned pointers, sizes divisible by 16
        c = compile_kernel(relshift_kernel, cex, {"src_ptr": dt, "dst_ptr": dt},
                           ("n_rows", "H", "B", "T", "L", "P"), num_warps=WARPS)
        stores = set(re.findall(r"st\\.global(?:\\.\\w+)*", c.asm["ptx"]))
        print(json.dumps({"backward": bwd, "stores": sorted(stores),
                          **ptxas_usage(c.asm["ptx"], 90)}))
"""


def test_relshift_compiles_for_hopper():
    """Real Triton compiles both directions for sm_90 without spills, with 16-byte stores
    (the bias's rows and bd's, bd_width's, are aligned; the shifted reads are not)."""
    need_hopper_toolchain()
    reports = [json.loads(ln) for ln in outside_interpreter("-c", _COMPILE).splitlines()]
    assert len(reports) == 4 and all(r["spill_bytes"] == 0 for r in reports), reports
    assert all(r["stores"] == ["st.global.v4.b32"] for r in reports), reports


def test_relshift_ops_trace_under_compile():
    """The custom op's fake shapes let torch.compile trace both directions whole."""
    bd = torch.randn(2, 3, 4, 8, device=DEVICE)
    grad = torch.randn(3, 2, 4, 6, device=DEVICE)
    fwd = torch.compile(lambda t: relshift_bias(t, 6), fullgraph=True, backend="aot_eager")
    bwd = torch.compile(lambda t: relshift_bias_grad(t, 8), fullgraph=True, backend="aot_eager")
    assert torch.equal(fwd(bd), position_bias(bd, 6))
    assert torch.equal(bwd(grad), position_bias_grad(grad, 8))


@pytest.mark.gpu
def test_gpu_attention_on_the_triton_shift_equals_the_torch_shift(monkeypatch):
    """RelativeAttention on CUDA in bf16 with WT-S's 41-wide heads (padded to 48): the
    Triton shift gives the torch shift's output bit for bit (SDPA sees the same bias), and
    its gradients up to the order of the memory-efficient backward's atomic sums."""
    from sigma_moe import kernels
    from sigma_moe.models.attention import AttentionConfig, RelativeAttention

    torch.manual_seed(0)
    attn = RelativeAttention(AttentionConfig(128, 4, 41, 2)).cuda()
    h_BTD = torch.randn(2, 64, 128, device="cuda", requires_grad=True)
    mem_BMD = torch.randn(2, 64, 128, device="cuda")
    results = []
    for fast in (True, False):
        monkeypatch.setattr(kernels, "relshift_available", lambda t, fast=fast: fast)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = attn(h_BTD, mem_BMD)
        grads = torch.autograd.grad(y.float().square().sum(), [h_BTD, *attn.parameters()])
        results.append((y, *grads))
    assert torch.equal(results[0][0], results[1][0])
    for got, want in zip(results[0][1:], results[1][1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-4)
