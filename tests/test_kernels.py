"""sigma_moe/kernels/: routing, the fast torch path, grouped_mm, dispatch and torch.compile (CPU).

Every fast path is checked against the per-expert float64 loop of sigma_moe/kernels/reference.py
(paper Eq. `moe_out`): output and the gradients w.r.t. x, gate, W1 and W2. The Triton
kernels are in tests/test_kernels_triton.py, the torch path's worker threads, dropout and
skipped gradients in tests/test_kernels_torch_path.py.
"""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from sigma_moe import kernels
from sigma_moe.kernels import moe_mlp
from sigma_moe.kernels.routing import make_routing, routing_reference
from sigma_moe.kernels.testing import (
    NO_GROUPED_MM,
    assert_close,
    compare,
    random_case,
    reference_case,
    run_case,
)


@pytest.mark.parametrize("E,K,C", [(16383, 2, 1), (8192, 4, 1), (5462, 3, 2), (4, 2, 8192)])
def test_routing_keys_at_the_int16_boundary(E, K, C):
    """The sort keys are int16 while E*C*K <= 32767 (two radix passes on a GPU, not eight),
    int32 above: the same routing either side, no key wrapping around (E*C*K of the cases:
    32766, 32768, 32772, 65536)."""
    T = 40
    expert_TK = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    expert_TK[0] = torch.arange(E - K, E)  # the largest keys occur
    got = make_routing(expert_TK, E, n_chunks=C)
    want = routing_reference(expert_TK, E, n_chunks=C)
    for name in ("order_R", "tok_R", "off_S"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("K,C", [(1, 1), (3, 1), (3, 2)])
def test_routing_matches_loop(K, C):
    case = random_case(T=23, D=4, E=7, G=4, K=K, n_unused=2)
    got = make_routing(case["expert_TK"], 7, n_chunks=C)
    want = routing_reference(case["expert_TK"], 7, n_chunks=C)
    assert torch.equal(got.order_R, want.order_R)
    assert torch.equal(got.tok_R, want.tok_R)
    assert torch.equal(got.off_S, want.off_S)
    # every slot holds every token exactly once: what the slot-ordered scatter relies on
    for k in range(K):
        toks = torch.cat([got.tok_R[got.off_S[s * K + k]:got.off_S[s * K + k + 1]]
                          for s in range(7 * C)])
        assert torch.equal(toks.sort().values, torch.arange(23, dtype=toks.dtype))
    # chunk c of every expert holds only tokens of chunk c: workers never share a token
    for e in range(7):
        for c in range(C):
            block = got.off_S[(e * C + c) * K:(e * C + c + 1) * K + 1:K]
            assert ((got.tok_R[block[0]:block[1]].long() * C) // 23 == c).all()
    assert torch.equal(got.order_R[got.inverse_R()], torch.arange(23 * K))


@pytest.mark.parametrize("K,C", [(1, 1), (3, 2), (2, 5)])
def test_routing_with_chunks_in_slots(K, C):
    """chunks_in_slots: the rows in the order of C = 1, each (expert, slot) segment cut
    into C sub-segments, sub-segment c holding the tokens of chunk c."""
    case = random_case(T=23, D=4, E=7, G=4, K=K, n_unused=2)
    got = make_routing(case["expert_TK"], 7, n_chunks=C, chunks_in_slots=True)
    want = routing_reference(case["expert_TK"], 7, n_chunks=C, chunks_in_slots=True)
    plain = make_routing(case["expert_TK"], 7)
    for name in ("order_R", "tok_R", "off_S"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.order_R, plain.order_R)
    assert torch.equal(got.off_S[::C], plain.off_S)
    for s in range(7 * K):
        for c in range(C):
            sub = got.tok_R[got.off_S[s * C + c]:got.off_S[s * C + c + 1]].long()
            assert (sub * C // 23 == c).all()


def test_moe_mlp_n_chunks_is_checked():
    case = random_case(T=5, D=4, E=3, G=4, K=2)
    args = [case[k] for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD")]
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="n_chunks=.* must be a whole number >= 1"):
            moe_mlp(*args, n_chunks=bad)


@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_given_chunks_match_reference(backend):
    """An explicit n_chunks, more chunks than tokens included (empty chunks)."""
    if backend == "grouped_mm" and NO_GROUPED_MM:
        pytest.skip(NO_GROUPED_MM)
    case = random_case(T=11, D=16, E=5, G=8, K=3, n_unused=1)
    want = reference_case(case)
    for C in (2, 3, 13):
        assert_close(compare(run_case(case, backend, n_chunks=C), want), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("K", [1, 2, 4, 8])
def test_torch_path_matches_reference(K, dtype):
    case = random_case(T=29, D=24, E=10, G=16, K=K, dtype=dtype, seed=K)
    assert_close(compare(run_case(case, "torch"), reference_case(case)), dtype)


@pytest.mark.skipif(NO_GROUPED_MM is not None, reason=str(NO_GROUPED_MM))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("K", [1, 4])
def test_grouped_mm_matches_reference(K, dtype, monkeypatch):
    # the CUDA kernel reads offs through its raw pointer (strides ignored): require what it
    # needs here, where the CPU fallback would honour a strided view
    real = torch._grouped_mm

    def strict(a, b, offs=None, **kw):
        assert offs is None or offs.is_contiguous(), "offs must be contiguous"
        return real(a, b, offs=offs, **kw)

    monkeypatch.setattr(torch, "_grouped_mm", strict)
    case = random_case(T=31, D=16, E=6, G=24, K=K, dtype=dtype, seed=10 + K)
    assert_close(compare(run_case(case, "grouped_mm"), reference_case(case)), dtype)


def test_unused_experts_get_zero_weight_grad():
    case = random_case(T=9, D=8, E=6, G=8, K=2, n_unused=3)
    _, (_, _, dw1, dw2) = run_case(case, "torch")
    assert dw1[3:].abs().max() == 0 and dw2[3:].abs().max() == 0
    assert dw1[:3].abs().min(-1).values.max() > 0


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_an_empty_batch_keeps_the_graph(backend):
    """T = 0 (an empty shard): an empty output that backpropagates zero weight gradients, from
    the per-expert reference too (which once returned a tensor outside the graph)."""
    case = random_case(T=0, D=8, E=3, G=8, K=2)
    y, (gx, _, dw1, dw2) = run_case(case, backend)
    assert y.shape == (0, 8) and gx.shape == (0, 8)
    assert dw1.abs().sum() == 0 and dw2.abs().sum() == 0


def test_dropout_inactive_in_eval():
    case = random_case(T=11, D=8, E=4, G=8, K=2)
    y, _ = run_case(case, "torch", hidden_dropout=0.5, training=False)
    y_ref, _ = run_case(case, "torch")
    assert torch.equal(y, y_ref)


def test_dispatch():
    x, w1 = torch.zeros(3, 8), torch.zeros(2, 8, 8)
    assert kernels.resolve_backend("auto", x, w1) == "torch"  # CPU
    with pytest.raises(ValueError, match="unknown moe_mlp backend 'cuda_magic'"):
        kernels.resolve_backend("cuda_magic", x, w1)
    grouped_mm_needs = "float64" if hasattr(torch, "_grouped_mm") else "torch >= 2.8"
    with pytest.raises(ValueError, match=f"grouped_mm.*{grouped_mm_needs}"):
        kernels.resolve_backend("grouped_mm", x.double(), w1.double())
    if kernels.HAS_TRITON:
        with pytest.raises(ValueError, match="triton_unfused"):
            kernels.resolve_backend("triton", x, w1, dropout=True)


def test_inputs_no_backend_handles_are_refused():
    """Some backends returned garbage for these (an out-of-range id: uninitialised rows on
    Triton, a wrong sum on grouped_mm), others failed deep inside with unclear messages."""
    case = random_case(T=6, D=8, E=4, G=8, K=2)
    x, e, g, w1, w2 = (case[k] for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD"))
    bad = {"x_TD must be": dict(x=x[None]), "x_TD must be a floating-point": dict(x=x.long()),
           "w1_EDG must be": dict(w1=w1[:, :4]),
           "w2_EGD must be": dict(w2=w2[:3]), "expert_TK must be": dict(e=e[:, :0], g=g[:, :0]),
           "expert_TK must have x_TD's T": dict(e=e[:5], g=g[:5]),
           "gate_TK must have": dict(g=g[:, :1]),
           r"hidden_dropout=1.0 must be in \[0, 1\)": dict(p=1.0)}
    for message, change in bad.items():
        a = {"x": x, "e": e, "g": g, "w1": w1, "w2": w2, "p": 0.0, **change}
        with pytest.raises(ValueError, match=f"^moe_mlp: {message}"):
            moe_mlp(a["x"], a["e"], a["g"], a["w1"], a["w2"], a["p"], backend="torch")
    for wrong in (4, -1):
        ids = e.clone()
        ids[2, 1] = wrong
        with pytest.raises(RuntimeError, match=r"expert ids must be in \[0, 4\)"):
            moe_mlp(x, ids, g, w1, w2, backend="torch")


@pytest.mark.parametrize("how", ["forward_ad", "func.jvp"])
def test_forward_mode_ad_is_refused_not_zero(how):
    """The custom ops have no forward-AD formula; torch would give a zero tangent."""
    import torch.autograd.forward_ad as fwAD

    case = random_case(T=6, D=8, E=4, G=8, K=2)
    x, e, g, w1, w2 = (case[k].detach() for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG",
                                                   "w2_EGD"))
    with pytest.raises(NotImplementedError, match="backend='torch' has no forward-mode AD"):
        if how == "func.jvp":
            torch.func.jvp(lambda x: moe_mlp(x, e, g, w1, w2, backend="torch"), (x,),
                           (torch.ones_like(x),))
        else:
            with fwAD.dual_level():
                moe_mlp(fwAD.make_dual(x, torch.ones_like(x)), e, g, w1, w2, backend="torch")
    with fwAD.dual_level():  # the reference computes it; and a dual level alone is no error
        y = moe_mlp(fwAD.make_dual(x, torch.ones_like(x)), e, g, w1, w2, backend="reference")
        assert fwAD.unpack_dual(y).tangent.abs().sum() > 0
        moe_mlp(x, e, g, w1, w2, backend="torch")


@pytest.mark.skipif(NO_GROUPED_MM is not None, reason=str(NO_GROUPED_MM))
def test_grouped_mm_alignment_and_empty_batch():
    x, w1 = torch.zeros(3, 12), torch.zeros(2, 12, 6)  # fp32 rows need multiples of 4
    with pytest.raises(ValueError, match="d_model=12, G=6: both must be multiples of 4"):
        kernels.resolve_backend("grouped_mm", x, w1)
    with pytest.raises(ValueError, match="multiples of 8 for torch.float16"):
        kernels.resolve_backend("grouped_mm", x.half(), w1[..., :4].half())
    case = random_case(T=0, D=8, E=3, G=8, K=2)
    y, grads = run_case(case, "grouped_mm")
    assert y.shape == (0, 8) and grads[2].abs().sum() == 0


def test_float64_under_autocast_stays_float64():
    case = random_case(T=7, D=8, E=3, G=8, K=2, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = run_case(case, "torch")
    assert y.dtype == torch.float64  # as autocast leaves a float64 matmul alone
    assert_close(compare(run_case(case, "torch"), reference_case(case)), torch.float32)


def test_triton_backend_refused_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "TRITON_INTERPRET", False)
    monkeypatch.setattr(kernels, "HAS_TRITON", True)
    with pytest.raises(ValueError, match="CUDA tensors"):
        kernels.resolve_backend("triton", torch.zeros(3, 8), torch.zeros(2, 8, 8))


def test_triton_kernels_refused_on_rocm(monkeypatch):
    # ROCm's torch calls its GPUs "cuda": its Triton rejects the products' "tf32" precision
    # on every AMD GPU but gfx942 (a compile error, found by compiling for gfx90a)
    monkeypatch.setattr(kernels, "HAS_TRITON", True)
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    gpu_tensor = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    for backend in ("triton", "triton_unfused"):
        assert kernels.backend_problem(backend, gpu_tensor, None) == kernels.ROCM_PROBLEM
    assert not kernels.relshift_available(gpu_tensor)


@pytest.mark.skipif(not kernels.HAS_TRITON, reason="needs Triton")
def test_triton_interpreter_refused_where_it_cannot_run(monkeypatch):
    from sigma_moe.kernels.triton_tuning import interpreter_problem

    assert "numpy<2.4" in interpreter_problem("3.6.0", "2.4.6")
    assert interpreter_problem("3.6.0", "2.3.5") is None
    assert interpreter_problem("3.7.1", "2.4.6") is None
    assert interpreter_problem("3.10.0+git1", "2.5.0rc1") is None
    for triton_version in ("3.0.0", "3.1.0"):  # lose their stores with numpy 2
        assert "writes nothing" in interpreter_problem(triton_version, "2.3.5")
    assert interpreter_problem("3.2.0", "2.3.5") is None
    monkeypatch.setattr(kernels, "TRITON_INTERPRET", True)
    monkeypatch.setattr(kernels, "interpreter_problem", lambda: "numpy too new")
    with pytest.raises(ValueError, match="numpy too new"):
        kernels.resolve_backend("triton", torch.zeros(3, 8), torch.zeros(2, 8, 8))


def test_kernels_import_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\nfrom sigma_moe import kernels\n"
        "assert not kernels.HAS_TRITON\n"
        "x = torch.randn(5, 8); e = torch.tensor([[0], [1], [0], [2], [1]])\n"
        "w1, w2 = torch.randn(3, 8, 4), torch.randn(3, 4, 8)\n"
        "y = kernels.moe_mlp(x, e, torch.ones(5, 1), w1, w2)\n"
        "r = kernels.moe_mlp(x, e, torch.ones(5, 1), w1, w2, backend='reference')\n"
        "assert torch.allclose(y, r, atol=1e-5)\n"
        "try:\n"
        "    kernels.moe_mlp(x, e, torch.ones(5, 1), w1, w2, backend='triton')\n"
        "except ValueError as err:\n"
        "    assert 'not importable' in str(err)\n"
        "else:\n"
        "    raise AssertionError('triton backend accepted without triton')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(kernels.__file__).parents[2]))
    assert out.returncode == 0, out.stderr


def test_autocast_computes_in_autocast_dtype():
    case = random_case(T=13, D=16, E=5, G=16, K=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, grads = run_case(case, "torch")
    assert y.dtype == torch.bfloat16
    assert grads[2].dtype == torch.float32  # the fp32 weights still get fp32 gradients
    # the oracle sees the inputs as autocast rounds them (else ReLU masks flip near zero)
    rounded = {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v
               for k, v in case.items()}
    assert_close(compare((y, grads), reference_case(rounded)), torch.bfloat16)


def test_precompile_moe_dry_run_is_one_training_step(monkeypatch):
    """kernels.precompile_moe: nothing off CUDA or for a backend without Triton kernels; its
    dry run is one training moe_mlp forward+backward at the given shapes on random inputs
    (here run on the CPU's path), which leaves the random number generator as it was."""
    from sigma_moe import kernels

    assert kernels.precompile_moe(40, 24, 6, 16, 2, device="cpu") is None
    assert kernels.precompile_moe(40, 24, 6, 16, 2, backend="torch", device="cuda") is None
    calls, real = [], kernels.moe_mlp

    def moe_mlp(x, expert, gate, w1, w2, p, training, backend, n_chunks):
        calls.append((tuple(x.shape), tuple(expert.shape), tuple(gate.shape),
                      tuple(w1.shape), tuple(w2.shape), p, training, backend, n_chunks))
        y = real(x, expert, gate, w1, w2, p, training, backend=backend, n_chunks=n_chunks)
        assert (expert < 6).all() and all(len(set(r)) == 2 for r in expert.tolist())
        return y

    monkeypatch.setattr(kernels, "moe_mlp", moe_mlp)
    rng = torch.random.get_rng_state()
    kernels._moe_step(40, 24, 6, 16, 2, 0.1, "torch", torch.device("cpu"), torch.float32, 3)
    assert calls == [((40, 24), (40, 2), (40, 2), (6, 24, 16), (6, 16, 24), 0.1, True, "torch",
                      3)]
    # the run's random stream is untouched (dropout masks, resumed runs)
    assert torch.equal(torch.random.get_rng_state(), rng)
