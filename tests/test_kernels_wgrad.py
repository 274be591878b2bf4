"""The weight-gradient kernel's chunks (sigma_moe/kernels/triton_cvmm.py wgrad_kernel and
wgrad_reduce_kernel): an expert's rows split into chunks of at most chunk_rows, fp32
partials summed in chunk order. Against a float64 per-expert sum, on skewed routing with
empty experts, and deterministic (on a GPU, else in the Triton interpreter)."""
import json

import pytest
import torch

pytest.importorskip("triton")
from sigma_moe.kernels import triton_launch  # noqa: E402
from sigma_moe.kernels.routing import make_routing  # noqa: E402
from sigma_moe.kernels.testing import (  # noqa: E402
    TOLERANCE,
    assert_close,
    compare,
    random_case,
    reference_case,
    rel_err,
    run_case,
    uneven_experts,
)
from tests.triton_helpers import (  # noqa: E402
    DEVICE,
    TRITON_MARKS,
    need_hopper_toolchain,
    outside_interpreter,
)

pytestmark = TRITON_MARKS


def skewed_experts(T, E, K, seed=0):
    """[T, K] distinct experts, most tokens on expert 1, experts E - 1 and 0 unused."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.where(torch.rand(T, generator=gen) < 0.7, 1, 2 + torch.arange(T) % (E - 3))
    rest = [(first + 1 + k + torch.arange(T) % 2) % (E - 2) for k in range(K - 1)]
    expert_TK = torch.stack([first, *[torch.where(r == 0, E - 2, r) for r in rest]], 1)
    assert all(len(set(row)) == K for row in expert_TK.tolist())
    return expert_TK


def wgrad_reference(a, b, routing, E, gather_a, gather_b):
    segs = (routing.off_S.numel() - 1) // E
    off, tok = routing.off_S.long().cpu(), routing.tok_R.long().cpu()
    out = torch.zeros(E, a.shape[1], b.shape[1], dtype=torch.float64)
    for e in range(E):
        rows = torch.arange(off[e * segs], off[(e + 1) * segs])
        ia, ib = (tok[rows] if g else rows for g in (gather_a, gather_b))
        out[e] = a.cpu().double()[ia].T @ b.cpu().double()[ib]
    return out


@pytest.mark.parametrize("chunk_rows", [5, 16, None])
@pytest.mark.parametrize("gather_a,dtype", [(True, torch.float32), (False, torch.float16)])
def test_wgrad_in_chunks_matches_reference(chunk_rows, gather_a, dtype):
    """dW1-like (A = x gathered) and dW2-like (B gathered) sums, the busiest expert's rows in
    several chunks (5, 16) or one (the default for this size), the unused experts zero."""
    T, E, K, M, N = 41, 6, 2, 24, 20
    routing = make_routing(skewed_experts(T, E, K).to(DEVICE), E)
    R = T * K
    a = torch.randn(T if gather_a else R, M, device=DEVICE).to(dtype)
    b = torch.randn(R if gather_a else T, N, device=DEVICE).to(dtype)
    args = (a, b, routing.tok_R, routing.off_S, E, gather_a, not gather_a)
    got = triton_launch.wgrad(*args, chunk_rows=chunk_rows)
    want = wgrad_reference(*args[:2], routing, E, gather_a, not gather_a)
    assert rel_err(got.cpu(), want) <= TOLERANCE[dtype]
    assert not got[[0, E - 1]].any()  # never chosen: exact zeros
    busiest = int(routing.off_S[2 * K] - routing.off_S[K])  # expert 1
    assert busiest > 16  # so chunks of 5 and 16 split it
    assert torch.equal(triton_launch.wgrad(*args, chunk_rows=chunk_rows), got)


def test_wgrad_grid_stays_within_cuda_limit(monkeypatch):
    """More chunks than CUDA's grid holds on its second axis (65535; here 9): larger chunks,
    the same sums."""
    T, E, K, M, N = 41, 6, 2, 8, 8
    routing = make_routing(skewed_experts(T, E, K).to(DEVICE), E)
    a, b = torch.randn(T, M, device=DEVICE), torch.randn(T * K, N, device=DEVICE)
    args = (a, b, routing.tok_R, routing.off_S, E, True, False)
    monkeypatch.setattr(triton_launch, "MAX_GRID_Y", E + 3)
    grids = []
    launch = triton_launch.launch_kernel
    monkeypatch.setattr(triton_launch, "launch_kernel", lambda kernel, grid, *a, **kw: (
        grids.append(grid({"BLOCK_M": 16, "BLOCK_N": 16})), launch(kernel, grid, *a, **kw)))
    got = triton_launch.wgrad(*args, chunk_rows=5)  # 16 chunks of 5 rows asked for
    assert grids[0][1] <= E + 3
    assert rel_err(got.cpu(), wgrad_reference(a, b, routing, E, True, False)) <= 1e-5
    with pytest.raises(ValueError, match="6 experts"):
        monkeypatch.setattr(triton_launch, "MAX_GRID_Y", E)
        triton_launch.wgrad(*args)


def test_default_chunk_is_a_quarter_above_the_mean():
    assert triton_launch.wgrad_chunk_rows(32768 * 4, 32) == 5120  # WT-B's layer
    assert triton_launch.wgrad_chunk_rows(10, 3) == 64


def test_layer_with_split_weight_gradients(monkeypatch):
    """The fused layer with every expert's rows in chunks of 7: the reference's gradients,
    and the same bits twice."""
    monkeypatch.setattr(triton_launch, "wgrad_chunk_rows", lambda R, E: 7)
    case = random_case(T=37, D=16, E=5, G=16, K=2, device=DEVICE, seed=3)
    case["expert_TK"] = skewed_experts(37, 5, 2, seed=3).to(DEVICE)
    got, again = run_case(case, "triton"), run_case(case, "triton")
    assert_close(compare(got, reference_case(case)), torch.float32)
    for g, g2 in zip(got[1], again[1], strict=True):
        assert torch.equal(g, g2)


_COMPILE_REDUCE = """
import json
from sigma_moe.kernels.triton_aot import compile_kernel, ptxas_usage
from sigma_moe.kernels.triton_cvmm import wgrad_reduce_kernel
for dt in ("bf16", "fp32"):
    c = compile_kernel(wgrad_reduce_kernel, {"SEG_P2": 32, "BLOCK_M": 64, "BLOCK_N": 64},
                       {"ws_ptr": "fp32", "dw_ptr": dt, "off_ptr": "i32"}, num_warps=4)
    print(json.dumps(ptxas_usage(c.asm["ptx"], 90)))
"""


def test_wgrad_reduce_kernel_compiles_for_hopper():
    """Real Triton compiles the partials' reduction for sm_90, without spills."""
    need_hopper_toolchain()
    reports = [json.loads(ln) for ln in outside_interpreter("-c", _COMPILE_REDUCE).splitlines()]
    assert len(reports) == 2 and all(r["spill_bytes"] == 0 for r in reports), reports


@pytest.mark.gpu
def test_gpu_wgrad_chunks_at_the_target_case_on_skewed_routing():
    """bf16, T = 32768, E = 32, K = 4, the busiest expert ~4x the mean (`uneven_experts`,
    as bench_products' skewed products): the default chunks against one chunk an expert (a
    change of summation order only), and the same bits twice."""
    T, E, K, D, G = 32768, 32, 4, 1024, 128
    gen = torch.Generator("cuda").manual_seed(0)
    routing = make_routing(uneven_experts(T, E, K, gen, "cuda"), E)
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = torch.randn(T * K, G, device="cuda", dtype=torch.bfloat16, generator=gen)
    args = (x, g, routing.tok_R, routing.off_S, E, True, False)
    got = triton_launch.wgrad(*args)
    assert rel_err(got, triton_launch.wgrad(*args, chunk_rows=T * K)) <= 1e-2
    assert torch.equal(got, triton_launch.wgrad(*args))
