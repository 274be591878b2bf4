"""Fast plain-PyTorch sigma-MoE expert path (paper Eq. `moe_out`), for CPUs and as fallback.

    y_t = sum_k gate[t,k] * W2[e_tk]^T dropout(relu(W1[e_tk]^T x_t))

One routing sort (sigma_moe/kernels/routing.py), then a loop over experts on contiguous sorted row
blocks, with a hand-written backward that reuses the sort. Why it beats the per-expert
reference and `torch._grouped_mm` on a CPU:
- one worker thread per core (at most 4; the caller is one of them), each owning a token
  chunk at a time (routing with n_chunks=C) and running single-threaded ops: no OpenMP
  fork-join per small op (on a loaded machine each join waits for a descheduled thread:
  3x slower), and no two workers write the same output row; partial weight gradients per
  chunk are summed in chunk order;
- every temporary is one expert block (n x D, a few MB) of a per-call workspace: glibc
  hands such blocks back from its heap, while each fresh 64 MB tensor (R x D) is mmap'ed
  and page-faulted anew, which costs as much as a matrix product here;
- the K outputs of a token are summed by `index_add_` of each expert's rows into y (the
  rows of one expert are distinct tokens; experts run in a fixed order: deterministic),
  so the T*K*D expanded output never exists;
- only h (R x G, post-ReLU and post-dropout) is saved: x rows are gathered again in the
  backward, which is cheaper than keeping the R x D gathered copy alive.

Dropout is folded in: with h_d = relu(z) * m / (1-p) saved, (h_d > 0) is the joint mask of
ReLU and dropout, so the backward needs no separate mask.

Registered as custom ops (`sigma_moe::torch_fwd` / `torch_bwd`) so `torch.compile` keeps
the Python loop (and its `.tolist()`) out of the graph.
"""
# no `from __future__ import annotations`: torch < 2.5 infers the custom ops' schemas from
# the annotation objects and rejects strings

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

_POOL: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _POOL
    _POOL = None


# A forked child inherits the pool but not its threads: waiting on it would hang forever
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


_OPENMP = "OpenMP" in torch.__config__.parallel_info()  # fixed when torch was built


MAX_WORKERS = 4  # each adds a chunk of partial weight gradients


def _workers() -> int:
    """Worker threads: one per core, with OpenMP only (where thread counts are per-thread
    state), at most MAX_WORKERS."""
    threads = torch.get_num_threads()
    if threads < 2 or not _OPENMP:
        return 1
    return min(threads, MAX_WORKERS)


@torch.compiler.assume_constant_result  # torch.compile: a constant, not a graph break
def _per_worker() -> int:
    return _workers()


def cpu_chunks(dropout: bool) -> int:
    """Token chunks for `make_routing` on a CPU (routing.py): one per worker (2x or
    4x more, smaller chunks measured no faster here: only smaller products). With dropout
    MAX_WORKERS whatever the thread count: each chunk draws its masks from a generator of
    its own, so masks that followed the chunks followed the threads (a run's numbers
    changed with OMP_NUM_THREADS as much as with its seed); 2% slower on 2 threads."""
    return MAX_WORKERS if dropout else _per_worker()


def _blocks(off_S: Tensor, E: int, K: int) -> tuple[int, list[int], int]:
    """-> (C, bounds, n_max): rows of (expert e, chunk c) are bounds[e*C+c] : bounds[e*C+c+1]."""
    C = (off_S.numel() - 1) // (E * K)
    bounds = off_S[::K].tolist()
    return C, bounds, max(b - a for a, b in zip(bounds, bounds[1:]))


def _run(work, C: int) -> None:
    """work(c) for every token chunk c, on `_workers()` threads that run single-threaded ops.

    Dozens of small ops per expert each fork-join an OpenMP team; on a busy machine every
    join waits for a descheduled thread. Independent single-threaded streams have no joins,
    and each chunk touches only its own rows of x and y (cache-friendly, no write
    conflicts: which thread takes which chunk does not change the result). The calling
    thread is one of the workers: it is running already, while waking an idle thread can
    take milliseconds on a VM. Threads take the next chunk when done (dynamic, so a slower
    core gets fewer chunks). Thread counts are per-thread state (OpenMP ICV, MKL local):
    only the workers' own ops change.
    """
    workers = min(C, _workers())
    if workers == 1:
        with torch.no_grad():
            for c in range(C):
                work(c)
        return
    global _POOL
    if _POOL is None or _POOL._max_workers != workers - 1:
        _POOL = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="sigma_moe")
    caller_threads = torch.get_num_threads()
    threads = max(1, caller_threads // workers)
    inference = torch.is_inference_mode_enabled()  # per thread, as grad mode
    next_chunk = itertools.count().__next__  # atomic under the GIL

    def loop():
        # A new thread sets up its OpenMP threads at its first parallel op, from the count
        # of the process, which the caller may have restored by then: set up first.
        torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            # grad and inference mode are per thread: the workers' ops untracked, and
            # allowed to write the caller's inference tensors
            with torch.inference_mode(inference), torch.no_grad():
                while (c := next_chunk()) < C:
                    work(c)
        finally:  # also resets the process-wide default that new threads start from
            torch.set_num_threads(caller_threads)

    helpers = [_POOL.submit(loop) for _ in range(workers - 1)]
    try:
        loop()
    finally:
        for f in helpers:
            f.result()


def _chunk_rows(T: int, C: int, c: int) -> slice:
    """Tokens of chunk c, as make_routing assigns them (chunk(t) = t*C // T)."""
    return slice(-(-c * T // C), -(-(c + 1) * T // C))


def _relu_grad(grad: Tensor, h: Tensor, out: Tensor) -> Tensor:
    # grad * [h > 0] in one vectorised op (masked_fill_ with a bool mask is ~30x slower)
    return torch.ops.aten.threshold_backward.grad_input(grad, h, 0, grad_input=out)


def _prologue(x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S):
    """Shared by forward and backward: block layout, gates in sorted order, token rows
    (global, and within their chunk) and detached operands (the custom ops compute their
    own gradients)."""
    C, bounds, n_max = _blocks(off_S, w1_EDG.shape[0], gate_TK.shape[1])
    gate_R = gate_TK.detach().reshape(-1)[order_R]
    T, tok_R = x_TD.shape[0], tok_R.long()
    # row of each token within its chunk's slice (_chunk_rows): t - ceil(chunk(t) * T / C)
    local_R = tok_R + torch.div(-(tok_R * C // max(T, 1)) * T, C, rounding_mode="floor")
    return (C, bounds, n_max, tok_R, local_R, gate_R, x_TD.detach(), w1_EDG.detach(),
            w2_EGD.detach())


@torch.library.custom_op("sigma_moe::torch_fwd", mutates_args=())
def torch_fwd(
    x_TD: Tensor, gate_TK: Tensor, w1_EDG: Tensor, w2_EGD: Tensor,
    tok_R: Tensor, order_R: Tensor, off_S: Tensor, p: float, training: bool,
) -> tuple[Tensor, Tensor]:
    """-> (y_TD, h_RG): h is relu (and dropout) of the up-projection, rows in sorted order."""
    T, D = x_TD.shape
    E, _, G = w1_EDG.shape
    K = gate_TK.shape[1]
    C, bounds, n_max, tok_R, local_R, gate_R, x_TD, w1_EDG, w2_EGD = _prologue(
        x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S)
    h_RG = x_TD.new_empty(T * K, G)
    y_TD = x_TD.new_empty(T, D)  # each chunk is zeroed by its worker (first touch, in parallel)
    drop = training and p > 0
    # one generator per chunk, seeded from the global one: masks do not depend on timing
    seeds = torch.randint(2**62, (C,)).tolist() if drop else []

    def work(c):
        # a worker adds into a view of its own chunk's rows only: index_add_ into a tensor
        # other threads add into too gave wrong fp16 sums with torch 2.4 (measured)
        y_cD = y_TD[_chunk_rows(T, C, c)].zero_()
        gen = torch.Generator(x_TD.device).manual_seed(seeds[c]) if drop else None
        # one workspace sliced per expert: fresh per-expert tensors get page-faulted anew
        x_nD, o_nD = x_TD.new_empty(n_max, D), x_TD.new_empty(n_max, D)
        hg_nG = h_RG.new_empty(n_max, G)
        for e in range(E):
            a, b = bounds[e * C + c], bounds[e * C + c + 1]
            if a == b:
                continue
            n, tok, loc = b - a, tok_R[a:b], local_R[a:b]
            x = torch.index_select(x_TD, 0, tok, out=x_nD[:n])
            h = torch.mm(x, w1_EDG[e], out=h_RG[a:b]).relu_()
            if drop:  # inverted dropout, as F.dropout, with this chunk's generator
                h.mul_(torch.empty_like(h).bernoulli_(1 - p, generator=gen)).div_(1 - p)
            hg = torch.mul(h, gate_R[a:b, None], out=hg_nG[:n])
            # the tokens of one expert are distinct, experts come in a fixed order, and
            # chunk c's rows only reach chunk c's tokens: a deterministic sum
            y_cD.index_add_(0, loc, torch.mm(hg, w2_EGD[e], out=o_nD[:n]))

    _run(work, C)
    return y_TD, h_RG


@torch_fwd.register_fake
def _(x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, p, training):
    T, K = gate_TK.shape
    return x_TD.new_empty(x_TD.shape), x_TD.new_empty(T * K, w1_EDG.shape[2])


@torch.library.custom_op("sigma_moe::torch_bwd", mutates_args=())
def torch_bwd(
    gy_TD: Tensor, x_TD: Tensor, gate_TK: Tensor, w1_EDG: Tensor, w2_EGD: Tensor,
    tok_R: Tensor, order_R: Tensor, off_S: Tensor, h_RG: Tensor, drop_scale: float,
    need_x: bool, need_w1: bool, need_w2: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> grads of (x, gate, w1, w2). drop_scale = 1/(1-p) when dropout was applied.

    A gradient not needed (need_* False: frozen weights, or an input that needs none) is
    an empty tensor, and its products are skipped: with frozen weights (input gradients of
    a trained model) 4 of the 6 products an expert remain, and no gather of x."""
    T, D = x_TD.shape
    E, _, G = w1_EDG.shape
    K = gate_TK.shape[1]
    C, bounds, n_max, tok_R, local_R, gate_R, x_TD, w1_EDG, w2_EGD = _prologue(
        x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S)
    # (outputs may not alias each other: one empty tensor each)
    gx_TD = torch.empty_like(x_TD) if need_x else x_TD.new_empty(0)
    # one per chunk, summed after in chunk order into chunk 0's (deterministic, and no
    # fresh output to page-fault); blocks with no rows get 0
    gw1_C = [torch.empty_like(w1_EDG) if need_w1 else w1_EDG.new_empty(0) for _ in range(C)]
    gw2_C = [torch.empty_like(w2_EGD) if need_w2 else w2_EGD.new_empty(0) for _ in range(C)]
    gg_R = gate_R.new_empty(T * K)

    def work(c):
        gx_cD = gx_TD[_chunk_rows(T, C, c)].zero_() if need_x else None  # own rows only
        x_nD, gy_nD, gx_nD = (x_TD.new_empty(n_max, D) for _ in range(3))
        hg_nG, ghg_nG, gpre_nG = (h_RG.new_empty(n_max, G) for _ in range(3))
        for e in range(E):
            a, b = bounds[e * C + c], bounds[e * C + c + 1]
            if a == b:
                for need, gw in ((need_w1, gw1_C), (need_w2, gw2_C)):
                    if need:
                        gw[c][e].zero_()
                continue
            n, tok, loc = b - a, tok_R[a:b], local_R[a:b]
            gy = torch.index_select(gy_TD, 0, tok, out=gy_nD[:n])
            h, g = h_RG[a:b], gate_R[a:b, None]
            if need_w2:
                torch.mm(torch.mul(h, g, out=hg_nG[:n]).T, gy, out=gw2_C[c][e])
            ghg = torch.mm(gy, w2_EGD[e].T, out=ghg_nG[:n])  # d loss / d (gate * h)
            torch.linalg.vecdot(ghg, h, out=gg_R[a:b])
            if not (need_w1 or need_x):
                continue
            gpre = _relu_grad(ghg.mul_(g * drop_scale if drop_scale != 1.0 else g), h,
                              gpre_nG[:n])
            if need_w1:
                x = torch.index_select(x_TD, 0, tok, out=x_nD[:n])
                torch.mm(x.T, gpre, out=gw1_C[c][e])
            if need_x:
                gx_cD.index_add_(0, loc, torch.mm(gpre, w1_EDG[e].T, out=gx_nD[:n]))

    _run(work, C)
    gg_TK = torch.empty_like(gg_R).index_copy_(0, order_R, gg_R).view(T, K)
    for c in range(1, C):
        for need, gw in ((need_w1, gw1_C), (need_w2, gw2_C)):
            if need:
                gw[0].add_(gw[c])
    return gx_TD, gg_TK, gw1_C[0], gw2_C[0]


@torch_bwd.register_fake
def _(gy_TD, x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, h_RG, drop_scale,
      need_x, need_w1, need_w2):
    return tuple(torch.empty_like(t) if need else t.new_empty(0) for t, need in
                 ((x_TD, need_x), (gate_TK, True), (w1_EDG, need_w1), (w2_EGD, need_w2)))


def _setup_context(ctx, inputs, output):
    x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, p, training = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # h gets no gradient: don't build a zero R x G for it
    ctx.save_for_backward(x_TD, gate_TK, w1_EDG, w2_EGD, tok_R, order_R, off_S, output[1])
    ctx.drop_scale = 1.0 / (1.0 - p) if training and p > 0 else 1.0


def _backward(ctx, gy_TD, _gh):
    if gy_TD is None:
        return None, None, None, None, None, None, None, None, None
    need_x, _, need_w1, need_w2 = ctx.needs_input_grad[:4]
    grads = torch_bwd(gy_TD.contiguous(), *ctx.saved_tensors, ctx.drop_scale, need_x,
                      need_w1, need_w2)
    return *(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), *[None] * 5


torch_fwd.register_autograd(_backward, setup_context=_setup_context)


def moe_mlp_torch(x_TD, gate_TK, w1_EDG, w2_EGD, routing, p=0.0, training=False) -> Tensor:
    """The fast torch path on a precomputed `Routing`; all tensors in one dtype."""
    y_TD, _ = torch_fwd(x_TD.contiguous(), gate_TK.contiguous(), w1_EDG.contiguous(),
                        w2_EGD.contiguous(), routing.tok_R, routing.order_R, routing.off_S,
                        float(p), bool(training))
    return y_TD
