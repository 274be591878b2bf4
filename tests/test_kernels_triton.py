"""The CVMM Triton kernels (kernels/triton_*.py) against the per-expert reference.

On a CPU these run in the Triton interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton is imported); shapes stay tiny so the whole file takes seconds. Tests that
need a real GPU (bf16 tensor cores, large shapes, timing) carry `@pytest.mark.gpu`.
"""
import pytest
import torch

import kernels
from kernels import moe_mlp
from kernels.routing import make_routing
from kernels.testing import (
    NO_GROUPED_MM,
    assert_close,
    compare,
    dropout_bias,
    random_case,
    reference_case,
    run_case,
)
from tests.triton_helpers import (
    CUDA,
    DEVICE,
    TRITON_MARKS,
    need_hopper_toolchain,
    outside_interpreter,
)

pytestmark = TRITON_MARKS

def _leaves(case, names):
    return [case[n].clone().requires_grad_() for n in names]


def test_cvmm_gather_op():
    """C[r] = x[tok[r]] @ W[e_r] and its gradients (dx through the slot-ordered scatter)."""
    from kernels.triton_ops import cvmm_gather

    case = random_case(T=19, D=24, E=5, G=20, K=3, device=DEVICE)
    r = make_routing(case["expert_TK"], 5)
    x, w = _leaves(case, ["x_TD", "w1_EDG"])
    c = cvmm_gather(x, w, r.tok_R, r.off_S)
    e_R = case["expert_TK"].reshape(-1)[r.order_R]
    want = torch.einsum("rd,rdg->rg", x[r.tok_R.long()], w[e_R])
    gc = torch.randn_like(c)
    torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(torch.autograd.grad(c, (x, w), gc),
                        torch.autograd.grad(want, (x, w), gc)):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)


def test_cvmm_scatter_op():
    """Y[t] = sum_k A[r(t,k)] @ W[e_r] and its gradients (dA through the gathered kernel)."""
    from kernels.triton_ops import cvmm_scatter

    case = random_case(T=17, D=20, E=6, G=24, K=4, device=DEVICE, n_unused=2)
    r = make_routing(case["expert_TK"], 6)
    a = torch.randn(17 * 4, 24, device=DEVICE, requires_grad=True)
    (w,) = _leaves(case, ["w2_EGD"])
    y = cvmm_scatter(a, w, r.tok_R, r.off_S)
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

    from kernels.triton_cvmm import _segment_tile

    @triton.jit
    def _tiles_kernel(off_ptr, out_ptr, n_seg, reverse, BLOCK_M: tl.constexpr,
                      SEG_P2: tl.constexpr):
        pid = tl.program_id(0)
        seg, row0, row_end = _segment_tile(pid, off_ptr, n_seg, 1, 0, reverse, BLOCK_M, SEG_P2)
        tl.store(out_ptr + 3 * pid, seg)
        tl.store(out_ptr + 3 * pid + 1, row0)
        tl.store(out_ptr + 3 * pid + 2, row_end)


@pytest.mark.parametrize("reverse", [0, 1])
def test_tile_order_covers_every_row_once(reverse):
    """The in-kernel tile lookup (round by round over the segments) is a bijection."""
    counts = [5, 0, 40, 16, 17, 0, 1]  # empty, partial and multi-tile segments
    off = torch.tensor([0, *counts], device=DEVICE).cumsum(0).to(torch.int32)
    n_prog = sum(-(-c // 4) for c in counts) + len(counts)  # the launchers' upper bound
    out = torch.full((n_prog, 3), -1, dtype=torch.int32, device=DEVICE)
    _tiles_kernel[(n_prog,)](off, out, len(counts), reverse, BLOCK_M=4, SEG_P2=8)
    out = out.cpu()
    real = out[out[:, 0] < len(counts)]
    assert len(real) == sum(-(-c // 4) for c in counts)
    covered = sorted(r for s, r0, end in real.tolist() for r in range(r0, min(r0 + 4, end)))
    assert covered == list(range(sum(counts)))
    for s, r0, end in real.tolist():  # each tile inside its own segment
        assert off[s] <= r0 < end == off[s + 1]
    # round by round: the first len(nonempty) tiles (of the launch order) are tile 0 of each
    first = real[-5:] if reverse else real[:5]
    assert sorted(first[:, 0].tolist()) == [0, 2, 3, 4, 6]


def test_skewed_routing_matches_reference():
    """Most rows on one expert (many tiles per segment), one expert never chosen."""
    case = random_case(T=70, D=16, E=4, G=16, K=2, device=DEVICE, seed=5)
    t = torch.arange(70)
    first = torch.where(t < 50, 2, t % 3)  # expert 2: 50 + rows, several tiles per segment
    case["expert_TK"] = torch.stack([first, (first + 1 + t % 2) % 3], 1).to(DEVICE)
    for backend in ("triton", "triton_unfused"):
        assert_close(compare(run_case(case, backend), reference_case(case)), torch.float32)


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


def test_triton_bf16_matches_reference():
    case = random_case(T=11, D=16, E=5, G=32, K=2, dtype=torch.bfloat16, device=DEVICE)
    assert_close(compare(run_case(case, "triton"), reference_case(case)), torch.bfloat16)


def test_fused_equals_unfused():
    case = random_case(T=11, D=24, E=4, G=16, K=2, device=DEVICE)
    (y1, g1), (y2, g2) = run_case(case, "triton"), run_case(case, "triton_unfused")
    torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


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


def _compile_for_hopper(*args: str) -> list[dict]:
    """Reports of `python -m kernels.triton_aot *args` (skips without ptxas / new Triton)."""
    import json

    need_hopper_toolchain()
    stdout = outside_interpreter("-m", "kernels.triton_aot", *args)
    return [json.loads(line) for line in stdout.splitlines()]


def test_kernels_compile_for_hopper():
    """Real Triton (not the interpreter) compiles every kernel variant for sm_90, with
    wgmma products and a software-pipelined (cp.async) K loop; no GPU needed."""
    reports = _compile_for_hopper()
    assert len(reports) == 8
    for r in reports:
        assert r["wgmma"] > 0 and r["async_copies"] > 0, r
        assert r["shared_bytes"] <= 227 * 1024, r  # fits an H100 SM


def test_smem_estimate_is_what_triton_allocates():
    """fitting_configs' estimate is the shared memory of every compiled fp32 config (sm_90;
    of the wgrad kernel with 2 stages, an upper bound), so the pruning drops exactly the
    configs that cannot run on an H100."""
    from kernels.triton_launch import (
        H100_SMEM,
        MM_CONFIGS,
        SCATTER_CONFIGS,
        SMALL_CONFIG,
        WGRAD_CONFIGS,
        fitting_configs,
    )

    reports = _compile_for_hopper("fp32", "--all-configs")
    by_kernel = {k: [r for r in reports if r["kernel"] == k]
                 for k in ("gather_mm_kernel", "scatter_mm_kernel", "wgrad_kernel")}
    gather, wgrad = by_kernel["gather_mm_kernel"], by_kernel["wgrad_kernel"]
    # two variants each x (the autotune configs + the small one)
    assert [len(r) for r in by_kernel.values()] == [
        2 * (len(c) + 1) for c in (MM_CONFIGS, SCATTER_CONFIGS, WGRAD_CONFIGS)]
    wave = [r for r in reports if r["kernel"] == "scatter_wave_kernel"]
    assert all(r["shared_bytes"] == r["estimate"]
               for r in gather + by_kernel["scatter_mm_kernel"] + wave), reports
    assert all(r["shared_bytes"] == r["estimate"] for r in wgrad if r["num_stages"] > 2), wgrad
    assert all(r["shared_bytes"] <= r["estimate"] for r in wgrad), wgrad
    assert all(r["fits"] == (r["shared_bytes"] <= H100_SMEM) for r in reports)

    def tiles(cfg):
        return (*(cfg.kwargs[b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K")), cfg.num_stages)

    def fitting(reports):
        return {(*(r["variant"][b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K")), r["num_stages"])
                for r in reports if r["fits"]} - {tiles(SMALL_CONFIG)}

    # 128x128x64 (4 stages), 128x256x64 and 256x128x64 (3 stages) do not fit in fp32
    kept = fitting_configs(MM_CONFIGS, H100_SMEM, 4)
    assert {tiles(c) for c in kept} == fitting(gather) and len(kept) == len(MM_CONFIGS) - 3
    # fp32 doubles the tiles: the deepest wgrad pipelines of the widest tiles do not fit
    kept = fitting_configs(WGRAD_CONFIGS, H100_SMEM, 4, wgrad=True)
    assert {tiles(c) for c in kept} == fitting(wgrad)
    assert len(kept) == len(WGRAD_CONFIGS) - 3


def test_fitting_configs_per_gpu():
    from kernels.triton_launch import (
        H100_SMEM,
        MM_CONFIGS,
        SMALL_CONFIG,
        WGRAD_CONFIGS,
        fitting_configs,
        smem_bytes,
    )

    assert fitting_configs(MM_CONFIGS, H100_SMEM, 2) == MM_CONFIGS  # bf16 on an H100
    a100 = fitting_configs(MM_CONFIGS, 166912, 4)  # fp32 on an A100: 163 KB
    assert [smem_bytes(c, 4) for c in a100] == [131072, 98304]
    assert fitting_configs(MM_CONFIGS, 65536, 4) == [SMALL_CONFIG]  # fp32, 64 KB: T4
    assert smem_bytes(SMALL_CONFIG, 4) <= 65536
    assert smem_bytes(SMALL_CONFIG, 4, wgrad=True) <= 65536
    # bf16 on a consumer GPU's 99 KB: all but 128x128x64 with 4 buffers and the 256-wide tiles
    assert [smem_bytes(c, 2, wgrad=True) for c in fitting_configs(
        WGRAD_CONFIGS, 101376, 2, wgrad=True)] == [98816, 65920, 99072, 99072, 65792]
    # fp32 there: the small one (the 2-buffer tiles that fitted went with the deeper ones)
    assert fitting_configs(WGRAD_CONFIGS, 101376, 4, wgrad=True) == [SMALL_CONFIG]


def test_autotune_candidates_per_precision_and_switch(monkeypatch):
    """fp32 without TF32 runs on FMA units, where every tile above 64x64 spills: its own
    configs; SIGMA_MOE_TRITON_AUTOTUNE=0 (the GPU tests) keeps the first that fits."""
    import kernels.triton_launch as L

    monkeypatch.setattr(L, "max_shared_mem", lambda index: L.H100_SMEM)
    monkeypatch.setattr(L, "AUTOTUNE", True)
    a = {"a_ptr": torch.zeros(1)}
    assert L._prune_to_smem(L.MM_CONFIGS, a, DOT_F32=True, PRECISION="ieee") == L.IEEE_CONFIGS
    tf32 = L._prune_to_smem(L.MM_CONFIGS, a, DOT_F32=True, PRECISION="tf32")
    assert tf32 == L.fitting_configs(L.MM_CONFIGS, L.H100_SMEM, 4) and len(tf32) == 5
    a16 = {"a_ptr": torch.zeros(1, dtype=torch.bfloat16)}
    assert L._prune_to_smem(L.MM_CONFIGS, a16, DOT_F32=False, PRECISION="tf32") == L.MM_CONFIGS
    monkeypatch.setattr(L, "AUTOTUNE", False)
    assert L._prune_to_smem(L.MM_CONFIGS, a16, DOT_F32=False, PRECISION="tf32") == [
        L.MM_CONFIGS[0]]
    assert L._prune_wgrad_to_smem(L.WGRAD_CONFIGS, a, DOT_F32=True, PRECISION="ieee") == [
        L.IEEE_CONFIGS[0]]


def test_tf32_is_read_from_either_torch_api():
    """Reading the legacy `allow_tf32` raises once the `fp32_precision` API was used (torch
    >= 2.9): fp32 launches crashed in such a process."""
    from types import SimpleNamespace as NS

    from kernels.triton_launch import tf32_allowed

    assert tf32_allowed(NS(allow_tf32=True)) and not tf32_allowed(NS(allow_tf32=False))
    assert tf32_allowed(NS(fp32_precision="tf32"), NS(fp32_precision="ieee"))
    assert not tf32_allowed(NS(fp32_precision="ieee"), NS(fp32_precision="tf32"))
    assert tf32_allowed(NS(fp32_precision="none"), NS(fp32_precision="tf32"))  # inherits
    assert not tf32_allowed(NS(fp32_precision="none"), NS(fp32_precision="none"))
    tf32_allowed()  # this torch's own settings: no error


def test_fp32_without_tf32_compiles_without_spills():
    """The IEEE configs: every kernel variant for sm_90 without spills (the tensor-core
    configs need over 255 registers per thread on FMA units and spill up to 2 KB)."""
    reports = _compile_for_hopper("fp32-ieee", "--all-configs", "--spills")
    from kernels.triton_launch import IEEE_CONFIGS

    assert len(reports) == 4 * 2 * len(IEEE_CONFIGS)
    assert all(r["spill_bytes"] == 0 for r in reports), reports


def test_gpu_autotuners_prune_and_cache():
    """Outside the interpreter the kernels are autotuned over the configs that fit the GPU,
    timed on CUDA-graph replays (`graph_bench`), and (Triton >= 3.4) the choice is kept on
    disk, so a resumed run sums in the same order."""
    import inspect

    import triton

    stdout = outside_interpreter("-c", (
        "import kernels.triton_launch as L, kernels.triton_wave as W\n"
        "for a in (L._gather_mm, L._scatter_mm, L._wgrad, W._scatter_wave):\n"
        "    print(getattr(a, 'cache_results', False), a.early_config_prune.__name__,\n"
        "          a._do_bench.__name__)\n"))
    caching = str("cache_results" in inspect.signature(triton.autotune).parameters)
    assert stdout.split() == [caching, "_prune_to_smem", "graph_bench",
                              caching, "_prune_to_smem", "graph_bench",
                              caching, "_prune_wgrad_to_smem", "graph_bench",
                              caching, "_prune_to_table", "graph_bench"]


def test_autotune_times_graph_replays_after_the_callers_kernels(monkeypatch):
    """graph_bench: a device sync first (do_bench_cudagraph runs on a stream of its own,
    which would not wait for the kernels that write this launch's inputs), then CUDA-graph
    replays of the launch, with the autotuner's quantiles."""
    import triton.testing

    from kernels import triton_launch

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph",
                        lambda fn, rep, quantiles: calls.append(("graphs", fn, rep, quantiles))
                        or [1.0, 0.9, 1.1])
    launch = object()
    assert triton_launch.graph_bench(launch, quantiles=(0.5, 0.2, 0.8)) == [1.0, 0.9, 1.1]
    assert calls == ["sync", ("graphs", launch, triton_launch.GRAPH_BENCH_REP_MS,
                              (0.5, 0.2, 0.8))]
    # a capture that fails: timed launch by launch after all, with a warning

    def no_capture(fn, rep, quantiles):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", no_capture)
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, quantiles: calls.append(("events", fn)) or [2.0, 1.9, 2.1])
    calls.clear()
    with pytest.warns(UserWarning, match="CUDA-graph replays failed .*stream is capturing"):
        assert triton_launch.graph_bench(launch, quantiles=(0.5,)) == [2.0, 1.9, 2.1]
    assert calls == ["sync", "sync", ("events", launch)]


def test_host_arithmetic_is_tritons():
    """triton_launch.cdiv / next_power_of_2 (plain Python on the host, where Triton's are
    constexpr functions costing ~1.4 us a call) agree with Triton's."""
    import triton

    from kernels.triton_launch import cdiv, next_power_of_2

    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(300) for b in range(1, 70))
    assert all(next_power_of_2(n) == triton.next_power_of_2(n) for n in range(1, 5000))


def test_precompile_compiles_the_configs_an_autotuner_would_try(monkeypatch):
    """kernels/triton_precompile.py: inside `compiling_only` an autotuned launch compiles
    (warmup=True: nothing runs) each config its pruning keeps, with the launch's own
    arguments, inside Triton's AsyncCompileMode, and a backward stays on this thread (on
    CUDA autograd's device thread would not see the compile mode: its compiles would go one
    by one); after it, launches run again. A failure is reported, not raised: compiling
    ahead only saves time."""
    import triton
    from triton.runtime import _async_compile
    from triton.runtime.autotuner import Autotuner

    from kernels import triton_precompile

    calls = []

    class Kernel:  # the part of a JITFunction that an autotuner uses
        @staticmethod
        def fn(x_ptr, n, BLOCK):
            pass

        def run(self, *args, grid, warmup, **kwargs):
            calls.append((args, grid, warmup, kwargs["BLOCK"], kwargs["num_warps"],
                          _async_compile.active_mode.get() is not None,
                          torch.autograd.is_multithreading_enabled()))

    tuner = Autotuner(
        Kernel(), ["x_ptr", "n"], [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64)],
        key=["n"], reset_to_zero=None, restore_value=None,
        prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: [
            c for c in configs if c.kwargs["BLOCK"] <= named_args["n"]]})
    run = Autotuner.run
    with triton_precompile.compiling_only(workers=2):
        tuner[(3,)]("x", 32)
    assert Autotuner.run is run and tuner.nargs is None
    assert calls == [(("x", 32), (3,), True, 16, 4, True, False),
                     (("x", 32), (3,), True, 32, 4, True, False)]
    assert torch.autograd.is_multithreading_enabled()
    monkeypatch.setenv("SIGMA_MOE_PRECOMPILE", "0")
    assert triton_precompile.precompile(lambda: None) == (
        "precompile: skipped, off (SIGMA_MOE_PRECOMPILE=0)")
    monkeypatch.setattr(triton_precompile, "precompile_problem", lambda: None)
    said = triton_precompile.precompile(lambda: tuner[(3,)]("x", None), workers=2)
    assert said.startswith("precompile: failed (TypeError: ") and Autotuner.run is run


# one forward+backward of the fused layer under `precompile`, in real Triton (outside the
# interpreter) with a stand-in CUDA driver: it targets sm_90 and has nothing to launch with
PRECOMPILE_LAYER = """
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

class StandIn:
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)

driver.set_active(StandIn())
import kernels.triton_launch as L
from kernels import triton_ops
from kernels.routing import make_routing
from kernels.triton_precompile import precompile

L.max_shared_mem = lambda index: L.H100_SMEM
T, D, E, G, K = 64, 256, 8, 64, 4
x, gate, w1, w2 = (torch.randn(*s, dtype=torch.bfloat16).requires_grad_()
                   for s in ((T, D), (T, K), (E, D, G), (E, G, D)))
routing = make_routing(torch.rand(T, E).argsort(-1)[:, :K], E)

def layer():
    y = triton_ops.moe_mlp_triton(x, gate, w1, w2, routing)
    torch.autograd.grad(y, (x, gate, w1, w2), torch.randn_like(y))

print(precompile(layer, workers=2))
print(*(f"{k} {len(getattr(L, k).fn.device_caches[0][0])}"
        for k in ("_gather_mm", "_scatter_mm", "_wgrad")))

# then the real run, the autotuner's trials timed by a stub and every launch a no-op: it
# must find each kernel compiled under the key the warm-up filled
from types import SimpleNamespace
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

StandIn.launcher_cls = staticmethod(lambda src, metadata: lambda *args: None)
StandIn.utils = SimpleNamespace(load_binary=lambda *args: (None, None, 0, 0, 1024),
                                get_device_properties=lambda device: {"max_shared_mem": 232448})
Autotuner._bench = lambda self, *args, config, **kwargs: [1.0, 1.0, 1.0]
compiles, do_compile = [], JITFunction._do_compile
JITFunction._do_compile = lambda self, *a, **k: compiles.append(self) or do_compile(self, *a, **k)
layer()
print("compiled by the run after it:", len(compiles))
"""


def test_precompile_compiles_the_fused_layer_for_hopper_and_launches_nothing():
    """The real JIT path on this CPU machine: under `precompile`, a forward+backward of the
    fused layer compiles every kernel variant it launches (one config each here: the tests
    set SIGMA_MOE_TRITON_AUTOTUNE=0) and runs none (the stand-in driver cannot launch: a
    launch would fail the run). The scatter has 4 variants (with and without the gate
    scale, the first slot and the others), not 6: its slot index is not specialised. The
    real run after it (trials stubbed, launches no-ops) compiles nothing more."""
    need_hopper_toolchain()
    said = outside_interpreter("-c", PRECOMPILE_LAYER).splitlines()
    assert said[0].startswith("precompile: the autotune configs of the Triton launches "
                              "compiled in "), said
    assert said[1] == "_gather_mm 2 _scatter_mm 4 _wgrad 2"
    assert said[2] == "compiled by the run after it: 0"


def test_bench_products_checks_the_rearranged_launches(tmp_path, monkeypatch, capsys):
    """scripts/bench_products.py end to end on a tiny case: the layer's launches, the
    rearranged ones (pre-gathered rows; an expert's rows token-interleaved by the routing's
    chunks, for the weight gradient: the same sum in another order) and bmm, timed in the
    same rounds; a rearranged launch that disagrees fails the run, after its JSON."""
    import json

    from kernels import triton_launch
    from scripts import bench_products

    path = tmp_path / "products.json"
    argv = ["--tokens", "37", "--d-model", "16", "--n-experts", "5", "--expert-size", "16",
            "--k", "2", "--chunks", "2", "5", "--dtype", "fp32", "--warmup", "0", "--reps",
            "1", "--out", str(path)]
    bench_products.main(argv)
    rows = {(r["product"], r["variant"]): r for r in json.loads(path.read_text())["results"]}
    wgrad_variants = ["layer", "interleaved C=2", "interleaved C=5", "bmm"]
    assert list(rows) == [
        *[("gather fwd", v) for v in ("layer", "rows pre-gathered", "bmm")],
        *[(p, v) for p in ("wgrad dW1", "wgrad dW2") for v in wgrad_variants],
        ("scatter fwd", "layer"), ("scatter fwd", "bmm")]
    assert all(r["ms"] > 0 and r["x_layer"] > 0 for r in rows.values())
    assert rows["gather fwd", "layer"]["x_layer"] == 1.0
    assert rows["gather fwd", "bmm"]["flops"] == 2 * (37 * 2 // 5) * 5 * 16 * 16
    said = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in said if ln.startswith("check")] == [
        "check gather fwd: ok", "check wgrad dW1: ok", "check wgrad dW2: ok"]
    real = triton_launch.wgrad  # one that drops a chunk's rows
    monkeypatch.setattr(triton_launch, "wgrad", lambda a, b, tok, off, E, *f: real(
        a, b, tok, off if off.numel() - 1 == E * 2 else off.clamp(max=off[1]), E, *f))
    path.unlink()
    with pytest.raises(SystemExit, match="a rearranged variant disagrees"):
        bench_products.main(argv)
    assert path.is_file()
    checks = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("check")]
    assert checks[1].startswith("check wgrad dW1: FAIL {'interleaved C=2': ")


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


@gpu
@needs_cuda
@pytest.mark.parametrize("schedule", ["slots", "wave"])
def test_gpu_precompile_leaves_nothing_to_compile(schedule, monkeypatch):
    """After `precompile` of a layer's forward+backward, the real run (autotuning, then the
    launches) compiles nothing more: every trial found its config compiled under the key
    the warm-up filled. The result is still right: the warm-up ran no autotuned kernel and
    left nothing behind."""
    from kernels import triton_launch, triton_ops, triton_precompile, triton_wave

    monkeypatch.setattr(triton_ops, "SCATTER", schedule)
    # a shape of its own (odd tokens, G = 48), so that the kernels are new to this process
    case = random_case(T=523, D=208, E=8, G=48, K=3, dtype=torch.bfloat16, device="cuda")
    said = triton_precompile.precompile(lambda: run_case(case, "triton"))
    assert said.startswith("precompile: the autotune configs"), said
    tuners = [triton_launch._gather_mm, triton_launch._scatter_mm, triton_launch._wgrad,
              triton_wave._scatter_wave]
    device = torch.cuda.current_device()

    def compiled():
        return [len(t.fn.device_caches[device][0]) for t in tuners]

    before = compiled()
    got = run_case(case, "triton")
    assert compiled() == before
    assert_close(compare(got, reference_case(case)), torch.bfloat16)


def test_a_launch_makes_its_tensors_device_current(monkeypatch):
    """Triton launches on the current CUDA device: cuda:1 tensors with cuda:0 current failed
    ("Pointer argument cannot be accessed"). Driven with a stand-in CUDA tensor."""
    import contextlib

    from kernels import triton_launch

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
