"""The expert selection's Triton top-K (sigma_moe/kernels/triton_topk.py, `kernels.topk`) against
torch.topk: under the Triton interpreter on a CPU (tests/conftest.py), on CUDA on a GPU."""
import json

import pytest
import torch

from sigma_moe import kernels
from tests.triton_helpers import DEVICE, TRITON_MARKS, need_hopper_toolchain, outside_interpreter

pytestmark = TRITON_MARKS


@pytest.mark.parametrize("T, E, K", [(1, 5, 1), (37, 32, 4), (300, 33, 8), (9, 8, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_topk_kernel_matches_torch_topk(T, E, K, dtype):
    """The selection's Triton top-K: torch.topk's ids and values, largest first, on rows of
    distinct values (odd T and E, K up to E), in every dtype, through a transposed view."""
    g = torch.Generator().manual_seed(T * E + K)
    # distinct in every dtype: a permutation of E representable values per row
    s = torch.stack([torch.randperm(E, generator=g) for _ in range(T)]).to(dtype) / 4 - 3
    s = s.to(DEVICE).t().contiguous().t()  # column-major: the kernel takes any strides
    val, ids = kernels.topk(s, K, backend="triton")
    want_val, want_ids = s.topk(K, dim=-1)
    assert ids.dtype == torch.int64 and ids.shape == (T, K)
    assert torch.equal(ids, want_ids) and torch.equal(val, want_val)


def test_topk_kernel_ties_infinities_and_nan():
    """Ties go to the lower id; -inf entries are still chosen when K needs them (once each);
    NaN ranks first, above +inf, as in torch.topk; the gates' gradient reaches s at the
    chosen ids."""
    inf, nan = float("inf"), float("nan")
    s = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0],
                      [-inf, 3.0, -inf, -inf, -inf],
                      [0.5, nan, 9.0, -1.0, 0.0],
                      [inf, 1.0, nan, 2.0, -inf],
                      [nan, 1.0, nan, 2.0, -inf]], device=DEVICE, requires_grad=True)
    val, ids = kernels.topk(s, 3, backend="triton")
    assert ids.tolist() == [[1, 2, 4], [1, 0, 2], [1, 2, 0], [2, 0, 3], [0, 2, 3]]
    assert torch.equal(ids[2:], s[2:].detach().cpu().topk(3).indices.to(ids.device))
    val.nan_to_num(0.0, 0.0, 0.0).sum().backward()
    chosen = torch.zeros(5, 5, dtype=torch.bool, device=DEVICE).scatter_(1, ids, True)
    assert torch.equal(s.grad != 0, chosen & s.isfinite())


def test_topk_rejects_k_beyond_the_experts_and_unknown_backends():
    s = torch.randn(4, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"k=4 must be in \[1, 3\]"):
        kernels.topk(s, 4)
    with pytest.raises(ValueError, match="choose auto, triton or torch"):
        kernels.topk(s, 2, backend="cuda")
    with pytest.raises(ValueError, match=r"must be \[T, E\]"):
        kernels.topk(s[None], 2, backend="triton")
    with pytest.raises(ValueError, match="1 <= k <= E"):  # the op alone checks too
        torch.ops.sigma_moe.topk_ids(s, 4)
    assert kernels.selection_backend("reference") == "torch"
    assert kernels.selection_backend("grouped_mm") == "auto"
    assert kernels.topk(s, 2, backend="auto")[1].device == s.device


_COMPILE_TOPK = """
import json, triton
from sigma_moe.kernels.triton_aot import compile_kernel, ptxas_usage
from sigma_moe.kernels.triton_topk import _block_t, topk_kernel
for dt, E, K in (("bf16", 8, 2), ("bf16", 32, 4), ("fp32", 33, 8), ("bf16", 512, 8)):
    cex = {"K": K, "E_P2": triton.next_power_of_2(E), "stride_e": 1}
    cex["BLOCK_T"] = _block_t(cex["E_P2"])
    c = compile_kernel(topk_kernel, cex, {"s_ptr": dt, "idx_ptr": "i64"}, num_warps=4)
    print(json.dumps(ptxas_usage(c.asm["ptx"], 90)))
"""


def test_topk_kernel_compiles_for_hopper_without_spills():
    """Real Triton compiles the top-K kernel for sm_90 from 8 to 512 experts, with no
    register spills (the rows stay in registers); measured: 40-181 registers a thread."""
    need_hopper_toolchain()
    reports = [json.loads(line) for line in outside_interpreter("-c", _COMPILE_TOPK).splitlines()]
    assert len(reports) == 4 and all(r["spill_bytes"] == 0 for r in reports), reports
