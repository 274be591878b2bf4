"""sigma_moe/kernels/torch_path.py, the CPU path's own machinery: its worker threads (chunks,
thread counts, inference mode, fork), dropout inside the op, the gradients it skips, and
torch.compile tracing through it. Its results against the reference: tests/test_kernels.py."""
import os
import signal
import time

import pytest
import torch

from sigma_moe import kernels
from sigma_moe.kernels import moe_mlp
from sigma_moe.kernels.routing import make_routing
from sigma_moe.kernels.testing import (
    FROZEN,
    GRAD_NAMES,
    assert_close,
    compare,
    dropout_bias,
    random_case,
    reference_case,
    run_case,
)
from sigma_moe.kernels.torch_path import torch_bwd, torch_fwd


@pytest.mark.parametrize("frozen", FROZEN)
def test_torch_path_computes_only_the_gradients_needed(frozen, monkeypatch):
    """The other gradients bit for bit as when all are needed, and the products of the
    ones not needed skipped: an expert's backward is 4 products, dW2, d(gate*h), dW1, dx."""
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 1)  # ops in this thread
    case = random_case(T=37, D=16, E=5, G=8, K=3, n_unused=1)
    _, want = run_case(case, "torch")
    with torch.profiler.profile() as prof:
        _, grads = run_case(case, "torch", frozen=frozen)
    for name, g, g_all in zip(GRAD_NAMES, grads, want):
        assert g is None if name in frozen else torch.equal(g, g_all), name
    products = sum(e.count for e in prof.key_averages() if e.key == "aten::mm")
    assert products == 4 * (2 + 4 - len(frozen))  # 4 experts with rows, 2 forward products


def test_torch_path_weight_grad_is_deterministic():
    case = random_case(T=257, D=32, E=8, G=16, K=4)
    (_, g1), (_, g2) = run_case(case, "torch"), run_case(case, "torch")
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_torch_path_more_chunks_than_threads(monkeypatch):
    """Threads take chunks dynamically (the caller too): which thread ran which chunk must
    not change a bit of the result, and uneven chunks must still match the reference."""
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 2)  # a caller and a helper
    case = random_case(T=61, D=16, E=5, G=8, K=3, n_unused=1, seed=3)
    routing = make_routing(case["expert_TK"], 5, n_chunks=5)
    args = [case[k].detach() for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD")]
    idx = (routing.tok_R, routing.order_R, routing.off_S)
    runs = []
    for _ in range(3):
        y, h = torch_fwd(*args, *idx, 0.0, False)
        runs.append((y, *torch_bwd(case["gy_TD"], *args, *idx, h, 1.0, True, True, True)))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))
    y, *grads = runs[0]
    assert_close(compare((y, grads), reference_case(case)), torch.float32)


@pytest.mark.skipif(torch.get_num_threads() < 2 or not kernels.torch_path._OPENMP,
                    reason="the workers' thread counts matter with OpenMP and 2+ threads")
def test_torch_path_fresh_worker_thread_runs_single_threaded(monkeypatch):
    """A new pool thread sets up its OpenMP threads lazily, at its first parallel op, from
    the process-wide count: once the caller has put that back (its own loop is done), the
    worker's ops would run on every thread, and its sums could differ in the last bits from
    a later call (a resumed run's first step). Forced here: the helper's chunk starts late."""
    import threading
    import time

    monkeypatch.setattr(kernels.torch_path, "_POOL", None)  # a fresh helper thread
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 2)
    share = max(1, torch.get_num_threads() // 2)  # each of the 2 workers' threads
    seen, helper_started = {}, threading.Event()

    def work(c):
        if threading.current_thread() is threading.main_thread():
            helper_started.wait(10)  # the helper takes the other chunk
        else:
            helper_started.set()
            time.sleep(0.3)  # the caller's loop has ended and restored its thread count
            seen["helper"] = torch.get_num_threads()

    try:
        kernels.torch_path._run(work, 2)
    finally:
        kernels.torch_path._POOL.shutdown()
    assert seen == {"helper": share}


def test_torch_path_under_inference_mode(monkeypatch):
    """Inference mode is per thread, as grad mode: the helper workers must enter it too, or
    writing the caller's (inference) output tensors fails."""
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 2)
    case = random_case(T=40, D=16, E=4, G=8, K=2, seed=7)
    args = [case[k].detach() for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD")]
    with torch.no_grad():
        want = moe_mlp(*args, backend="torch")
    with torch.inference_mode():
        got = moe_mlp(*args, backend="torch")
    assert torch.equal(got, want)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_torch_path_in_a_forked_child(monkeypatch):
    """A child forked after the parent used the worker pool inherits the pool but not its
    thread: it must start its own, not wait forever on the parent's."""
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 2)
    case = random_case(T=40, D=16, E=4, G=8, K=2, seed=8)
    args = [case[k].detach() for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD")]
    with torch.no_grad():
        want = moe_mlp(*args, backend="torch")  # the pool has its helper thread now
    pid = os.fork()
    if pid == 0:  # the child: one OpenMP thread (GNU OpenMP may hang after a fork)
        code = 1
        try:
            torch.set_num_threads(1)
            with torch.no_grad():
                code = 0 if torch.equal(moe_mlp(*args, backend="torch"), want) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's moe_mlp hangs")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_torch_path_workers_add_into_their_own_rows_only(monkeypatch):
    """Concurrent index_add_ into one tensor gave wrong fp16 sums with torch 2.4 (measured:
    4 of 60 runs): each worker adds into a view of its own chunk, ceil(T / C) rows at most."""
    monkeypatch.setattr(kernels.torch_path, "_workers", lambda: 2)
    rows, real = [], torch.Tensor.index_add_

    def spy(self, dim, index, source, **kw):
        rows.append(self.shape[0])
        return real(self, dim, index, source, **kw)

    monkeypatch.setattr(torch.Tensor, "index_add_", spy)
    case = random_case(T=61, D=16, E=5, G=8, K=3, dtype=torch.float16, seed=5)
    routing = make_routing(case["expert_TK"], 5, n_chunks=5)
    args = [case[k].detach() for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD")]
    idx = (routing.tok_R, routing.order_R, routing.off_S)
    y, h = torch_fwd(*args, *idx, 0.0, False)
    grads = torch_bwd(case["gy_TD"], *args, *idx, h, 1.0, True, True, True)
    assert rows and max(rows) <= 13, rows
    assert_close(compare((y, grads), reference_case(case)), torch.float16)


@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_torch_path_dropout_gradient_is_exact(chunks):
    """Forward and backward see the same dropout mask (h > 0 is ReLU and dropout jointly)."""
    case = random_case(T=7, D=5, E=4, G=6, K=2, dtype=torch.float64)
    routing = make_routing(case["expert_TK"], 4, chunks)
    ins = [case[k].clone().requires_grad_() for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD")]

    def f(x, gate, w1, w2):
        torch.manual_seed(0)  # the same mask at every gradcheck evaluation
        return torch_fwd(x, gate, w1, w2, routing.tok_R, routing.order_R, routing.off_S,
                         0.5, True)[0]

    assert torch.autograd.gradcheck(f, ins)


def test_torch_path_dropout_is_unbiased():
    dropped, bias = dropout_bias("torch")
    assert dropped and bias < 0.1  # inverted dropout: E[y] = y without dropout


def test_torch_path_dropout_does_not_depend_on_the_thread_count(monkeypatch):
    """Each chunk draws its masks from a generator of its own: with dropout the chunks are
    as many whatever the threads (a run's numbers changed with OMP_NUM_THREADS as much as
    with its seed), and so is what the global generator gives afterwards."""
    case = random_case(T=61, D=16, E=5, G=8, K=3, seed=4)
    args = [case[k] for k in ("x_TD", "expert_TK", "gate_TK", "w1_EDG", "w2_EGD")]
    runs = []
    for workers in (1, 2, 4):
        monkeypatch.setattr(kernels.torch_path, "_workers", lambda w=workers: w)
        torch.manual_seed(0)
        y = moe_mlp(*args, hidden_dropout=0.3, training=True, backend="torch")
        runs.append((y, torch.rand(3)))
    for y, after in runs[1:]:
        assert torch.equal(y, runs[0][0]) and torch.equal(after, runs[0][1])
    # ... yet the chunks' seeds come from the global generator: another step, another mask
    # and another seed, other masks
    again = moe_mlp(*args, hidden_dropout=0.3, training=True, backend="torch")
    torch.manual_seed(1)
    other_seed = moe_mlp(*args, hidden_dropout=0.3, training=True, backend="torch")
    assert not torch.equal(again, runs[0][0]) and not torch.equal(other_seed, runs[0][0])


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_compile_fullgraph_traces_torch_path(dropout):
    case = random_case(T=21, D=16, E=5, G=8, K=2)

    def layer(x, expert, gate, w1, w2):
        return moe_mlp(x, expert, gate, w1, w2, hidden_dropout=dropout, training=True,
                       backend="torch").square().sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    ins = [case[k].clone().requires_grad_() for k in ("x_TD", "gate_TK", "w1_EDG", "w2_EGD")]
    torch.manual_seed(0)
    loss = compiled(ins[0], case["expert_TK"], *ins[1:])
    grads = torch.autograd.grad(loss, ins)
    torch.manual_seed(0)
    loss_ref = layer(ins[0], case["expert_TK"], *ins[1:])
    grads_ref = torch.autograd.grad(loss_ref, ins)
    torch.testing.assert_close(loss, loss_ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r)


