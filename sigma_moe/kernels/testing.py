"""Random sigma-MoE cases and a float64 oracle (paper Eq. `moe_out`), for tests and benchmarks.

Shared by tests/test_kernels*.py and `scripts/bench_moe.py --check`, so both judge every
backend the same way: forward output and the gradients w.r.t. x, gate, W1 and W2 against
the per-expert loop of sigma_moe/kernels/reference.py run in float64.
"""
from __future__ import annotations

import torch

from sigma_moe.kernels.grouped_mm import grouped_mm_problem

# why this torch has no `torch._grouped_mm` path (torch < 2.8), None when it has one
NO_GROUPED_MM = grouped_mm_problem(torch.zeros(1, 8), torch.zeros(1, 8, 8))
GRAD_NAMES = ("x", "gate", "w1", "w2")
# inputs that need no gradient (run_case's `frozen`): a frozen weight, x (the first layer's
# input), or x's gradient alone of a trained model
FROZEN = [("x",), ("w1",), ("w2",), ("w1", "w2"), ("x", "w1", "w2")]
# max |error| / max |reference| that each input dtype must meet (fp32 accumulation)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def random_case(T, D, E, G, K, dtype=torch.float32, device="cpu", seed=0, n_unused=1):
    """Inputs with distinct experts per token; the last `n_unused` experts get no token."""
    assert K <= E - n_unused, "need K distinct experts among the used ones"
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale)  # noqa: E731
    expert_TK = torch.rand(T, E - n_unused, generator=gen).argsort(-1)[:, :K]
    case = {
        "x_TD": rand(T, D),
        "gate_TK": torch.sigmoid(rand(T, K)),
        "w1_EDG": rand(E, D, G, scale=D ** -0.5),
        "w2_EGD": rand(E, G, D, scale=(G * K) ** -0.5),
        "gy_TD": rand(T, D),
    }
    case = {k: v.to(device=device, dtype=dtype) for k, v in case.items()}
    case["expert_TK"] = expert_TK.to(device)
    return case


def uneven_experts(T, E, K, generator, device="cpu") -> torch.Tensor:
    """[T, K] distinct experts, expert e drawn with weight (e + 1)^-0.7: routing as uneven
    as a model's at init (K = 4 of E = 32: the busiest expert gets ~4x the mean rows; the
    WT-B layers' busiest get 3.5-5.5x)."""
    weight = (torch.arange(E, device=device) + 1.0) ** -0.7
    return torch.multinomial(weight.expand(T, E), K, generator=generator)


def run_case(case, backend, hidden_dropout=0.0, training=False, dtype=None, n_chunks=None,
             frozen=()):
    """-> (y, (dx, dgate, dw1, dw2)) of `moe_mlp` on `case` (cast to `dtype` if given);
    the inputs named in `frozen` (of GRAD_NAMES) need no gradient, and get None."""
    from sigma_moe.kernels import (
        moe_mlp,  # late: sigma_moe/kernels/__init__ imports this module's siblings
    )

    leaves = [case[k] for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD")]
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_(name not in frozen)
              for name, t in zip(GRAD_NAMES, leaves)]
    x, gate, w1, w2 = leaves
    y = moe_mlp(x, case["expert_TK"], gate, w1, w2, hidden_dropout, training, backend=backend,
                n_chunks=n_chunks)
    grads = iter(torch.autograd.grad(y, [t for t in leaves if t.requires_grad],
                                     case["gy_TD"].to(y.dtype)))
    return y.detach(), tuple(next(grads) if t.requires_grad else None for t in leaves)


def reference_case(case):
    """The float64 per-expert loop on the same inputs."""
    return run_case(case, "reference", dtype=torch.float64)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().clamp_min(1e-12)
    return ((got.double() - want.double()).abs().max() / scale).item()


def over_tolerance(errs: dict[str, float], dtype: torch.dtype) -> dict[str, float]:
    """The relative errors of `compare` that exceed the tolerance of `dtype` (NaN included)."""
    return {k: v for k, v in errs.items() if not v <= TOLERANCE[dtype]}


def assert_close(errs: dict[str, float], dtype: torch.dtype) -> None:
    bad = over_tolerance(errs, dtype)
    assert not bad, f"relative errors over {TOLERANCE[dtype]}: {bad}"


def compare(got, want) -> dict[str, float]:
    """Relative errors of y and of every gradient: {'y': .., 'x': .., 'gate': .., ...}."""
    (y, grads), (y_ref, grads_ref) = got, want
    errs = {"y": rel_err(y, y_ref)}
    errs.update({n: rel_err(g, r) for n, g, r in zip(GRAD_NAMES, grads, grads_ref)})
    return errs


def dropout_bias(backend: str, device="cpu", p=0.25, copies=512) -> tuple[bool, float]:
    """Inverted dropout leaves E[y] unchanged: `copies` copies of 16 tokens, each drawing its
    own mask, in one call. -> (whether one copy's output differs from the undropped one,
    max |mean over copies - undropped| / max |undropped|: about 0.04 for 512 copies)."""
    from sigma_moe.kernels import moe_mlp

    case = random_case(T=16, D=8, E=4, G=32, K=2, device=device)
    x, expert, gate = (case[k].repeat(copies, 1) for k in ("x_TD", "expert_TK", "gate_TK"))
    w1, w2 = case["w1_EDG"], case["w2_EGD"]
    with torch.no_grad():
        y0 = moe_mlp(x[:16], expert[:16], gate[:16], w1, w2, backend=backend)
        torch.manual_seed(0)
        y = moe_mlp(x, expert, gate, w1, w2, hidden_dropout=p, training=True,
                    backend=backend).view(copies, 16, -1)
    return not torch.allclose(y[0], y0), rel_err(y.mean(0), y0)
