"""MoE expert kernels (CVMM, paper App. "A Few Words on the CUDA Kernel", Eq. `moe_out`).

Importable with torch alone (Triton optional, no GPU needed): no Hydra here.

    y_t = sum_k gate[t,k] * W2[e_tk]^T dropout(relu(W1[e_tk]^T x_t))

`moe_mlp` is the one entry point the FFN variants call (and for their selection
`selector_logits`, the selector's product sharing x with the experts, sigma_moe/kernels/selector.py,
and `topk`: torch.topk, or on CUDA one Triton kernel, sigma_moe/kernels/triton_topk.py). The
attention's relative shift runs on sigma_moe/kernels/triton_relshift.py on CUDA (`relshift_*`), its
key and value projections through sigma_moe/kernels/key_value.py (`key_value`).
Backends:
    auto            triton on CUDA (triton_unfused when hidden dropout is active), else
                    grouped_mm on CUDA when applicable, else torch
    triton          fused Triton kernels (sigma_moe/kernels/triton_ops.py); no hidden dropout
    triton_unfused  standalone Triton CVMM ops, ReLU/dropout/gate in PyTorch
    grouped_mm      torch._grouped_mm (sigma_moe/kernels/grouped_mm.py)
    torch           fast plain-PyTorch path, the CPU default (sigma_moe/kernels/torch_path.py)
    reference       the per-expert loop everything is tested against (reference.py)
Every backend computes only the gradients autograd asks for: frozen expert weights (input
gradients of a trained model) cost no weight-gradient products (torch path, CPU target case:
0.74-0.79x the time with all gradients).
An unknown backend, one that cannot run on the given inputs, or inputs of the wrong shape
are a ValueError; an expert id outside [0, E) fails an asynchronous assert (RuntimeError).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.autograd.forward_ad as fwAD

from sigma_moe.kernels.grouped_mm import grouped_mm_problem, moe_mlp_grouped_mm
from sigma_moe.kernels.key_value import key_value
from sigma_moe.kernels.reference import moe_mlp_reference
from sigma_moe.kernels.routing import Routing, make_routing
from sigma_moe.kernels.selector import compute_dtype, selector_logits
from sigma_moe.kernels.torch_path import cpu_chunks, moe_mlp_torch

if TYPE_CHECKING:  # (Triton is optional)
    from sigma_moe.kernels.triton_precompile import Precompiled

try:  # Triton is optional: without it (or without a GPU) everything but "triton*" works
    from sigma_moe.kernels import triton_ops
    from sigma_moe.kernels.triton_cvmm import INTERPRET as TRITON_INTERPRET
    from sigma_moe.kernels.triton_relshift import relshift_bias, relshift_bias_grad
    from sigma_moe.kernels.triton_topk import topk_ids
    from sigma_moe.kernels.triton_tuning import interpreter_problem

    HAS_TRITON, TRITON_ERROR = True, ""
except ImportError as err:  # pragma: no cover - depends on the install
    triton_ops, TRITON_INTERPRET, interpreter_problem, topk_ids = None, False, None, None
    relshift_bias = relshift_bias_grad = None
    HAS_TRITON, TRITON_ERROR = False, str(err)

BACKENDS = ("auto", "triton", "triton_unfused", "grouped_mm", "torch", "reference")
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# ROCm's torch calls its GPUs "cuda" too. The kernels' products ask for input_precision
# "tf32" (which AMD's Triton allows on gfx942 only: a compile error elsewhere), their tiles
# are pruned to an H100's shared memory (AMD's LDS is 64 KB) and none ran on an AMD GPU.
ROCM_PROBLEM = ("ROCm: the Triton kernels are built and tuned for NVIDIA GPUs and untested "
                "on AMD (use backend grouped_mm or torch)")


def backend_problem(backend: str, x_TD: torch.Tensor, w1_EDG: torch.Tensor,
                    dropout: bool = False) -> str | None:
    """Why `backend` cannot run on these inputs (None: it can). `dropout`: active in training."""
    if backend in ("triton", "triton_unfused"):
        if not HAS_TRITON:
            return f"Triton is not importable ({TRITON_ERROR})"
        if not (x_TD.is_cuda or TRITON_INTERPRET):
            return ("it needs CUDA tensors, or TRITON_INTERPRET=1 set before `kernels` is "
                    "imported (CPU tests)")
        if x_TD.is_cuda and torch.version.hip:
            return ROCM_PROBLEM
        if x_TD.dtype not in _TRITON_DTYPES:
            return f"dtype {x_TD.dtype} (needs float32, float16 or bfloat16)"
        if backend == "triton" and dropout:
            return "the fused kernels cannot apply hidden_dropout: use 'triton_unfused'"
        return interpreter_problem() if not x_TD.is_cuda else None
    if backend == "grouped_mm":
        return grouped_mm_problem(x_TD, w1_EDG)
    if backend in ("torch", "reference"):
        return None
    raise ValueError(f"unknown moe_mlp backend {backend!r}: choose one of {BACKENDS}")


def resolve_backend(backend: str, x_TD: torch.Tensor, w1_EDG: torch.Tensor,
                    dropout: bool = False) -> str:
    """The concrete backend `moe_mlp` runs for `backend` on these inputs."""
    if backend == "auto":
        if x_TD.is_cuda:
            triton = "triton_unfused" if dropout else "triton"
            for name in (triton, "grouped_mm"):
                if backend_problem(name, x_TD, w1_EDG, dropout) is None:
                    return name
        return "torch"
    problem = backend_problem(backend, x_TD, w1_EDG, dropout)
    if problem is not None:
        raise ValueError(f"moe_mlp backend {backend!r} cannot run on these inputs: {problem}")
    return backend


def _topk_problem(s_TE: torch.Tensor) -> str | None:
    if s_TE.dim() != 2:
        return "s_TE must be [T, E]"
    return backend_problem("triton", s_TE, s_TE)  # (its w1 matters to grouped_mm only)


def topk(s_TE: torch.Tensor, k: int, backend: str = "auto"):
    """(values_TK, ids_TK) = torch.topk(s_TE, k, dim=-1): the K largest per row, largest
    first. backend "auto": the Triton kernel on CUDA where it can run, else torch.topk;
    "triton" (also under TRITON_INTERPRET=1) or "torch". The values are gathered from s,
    so gradients flow."""
    if not 1 <= k <= s_TE.shape[-1]:
        raise ValueError(f"top-k: k={k} must be in [1, {s_TE.shape[-1]}] (the number of experts)")
    if backend == "auto":
        backend = "triton" if s_TE.is_cuda and _topk_problem(s_TE) is None else "torch"
    if backend == "torch":
        return s_TE.topk(k, dim=-1)
    if backend != "triton":
        raise ValueError(f"top-k backend {backend!r}: choose auto, triton or torch")
    if (problem := _topk_problem(s_TE)) is not None:
        raise ValueError(f"top-k backend 'triton' cannot run on these inputs: {problem}")
    ids_TK = topk_ids(s_TE, k)
    return s_TE.gather(-1, ids_TK), ids_TK


def relshift_available(bd_HBTP: torch.Tensor) -> bool:
    """Whether sigma_moe/models/attention.py's relative shift runs on the Triton kernels of
    sigma_moe/kernels/triton_relshift.py (NVIDIA CUDA with Triton; torch.where on the strided view
    else)."""
    return HAS_TRITON and bd_HBTP.is_cuda and not torch.version.hip


def selection_backend(moe_backend: str) -> str:
    """The `topk` backend that goes with a `moe_mlp` backend: the plain ones (torch,
    reference) select with torch.topk too, the others with the Triton kernel on CUDA."""
    return "torch" if moe_backend in ("torch", "reference") else "auto"


def check_inputs(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout) -> None:
    """ValueError for inputs no backend computes correctly (some would return garbage)."""
    E, D, G = w1_EDG.shape if w1_EDG.dim() == 3 else (None,) * 3
    problem = None
    if x_TD.dim() != 2 or not x_TD.is_floating_point():
        problem = "x_TD must be a floating-point [T, D]"
    elif D != x_TD.shape[1]:
        problem = "w1_EDG must be [E, D, G] with x_TD's D"
    elif tuple(w2_EGD.shape) != (E, G, D):
        problem = "w2_EGD must be [E, G, D], the shape of w1_EDG transposed"
    elif expert_TK.dim() != 2 or expert_TK.shape[1] < 1 or expert_TK.is_floating_point():
        problem = "expert_TK must be an integer [T, K] with K >= 1"
    elif expert_TK.shape[0] != x_TD.shape[0]:
        problem = "expert_TK must have x_TD's T"
    elif gate_TK.shape != expert_TK.shape:
        problem = "gate_TK must have expert_TK's shape"
    elif not 0 <= hidden_dropout < 1:
        problem = f"hidden_dropout={hidden_dropout} must be in [0, 1)"
    if problem:
        shapes = ", ".join(f"{n}{list(t.shape)}" for n, t in zip(
            ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD"),
            (x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD)))
        raise ValueError(f"moe_mlp: {problem} (got {shapes})")
    # an id outside [0, E) would be dropped by some backends and read out of bounds by
    # others; asynchronous on a GPU (no sync), traceable by torch.compile
    torch._assert_async(((expert_TK >= 0) & (expert_TK < E)).all(),
                        f"moe_mlp: expert ids must be in [0, {E}) (the E of w1_EDG)")


def _no_forward_ad(backend: str, *tensors: torch.Tensor) -> None:
    """The custom ops have backward formulas only; under forward-mode AD (torch.func.jvp,
    torch.autograd.forward_ad) torch would give their outputs a zero tangent, silently."""
    if fwAD._current_level >= 0 and any(fwAD.unpack_dual(t).tangent is not None
                                        for t in tensors):
        raise NotImplementedError(f"moe_mlp: backend={backend!r} has no forward-mode AD "
                                  f"(jvp); backend='reference' has")


def moe_mlp(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout=0.0, training=False,
            backend="auto", n_chunks=None):
    """y_t = sum_k gate[t,k] * W2[e_tk]^T dropout(relu(W1[e_tk]^T x_t)).

    x_TD [T, D], expert_TK int [T, K], gate_TK [T, K], w1_EDG [E, D, G], w2_EGD [E, G, D].
    n_chunks: token chunks C of the routing (sigma_moe/kernels/routing.py); None: the backend's own,
    for the torch path on a CPU one per worker thread (4 with dropout in training, whatever
    the threads: each chunk draws its own masks), else 1. The Triton backends run
    their scatters chunk by chunk (a chunk's K slot launches touch only its T/C output
    rows); the reference ignores it.
    Autograd: first-order reverse mode. Double backward, forward mode (jvp) and
    torch.func.grad need backend="reference" (or triton_unfused / grouped_mm for double
    backward): the custom ops define a backward only.
    """
    check_inputs(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout)
    if n_chunks is not None and not (isinstance(n_chunks, int) and n_chunks >= 1):
        raise ValueError(f"moe_mlp: n_chunks={n_chunks!r} must be a whole number >= 1 "
                         "(or None: the backend's choice)")
    if backend == "reference":  # runs on anything, in the inputs' own dtypes
        return moe_mlp_reference(x_TD, expert_TK, gate_TK, w1_EDG, w2_EGD, hidden_dropout,
                                 training)
    _no_forward_ad(backend, x_TD, gate_TK, w1_EDG, w2_EGD)
    dropout = bool(training) and hidden_dropout > 0
    dtype = compute_dtype(x_TD)  # the dtype the backend computes in decides which can
    x_TD, gate_TK, w1_EDG, w2_EGD = (t.to(dtype) for t in (x_TD, gate_TK, w1_EDG, w2_EGD))
    name = resolve_backend(backend, x_TD, w1_EDG, dropout)
    if n_chunks is None:
        # the torch path gives each CPU worker thread a token chunk of its own
        # (sigma_moe/kernels/routing.py); on an accelerator (CUDA, MPS) it runs one stream of ops
        n_chunks = cpu_chunks(dropout) if name == "torch" and x_TD.device.type == "cpu" else 1
    # the torch path walks (expert, chunk) blocks, the others (expert, slot) segments
    routing = make_routing(expert_TK, w1_EDG.shape[0], n_chunks,
                           chunks_in_slots=name != "torch")
    p = hidden_dropout if dropout else 0.0
    if name == "triton":
        return triton_ops.moe_mlp_triton(x_TD, gate_TK, w1_EDG, w2_EGD, routing)
    if name == "triton_unfused":
        return triton_ops.moe_mlp_triton_unfused(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p,
                                                 dropout)
    if name == "grouped_mm":
        return moe_mlp_grouped_mm(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p, dropout)
    return moe_mlp_torch(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p, dropout)


def precompile_moe(tokens: int, d_model: int, n_experts: int, expert_size: int, k: int,
                   hidden_dropout: float = 0.0, backend: str = "auto", device="cuda",
                   dtype: torch.dtype = torch.bfloat16, n_chunks: int | None = None
                   ) -> Precompiled | None:
    """Compile ahead, in parallel, the Triton kernels that a training `moe_mlp` forward +
    backward of these shapes launches (sigma_moe/kernels/triton_precompile.py), by one dry run on
    random inputs: nothing of a model is touched. -> what it did (its line, and whether it
    failed); None where no Triton kernel would run (no CUDA, no Triton, a backend without
    Triton kernels)."""
    device = torch.device(device)
    if not HAS_TRITON or device.type != "cuda" or backend not in ("auto", "triton",
                                                                   "triton_unfused"):
        return None
    from sigma_moe.kernels.triton_precompile import precompile

    return precompile(lambda: _moe_step(tokens, d_model, n_experts, expert_size, k,
                                        hidden_dropout, backend, device, dtype, n_chunks))


def _moe_step(tokens, d_model, n_experts, expert_size, k, hidden_dropout, backend, device,
              dtype, n_chunks=None) -> None:
    """One training `moe_mlp` forward+backward on random inputs of these shapes. The random
    number generators (the CPU's and the device's) are as they were after it: a run that
    compiles ahead draws the same dropout masks as one that does not, and a resumed run
    the same as an uninterrupted one. `device`: a torch.device."""
    on = [device.index if device.index is not None else torch.cuda.current_device()] if (
        device.type == "cuda") else []
    with torch.random.fork_rng(devices=on):
        leaf = dict(device=device, dtype=dtype, requires_grad=True)
        x, gate = torch.randn(tokens, d_model, **leaf), torch.rand(tokens, k, **leaf)
        w1 = torch.randn(n_experts, d_model, expert_size, **leaf)
        w2 = torch.randn(n_experts, expert_size, d_model, **leaf)
        expert = torch.rand(tokens, n_experts, device=device).argsort(-1)[:, :k]
        y = moe_mlp(x, expert, gate, w1, w2, hidden_dropout, training=True, backend=backend,
                    n_chunks=n_chunks)
        torch.autograd.grad(y, (x, gate, w1, w2), torch.randn_like(y))


__all__ = [
    "BACKENDS", "HAS_TRITON", "TRITON_ERROR", "Routing", "backend_problem", "check_inputs",
    "key_value", "make_routing", "moe_mlp", "moe_mlp_reference", "precompile_moe",
    "relshift_available", "relshift_bias", "relshift_bias_grad", "resolve_backend",
    "selection_backend", "selector_logits", "topk",
]
