"""The CVMM Triton kernels (sigma_moe/kernels/triton_*.py) against the per-expert reference.

On a CPU these run in the Triton interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton is imported); shapes stay tiny so the whole file takes seconds. Tests that
need a real GPU (bf16 tensor cores, large shapes, timing) carry `@pytest.mark.gpu`.
"""
import pytest
import torch

from sigma_moe import kernels
from sigma_moe.kernels import moe_mlp
from sigma_moe.kernels.routing import make_routing
from sigma_moe.kernels.testing import (
    FROZEN,
    GRAD_NAMES,
    NO_GROUPED_MM,
    TOLERANCE,
    assert_close,
    compare,
    dropout_bias,
    random_case,
    reference_case,
    run_case,
)
from tests.triton_helpers import CUDA, DEVICE, TRITON_MARKS

pytestmark = TRITON_MARKS


def _leaves(case, names):
    return [case[n].clone().requires_grad_() for n in names]


@pytest.mark.parametrize("C", [1, 3])
def test_cvmm_gather_op(C):
    """C[r] = x[tok[r]] @ W[e_r] and its gradients (dx through the slot-ordered scatter,
    chunk by chunk with C token chunks)."""
    from sigma_moe.kernels.triton_ops import cvmm_gather

    case = random_case(T=19, D=24, E=5, G=20, K=3, device=DEVICE)
    r = make_routing(case["expert_TK"], 5, C, chunks_in_slots=True)
    x, w = _leaves(case, ["x_TD", "w1_EDG"])
    c = cvmm_gather(x, w, r.tok_R, r.off_S, C)
    e_R = case["expert_TK"].reshape(-1)[r.order_R]
    want = torch.einsum("rd,rdg->rg", x[r.tok_R.long()], w[e_R])
    gc = torch.randn_like(c)
    torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(torch.autograd.grad(c, (x, w), gc),
                        torch.autograd.grad(want, (x, w), gc)):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("C", [1, 2])
def test_cvmm_scatter_op(C):
    """Y[t] = sum_k A[r(t,k)] @ W[e_r] and its gradients (dA through the gathered kernel)."""
    from sigma_moe.kernels.triton_ops import cvmm_scatter

    case = random_case(T=17, D=20, E=6, G=24, K=4, device=DEVICE, n_unused=2)
    r = make_routing(case["expert_TK"], 6, C, chunks_in_slots=True)
    a = torch.randn(17 * 4, 24, device=DEVICE, requires_grad=True)
    (w,) = _leaves(case, ["w2_EGD"])
    y = cvmm_scatter(a, w, r.tok_R, r.off_S, C)
    e_R = case["expert_TK"].reshape(-1)[r.order_R]
    out_RD = torch.einsum("rg,rgd->rd", a, w[e_R])
    want = torch.zeros_like(y).index_add(0, r.tok_R.long(), out_RD)
    gy = torch.randn_like(y)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(torch.autograd.grad(y, (a, w), gy),
                        torch.autograd.grad(want, (a, w), gy)):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)


if kernels.HAS_TRITON:
    import triton
    import triton.language as tl

    from sigma_moe.kernels.triton_cvmm import _segment_tile

    @triton.jit
    def _tiles_kernel(off_ptr, out_ptr, n_seg, seg_len, reverse, BLOCK_M: tl.constexpr,
                      SEG_P2: tl.constexpr):
        pid = tl.program_id(0)
        seg, row0, row_end = _segment_tile(pid, off_ptr, n_seg, seg_len, 0, seg_len, reverse,
                                           BLOCK_M, SEG_P2)
        tl.store(out_ptr + 3 * pid, seg)
        tl.store(out_ptr + 3 * pid + 1, row0)
        tl.store(out_ptr + 3 * pid + 2, row_end)


@pytest.mark.parametrize("seg_len", [1, 2])
@pytest.mark.parametrize("reverse", [0, 1])
def test_tile_order_covers_every_row_once(reverse, seg_len):
    """The in-kernel tile lookup (round by round over the segments) is a bijection; with
    seg_len 2 a segment is two consecutive ones of the offsets (the gather's (expert, slot)
    segment of a routing with C = 2 token chunks)."""
    counts = [5, 0, 40, 16, 17, 0, 1, 0]  # empty, partial and multi-tile segments
    off = torch.tensor([0, *counts], device=DEVICE).cumsum(0).to(torch.int32)
    sizes = [sum(counts[i:i + seg_len]) for i in range(0, len(counts), seg_len)]
    n_prog = sum(-(-c // 4) for c in sizes) + len(sizes)  # the launchers' upper bound
    out = torch.full((n_prog, 3), -1, dtype=torch.int32, device=DEVICE)
    _tiles_kernel[(n_prog,)](off, out, len(sizes), seg_len, reverse, BLOCK_M=4, SEG_P2=8)
    out = out.cpu()
    real = out[out[:, 0] < len(sizes)]
    assert len(real) == sum(-(-c // 4) for c in sizes)
    covered = sorted(r for s, r0, end in real.tolist() for r in range(r0, min(r0 + 4, end)))
    assert covered == list(range(sum(counts)))
    for s, r0, end in real.tolist():  # each tile inside its own segment
        assert off[s * seg_len] <= r0 < end == off[(s + 1) * seg_len]
    # round by round: the first len(nonempty) tiles (of the launch order) are tile 0 of each
    nonempty = [i for i, c in enumerate(sizes) if c]
    first = real[-len(nonempty):] if reverse else real[:len(nonempty)]
    assert sorted(first[:, 0].tolist()) == nonempty


@pytest.mark.parametrize("C", [1, 2])
def test_skewed_routing_matches_reference(C):
    """Most rows on one expert (many tiles per segment), one expert never chosen; with C = 2
    token chunks, a chunk's rows of a slot on one expert."""
    case = random_case(T=70, D=16, E=4, G=16, K=2, device=DEVICE, seed=5)
    t = torch.arange(70)
    first = torch.where(t < 50, 2, t % 3)  # expert 2: 50 + rows, several tiles per segment
    case["expert_TK"] = torch.stack([first, (first + 1 + t % 2) % 3], 1).to(DEVICE)
    for backend in ("triton", "triton_unfused"):
        assert_close(compare(run_case(case, backend, n_chunks=C), reference_case(case)),
                     torch.float32)


@pytest.mark.parametrize("backend,K,dtype", [
    ("triton", 1, torch.float32), ("triton", 2, torch.float16), ("triton", 3, torch.float32),
    ("triton", 8, torch.float16), ("triton_unfused", 1, torch.float16),
    ("triton_unfused", 4, torch.float32), ("triton_unfused", 6, torch.float32),
])
def test_triton_matches_reference(backend, K, dtype):
    # odd T, d_model not a multiple of the block, experts with no token; every (expert,
    # slot) is a segment of its own, so large K is kept narrow for the slow interpreter
    D, G = (24, 20) if K < 5 else (16, 16)
    case = random_case(T=13 if K < 5 else 9, D=D, E=K + 2, G=G, K=K, dtype=dtype,
                       device=DEVICE, seed=K, n_unused=2)
    assert_close(compare(run_case(case, backend), reference_case(case)), dtype)


class _ScatterAt:
    """A stand-in for triton_launch._scatter_mm: the scatter kernel launched with the
    launcher's constexprs, `forced` over them (block sizes, N_TILES, num_warps, ...)."""

    def __init__(self, **forced):
        self.forced = forced

    def __getitem__(self, grid):
        from sigma_moe.kernels.triton_cvmm import scatter_mm_kernel

        def launch(*args, **consts):
            scatter_mm_kernel[grid](*args, **{**consts, **self.forced})
        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scatter_column_loop_matches_reference(monkeypatch, dtype):
    """The scatter's N_TILES column loop (a program walks several column tiles with its A
    rows loaded once; the autotuner's choice where G <= BLOCK_K): both scatters of the
    fused layer (gate-scaled y, dx) with 3 column tiles of d_model 40 in loops of 2 (the
    last loop half outside N), odd T, an unused expert. On a GPU the autotuner picks."""
    from sigma_moe.kernels import triton_launch

    monkeypatch.setattr(triton_launch, "_scatter_mm", _ScatterAt(N_TILES=2, BLOCK_K=32))
    case = random_case(T=15, D=40, E=4, G=20, K=3, dtype=dtype, device=DEVICE, seed=3,
                       n_unused=1)
    assert_close(compare(run_case(case, "triton"), reference_case(case)), dtype)


def _scatter_with_config(monkeypatch, cfg, scaled, T, N, E, K, G, dtype, device) -> float:
    """launch.scatter_mm with the scatter kernel launched at `cfg` (not autotuned): the
    gate-scaled scatter (the forward's y) or a plain one through a transposed W (dx) ->
    its relative error against float64."""
    from sigma_moe.kernels import triton_launch
    from sigma_moe.kernels.testing import rel_err

    case = random_case(T=T, D=N, E=E, G=G, K=K, dtype=dtype, device=device, n_unused=1)
    r = make_routing(case["expert_TK"], E)
    a = torch.randn(T * K, G, device=device, dtype=dtype)
    w = case["w2_EGD"] if scaled else case["w1_EDG"].transpose(1, 2)  # [E, G, N]
    kw = {"scale": case["gate_TK"].reshape(-1), "order_R": r.order_R} if scaled else {}
    monkeypatch.setattr(triton_launch, "_scatter_mm", _ScatterAt(
        **{"EARLY_Y": False, **cfg.kwargs}, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    y = triton_launch.scatter_mm(a, w, r.tok_R, r.off_S, T, **kw)
    e_R = case["expert_TK"].reshape(-1)[r.order_R]
    out = torch.zeros(T * K, N, dtype=torch.float64, device=device)
    for e in range(E):
        mine = e_R == e
        out[mine] = a[mine].double() @ w[e].double()
    if scaled:
        out *= kw["scale"].double()[r.order_R, None]
    want = torch.zeros(T, N, dtype=torch.float64, device=device)
    return rel_err(y, want.index_add(0, r.tok_R.long(), out))


def _column_loop_configs() -> list:
    from sigma_moe.kernels.triton_tuning import SCATTER_CONFIGS

    return [c for c in SCATTER_CONFIGS if c.kwargs.get("N_TILES", 1) > 1]


def _config_id(cfg) -> str:
    k = cfg.kwargs
    return (f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']}-w{cfg.num_warps}s{cfg.num_stages}"
            f"-n{k['N_TILES']}" + ("-early" if k.get("EARLY_Y") else ""))


@pytest.mark.skipif(not kernels.TRITON_INTERPRET, reason="the interpreter's half (fp32)")
@pytest.mark.parametrize("scaled", [True, False])
def test_scatter_at_a_column_loop_config(monkeypatch, scaled):
    """The helper the GPU test below runs every column-loop config through, here with one of
    them in the interpreter on a small case: 64-column tiles, 16 a loop, d_model 1100 (18
    tiles: one whole loop, and one that ends in a part-filled tile and runs past N)."""
    cfg = _column_loop_configs()[-1]
    assert cfg.kwargs["N_TILES"] == 16 and cfg.kwargs["BLOCK_N"] == 64
    err = _scatter_with_config(monkeypatch, cfg, scaled, T=21, N=1100, E=3, K=2, G=40,
                               dtype=torch.float32, device=DEVICE)
    assert err < 1e-5


def test_triton_bf16_matches_reference():
    case = random_case(T=11, D=16, E=5, G=32, K=2, dtype=torch.bfloat16, device=DEVICE)
    assert_close(compare(run_case(case, "triton"), reference_case(case)), torch.bfloat16)


def test_fused_equals_unfused():
    case = random_case(T=11, D=24, E=4, G=16, K=2, device=DEVICE)
    (y1, g1), (y2, g2) = run_case(case, "triton"), run_case(case, "triton_unfused")
    torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend,K,C,dtype", [
    ("triton", 2, 2, torch.float32), ("triton", 3, 4, torch.float16),
    ("triton_unfused", 2, 3, torch.float32),
])
def test_token_chunks_change_only_the_scatters(backend, K, C, dtype):
    """With C token chunks the scatters run chunk by chunk; the gathers and the weight
    gradients walk the rows as with C = 1 (the same rows, segments and tiles: the same
    bits), and the result matches the reference. More chunks than some segments have
    rows: empty sub-segments."""
    case = random_case(T=23, D=24, E=K + 2, G=20, K=K, dtype=dtype, device=DEVICE, seed=C,
                       n_unused=2)
    y1, (_, gg1, gw11, gw21) = run_case(case, backend)
    got = run_case(case, backend, n_chunks=C)
    assert_close(compare(got, reference_case(case)), dtype)
    _, (_, gg, gw1, gw2) = got
    for a, b in ((gg, gg1), (gw1, gw11), (gw2, gw21)):
        assert torch.equal(a, b)


def test_triton_ops_refuse_routings_they_cannot_run():
    from sigma_moe.kernels import triton_launch
    from sigma_moe.kernels.triton_ops import moe_mlp_triton

    case = random_case(T=6, D=8, E=3, G=8, K=2, device=DEVICE)
    routing = make_routing(case["expert_TK"], 3, n_chunks=2)  # (expert, chunk, slot)
    with pytest.raises(ValueError, match="chunks_in_slots"):
        moe_mlp_triton(case["x_TD"], case["gate_TK"], case["w1_EDG"], case["w2_EGD"], routing)
    one = make_routing(case["expert_TK"], 3)  # K = 2 segments an expert: not 3 chunks
    with pytest.raises(ValueError, match="n_chunks=3 does not divide the 2 segments"):
        triton_launch.gather_mm(case["x_TD"], case["w1_EDG"], one.tok_R, one.off_S, n_chunks=3)


def test_fused_ops_read_strided_gates_and_routing():
    # the kernels read 1-D tensors as ptr + i: the ops are public (torch.ops.sigma_moe),
    # and reshape(-1) of a strided [T, K] gate is a strided view, not a copy
    case = random_case(T=9, D=16, E=3, G=16, K=2, device=DEVICE)
    r = make_routing(case["expert_TK"], 3, chunks_in_slots=True)
    gate = torch.rand(9, 4, device=DEVICE)[:, ::2]
    tok = torch.stack([r.tok_R, r.tok_R], 1)[:, 0]  # stride 2
    x, w1, w2 = case["x_TD"], case["w1_EDG"], case["w2_EGD"]
    ops = torch.ops.sigma_moe
    y, h = ops.fused_fwd(x, gate, w1, w2, tok, r.order_R, r.off_S, 1)
    y_ref, h_ref = ops.fused_fwd(x, gate.contiguous(), w1, w2, r.tok_R, r.order_R, r.off_S, 1)
    assert torch.equal(y, y_ref) and torch.equal(h, h_ref)
    gy = torch.randn_like(y)
    grads = ops.fused_bwd(gy, x, gate, w1, w2, tok, r.order_R, r.off_S, 1, h, True, True, True)
    grads_ref = ops.fused_bwd(gy, x, gate.contiguous(), w1, w2, r.tok_R, r.order_R, r.off_S,
                              1, h, True, True, True)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ref))


@pytest.mark.parametrize("backend", ["triton", "triton_unfused"])
@pytest.mark.parametrize("frozen", FROZEN)
def test_triton_computes_only_the_gradients_needed(backend, frozen, monkeypatch):
    """The other gradients bit for bit as when all are needed, and no launch for the ones
    not needed: a weight gradient each, and dx's slot-ordered scatter."""
    from sigma_moe.kernels import triton_launch

    case = random_case(T=13, D=8, E=4, G=8, K=2, device=DEVICE)
    _, want = run_case(case, backend)
    calls = []
    for name in ("wgrad", "scatter_mm"):
        real = getattr(triton_launch, name)
        monkeypatch.setattr(triton_launch, name,
                            lambda *a, _real=real, _name=name, **kw: calls.append(_name)
                            or _real(*a, **kw))
    _, grads = run_case(case, backend, frozen=frozen)
    for name, g, g_all in zip(GRAD_NAMES, grads, want):
        assert g is None if name in frozen else torch.equal(g, g_all), name
    assert calls.count("wgrad") == 2 - len({"w1", "w2"} & set(frozen))
    assert calls.count("scatter_mm") == 1 + ("x" not in frozen)  # y's, then dx's


@pytest.mark.parametrize("backend", ["triton", "triton_unfused"])
def test_weight_grad_is_deterministic(backend):
    case = random_case(T=37, D=16, E=3, G=16, K=2, device=DEVICE, n_unused=0)  # 2 tiles/slot
    (y1, g1), (y2, g2) = run_case(case, backend), run_case(case, backend)
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


@pytest.mark.skipif(not CUDA and NO_GROUPED_MM is not None, reason=str(NO_GROUPED_MM))
def test_unfused_dropout_matches_grouped_mm_with_same_mask():
    """Both apply F.dropout to the same sorted R x G hidden tensor: same seed, same mask."""
    case = random_case(T=15, D=16, E=4, G=16, K=2, device=DEVICE)
    torch.manual_seed(3)
    y, grads = run_case(case, "triton_unfused", hidden_dropout=0.3, training=True)
    torch.manual_seed(3)
    y_ref, grads_ref = run_case(case, "grouped_mm" if not CUDA else "torch",
                                hidden_dropout=0.3, training=True)
    if CUDA:  # the torch path draws its mask per expert: only check that dropout acted
        assert not torch.allclose(y, run_case(case, "triton")[0])
        return
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu  # on a CPU the test above shows it is grouped_mm's mask and scaling
def test_unfused_dropout_is_unbiased():
    """Its scaling on CUDA, where the test above checks only that something was dropped."""
    dropped, bias = dropout_bias("triton_unfused", DEVICE)
    assert dropped and bias < 0.1  # inverted dropout: E[y] = y without dropout


def test_auto_uses_unfused_triton_for_dropout_on_cuda():
    x, w1 = torch.zeros(3, 8, device=DEVICE), torch.zeros(2, 8, 8, device=DEVICE)
    want = ("triton_unfused", "triton") if CUDA else ("torch", "torch")
    assert kernels.resolve_backend("auto", x, w1, dropout=True) == want[0]
    assert kernels.resolve_backend("auto", x, w1, dropout=False) == want[1]


def test_compile_fullgraph_traces_triton_op():
    case = random_case(T=9, D=16, E=4, G=16, K=2, device=DEVICE)

    def layer(x, expert, gate, w1, w2):
        return moe_mlp(x, expert, gate, w1, w2, backend="triton").square().sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    ins = _leaves(case, ["x_TD", "gate_TK", "w1_EDG", "w2_EGD"])
    loss = compiled(ins[0], case["expert_TK"], *ins[1:])
    grads = torch.autograd.grad(loss, ins)
    loss_ref = layer(ins[0], case["expert_TK"], *ins[1:])
    for g, r in zip(grads, torch.autograd.grad(loss_ref, ins)):
        torch.testing.assert_close(g, r)


# ---------------------------------------------------------------------------- GPU only
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "triton_unfused", "grouped_mm"])
def test_gpu_bf16_large(backend):
    if kernels.backend_problem(backend, torch.zeros(1, device="cuda", dtype=torch.bfloat16),
                               torch.zeros(1, 8, 8, device="cuda")) is not None:
        pytest.skip(f"{backend} not applicable on this GPU")
    case = random_case(T=4099, D=512, E=16, G=128, K=4, dtype=torch.bfloat16, device="cuda")
    assert_close(compare(run_case(case, backend), reference_case(case)), torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("C", [2, 4])
def test_gpu_bf16_token_chunks(C):
    """The fused layer with its scatters chunk by chunk (their own autotuned configs: the
    key holds K*C), bf16 on tensor cores, against the reference."""
    case = random_case(T=4099, D=512, E=16, G=128, K=4, dtype=torch.bfloat16, device="cuda")
    got = run_case(case, "triton", n_chunks=C)
    assert_close(compare(got, reference_case(case)), torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("cfg", _column_loop_configs() if kernels.HAS_TRITON else [],
                         ids=_config_id)
def test_gpu_scatter_column_loop_configs(monkeypatch, cfg, scaled):
    """Every column-loop config of the scatter on its own, bf16 (the autotuner took one for
    every scatter at d_model 1024 on the H200; the tests above run the first config, which
    is no loop): d_model 1000, a part-filled column tile and loops that run past N."""
    err = _scatter_with_config(monkeypatch, cfg, scaled, T=4099, N=1000, E=16, K=4, G=128,
                               dtype=torch.bfloat16, device="cuda")
    assert err < TOLERANCE[torch.bfloat16], err


@gpu
@needs_cuda
def test_gpu_deterministic_and_no_expanded_buffer():
    T, D, E, G, K = 8192, 1024, 32, 128, 4
    case = random_case(T=T, D=D, E=E, G=G, K=K, dtype=torch.bfloat16, device="cuda")
    (y1, g1), (y2, g2) = run_case(case, "triton"), run_case(case, "triton")  # 1st: autotune
    for a, b in zip((y1, *g1), (y2, *g2)):
        assert torch.equal(a, b)
    x, gate, w1, w2 = (case[k].clone().requires_grad_()
                       for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = moe_mlp(x, case["expert_TK"], gate, w1, w2, backend="triton")
    fwd_peak = torch.cuda.max_memory_allocated() - base
    # the forward holds y (T x D) and h (R x G) plus the routing (sort keys, indices, the
    # sort's scratch: ~100 bytes a row): never a T*K*D tensor (2048 bytes a row here)
    assert fwd_peak < 1.1 * (T * D + T * K * G) * 2 + 128 * T * K, fwd_peak
    assert y.shape == (T, D)


@gpu
@needs_cuda
def test_gpu_fused_faster_than_loop():
    case = random_case(T=32768, D=512, E=16, G=128, K=4, dtype=torch.bfloat16, device="cuda")

    def ms(backend, n=5):
        run_case(case, backend)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run_case(case, backend)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n

    assert ms("triton") < ms("reference")


def test_a_launch_makes_its_tensors_device_current(monkeypatch):
    """Triton launches on the current CUDA device: cuda:1 tensors with cuda:0 current failed
    ("Pointer argument cannot be accessed"). Driven with a stand-in CUDA tensor."""
    import contextlib

    from sigma_moe.kernels import triton_launch

    made_current = []

    @contextlib.contextmanager
    def device(d):
        made_current.append(d)
        yield

    class OnCuda1:
        is_cuda, device = True, torch.device("cuda", 1)

    monkeypatch.setattr(torch.cuda, "device", device)
    launch = triton_launch._on_tensor_device(lambda a, n, scale=1: (a, n, scale))
    a = OnCuda1()
    assert launch(a, 3, scale=2) == (a, 3, 2) and made_current == [torch.device("cuda", 1)]
    launch(torch.zeros(1), 0)  # CPU tensors (the interpreter): no CUDA context
    assert len(made_current) == 1
