"""Compiling the autotune configs ahead, in parallel (sigma_moe/kernels/triton_precompile.py): the
autotuner's launches compile instead of running, and the real run after it finds them
compiled (on this CPU through a stand-in CUDA driver for sm_90; on a GPU for real); and
launching past the autotuner once it chose (sigma_moe/kernels/triton_tuning.launch_kernel).
"""
import pytest
import torch

from sigma_moe.kernels.testing import assert_close, compare, random_case, reference_case, run_case
from tests.triton_helpers import (
    CUDA,
    STAND_IN_DRIVER,
    TRITON_MARKS,
    need_hopper_toolchain,
    outside_interpreter,
)

pytestmark = TRITON_MARKS


def fake_tuner(record, **autotune):
    """A Triton Autotuner over configs BLOCK = 16, 32, 64, keyed on n, of a stand-in for
    kernel(x_ptr, n, BLOCK) whose launches call record(args, grid, warmup, kwargs)."""
    import triton
    from triton.runtime.autotuner import Autotuner

    class Kernel:  # the part of a JITFunction that an autotuner uses
        @staticmethod
        def fn(x_ptr, n, BLOCK):
            pass

        def run(self, *args, grid, warmup, **kwargs):
            record(args, grid, warmup, kwargs)

    return Autotuner(Kernel(), ["x_ptr", "n"],
                     [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64)],
                     key=["n"], reset_to_zero=None, restore_value=None, **autotune)


def test_precompile_compiles_the_configs_an_autotuner_would_try(monkeypatch):
    """sigma_moe/kernels/triton_precompile.py: inside `compiling_only` an autotuned launch compiles
    (warmup=True: nothing runs) each config its pruning keeps, with the launch's own
    arguments, inside Triton's AsyncCompileMode, and a backward stays on this thread (on
    CUDA autograd's device thread would not see the compile mode: its compiles would go one
    by one); after it, launches run again. A failure is reported, not raised: compiling
    ahead only saves time."""
    from triton.runtime import _async_compile
    from triton.runtime.autotuner import Autotuner

    from sigma_moe.kernels import triton_precompile

    calls = []
    tuner = fake_tuner(
        lambda args, grid, warmup, kwargs: calls.append((
            args, grid, warmup, kwargs["BLOCK"], kwargs["num_warps"],
            _async_compile.active_mode.get() is not None,
            torch.autograd.is_multithreading_enabled())),
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
        "precompile: skipped, off (SIGMA_MOE_PRECOMPILE=0)", False)
    monkeypatch.setattr(triton_precompile, "precompile_problem", lambda: None)
    said = triton_precompile.precompile(lambda: tuner[(3,)]("x", None), workers=2)
    assert said.failed and Autotuner.run is run
    assert str(said).startswith("precompile: failed (TypeError: ")


def test_compiling_only_puts_back_the_runs_it_patched():
    """COMPILE_ONLY's kernels get a compile-only `run` within, and afterwards what they had
    before: a nested entry (which Triton refuses: one AsyncCompileMode at a time) keeps
    the outer's patch; a `run` of someone else's survives."""
    from sigma_moe.kernels.triton_precompile import COMPILE_ONLY, compiling_only

    kernel = COMPILE_ONLY[0]
    assert "run" not in vars(kernel)
    with compiling_only(1):
        outer = kernel.run
        try:
            with compiling_only(1):
                pass
        except RuntimeError:  # "Another AsyncCompileMode is already active"
            pass
        assert kernel.run is outer
    assert "run" not in vars(kernel)

    def mine(*args, **kwargs):
        return None

    kernel.run = mine
    try:
        with compiling_only(1):
            assert kernel.run is not mine
        assert kernel.run is mine
    finally:
        del kernel.run


def test_launch_kernel_goes_past_the_autotuner_once_it_chose(monkeypatch):
    """sigma_moe/kernels/triton_tuning.launch_kernel: the first launch of a key (the tuner's key
    arguments and every pointer's dtype, what Triton's own key holds) goes through the
    autotuner, which times the configs; later launches of that key run the same launch
    (grid, arguments and every kwarg of the config) without asking it; another key value
    or another dtype asks it again; inside `compiling_only` every launch compiles instead.
    An autotuner that keys its choices otherwise is asked every time."""
    from triton.runtime.autotuner import Autotuner

    from sigma_moe.kernels import triton_precompile, triton_tuning

    ran, timed, asked = [], [], []
    tuner = fake_tuner(lambda args, grid, warmup, kwargs: ran.append(
        (args[0].dtype, args[1], grid, warmup, kwargs)))
    monkeypatch.setattr(tuner, "_bench", lambda *args, config, **kwargs: timed.append(
        config.kwargs["BLOCK"]) or [1.0 if config.kwargs["BLOCK"] == 32 else 2.0] * 3)
    getitem = Autotuner.__getitem__
    monkeypatch.setattr(Autotuner, "__getitem__",
                        lambda self, grid: asked.append(grid) or getitem(self, grid))
    x16, x32 = torch.zeros(2, dtype=torch.float16), torch.zeros(2)
    triton_tuning.launch_kernel(tuner, (1,), x16, 8)
    assert timed == [16, 32, 64] and len(asked) == 1
    assert ran[0][:4] == (torch.float16, 8, (1,), False) and ran[0][4]["BLOCK"] == 32
    triton_tuning.launch_kernel(tuner, (1,), x16, 8)  # known: straight to the kernel
    assert len(asked) == 1 and ran[1] == ran[0] and "num_warps" in ran[1][4]
    triton_tuning.launch_kernel(tuner, (1,), x32, 8)  # another dtype: asked, timed
    triton_tuning.launch_kernel(tuner, (1,), x16, 9)  # another n: asked, timed
    assert len(asked) == 3 and timed == [16, 32, 64] * 3
    assert [r[:2] for r in ran[2:]] == [(torch.float32, 8), (torch.float16, 9)]
    ran.clear()
    with triton_precompile.compiling_only(workers=1):
        triton_tuning.launch_kernel(tuner, (1,), x16, 8)
    assert [(r[3], r[4]["BLOCK"]) for r in ran] == [(True, b) for b in (16, 32, 64)]

    class OtherKeys(dict):  # a Triton whose autotuner would key its choices otherwise
        def __setitem__(self, key, config):
            super().__setitem__(("other", key), config)

        def __getitem__(self, key):
            return super().__getitem__(("other", key))

        def __contains__(self, key):
            return super().__contains__(("other", key))

    tuner.cache = OtherKeys()
    asked.clear()
    for _ in range(2):
        triton_tuning.launch_kernel(tuner, (1,), x16, 10)
    assert len(asked) == 2  # nothing found under the launch's key: asked every time


# one forward+backward of the fused layer under `precompile`, in real Triton (outside the
# interpreter) with a stand-in CUDA driver: it targets sm_90 and has nothing to launch with
PRECOMPILE_LAYER = STAND_IN_DRIVER + """
import torch
import sigma_moe.kernels.triton_launch as L
import sigma_moe.kernels.triton_tuning as tuning
from sigma_moe.kernels import triton_ops
from sigma_moe.kernels.routing import make_routing
from sigma_moe.kernels.triton_precompile import precompile

tuning.max_shared_mem = lambda index: tuning.H100_SMEM
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

launches = []
StandIn.launcher_cls = staticmethod(lambda src, metadata: lambda *args: launches.append(1))
StandIn.utils = SimpleNamespace(load_binary=lambda *args: (None, None, 0, 0, 1024),
                                get_device_properties=lambda device: {"max_shared_mem": 232448})
Autotuner._bench = lambda self, *args, config, **kwargs: [1.0, 1.0, 1.0]
compiles, do_compile = [], JITFunction._do_compile
JITFunction._do_compile = lambda self, *a, **k: compiles.append(self) or do_compile(self, *a, **k)
layer()
print("compiled by the run after it:", len(compiles))

# the next run goes past the autotuners (launch_kernel: their choices are known), and a
# precompile after it still compiles only, even where a choice is known
tuned, getitem = [], Autotuner.__getitem__
Autotuner.__getitem__ = lambda self, grid: tuned.append(self) or getitem(self, grid)

def counted(name):
    n, c = len(launches), len(compiles)
    tuned.clear()
    layer()
    print(f"{name}: {len(launches) - n} launches, {len(tuned)} through an autotuner, "
          f"{len(compiles) - c} compiles")

counted("the next run")
n = len(launches)
precompile(layer, workers=2)
print(f"a precompile after it: {len(launches) - n} launches")
"""


def test_precompile_compiles_the_fused_layer_for_hopper_and_launches_nothing():
    """The real JIT path on this CPU machine: under `precompile`, a forward+backward of the
    fused layer compiles every kernel variant it launches (one config each here: the tests
    set SIGMA_MOE_TRITON_AUTOTUNE=0) and runs none (the stand-in driver cannot launch: a
    launch would fail the run). The scatter has 4 variants (with and without the gate
    scale, the first slot and the others), not 6: its slot index is not specialised. The
    real run after it (trials stubbed, launches no-ops) compiles nothing more; the run
    after that launches past the autotuners (`launch_kernel`), and a precompile then
    launches nothing."""
    need_hopper_toolchain()
    said = outside_interpreter("-c", PRECOMPILE_LAYER).splitlines()
    assert said[0].startswith("precompile: the autotune configs of the Triton launches "
                              "compiled in "), said
    assert said[1] == "_gather_mm 2 _scatter_mm 4 _wgrad 2"
    assert said[2] == "compiled by the run after it: 0"
    # the layer's launches: 2 gathers, 2 x K = 8 slot scatters, 2 weight gradients and
    # their 2 reductions (not autotuned)
    assert said[3:] == ["the next run: 14 launches, 0 through an autotuner, 0 compiles",
                        "a precompile after it: 0 launches"]


# ---------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_precompile_leaves_nothing_to_compile():
    """After `precompile` of a layer's forward+backward, the real run (autotuning, then the
    launches) compiles nothing more: every trial found its config compiled under the key
    the warm-up filled. The result is still right: the warm-up ran no autotuned kernel and
    left nothing behind."""
    from sigma_moe.kernels import triton_launch, triton_precompile

    # a shape of its own (odd tokens, G = 48), so that the kernels are new to this process
    case = random_case(T=523, D=208, E=8, G=48, K=3, dtype=torch.bfloat16, device="cuda")
    said = triton_precompile.precompile(lambda: run_case(case, "triton"))
    assert said.line.startswith("precompile: the autotune configs") and not said.failed, said
    tuners = [triton_launch._gather_mm, triton_launch._scatter_mm, triton_launch._wgrad]
    device = torch.cuda.current_device()

    def compiled():
        return [len(t.fn.device_caches[device][0]) for t in tuners]

    before = compiled()
    got = run_case(case, "triton")
    assert compiled() == before
    assert_close(compare(got, reference_case(case)), torch.bfloat16)
