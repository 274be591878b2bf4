"""The one-launch slot-ordered scatter (kernels/triton_wave.py) against the per-slot launches
and the per-expert reference; its tile table against a plain-Python schedule.

CPU: the Triton interpreter, which runs programs one at a time in launch order, so a tile
that would wait on a later one is reported (the launcher raises) instead of hanging.
"""
import pytest
import torch

import kernels
from kernels.routing import make_routing
from kernels.testing import assert_close, compare, random_case, reference_case, run_case
from tests.triton_helpers import (
    CUDA,
    DEVICE,
    TRITON_MARKS,
    checks_of_a_failing_run,
    need_hopper_toolchain,
    outside_interpreter,
)

pytestmark = TRITON_MARKS
if kernels.HAS_TRITON:
    from kernels import triton_launch, triton_ops, triton_wave
    from kernels.triton_wave import WAVE_BLOCK_M, scatter_mm_wave, wave_table


def wave_reference(tok_R, off_S, E, T, B, BM):
    """The tiles (expert, first row, end row, group b*K + k) in wave order and need[g]."""
    tok, off = tok_R.tolist(), off_S.tolist()
    K = (len(off) - 1) // E
    TB = -(-max(T, 1) // B)
    tiles, per_grp = [], {}
    for _, k, b in sorted((b + k, k, b) for b in range(B) for k in range(K)):
        g, n0 = b * K + k, len(tiles)
        for e in range(E):
            rows = [r for r in range(off[e * K + k], off[e * K + k + 1])
                    if b * TB <= tok[r] < (b + 1) * TB]
            if rows:  # contiguous: rows are token-sorted inside an (expert, slot) segment
                assert rows == list(range(rows[0], rows[-1] + 1))
                tiles += [(e, r0, rows[-1] + 1, g) for r0 in range(rows[0], rows[-1] + 1, BM)]
        per_grp[g] = len(tiles) - n0
    need = [per_grp[g - 1] if g % K else 0 for g in range(B * K)]
    return tiles, need + [len(tiles)]


def skewed_routing(T, E, K, seed=0):
    """Distinct experts per token, expert 0 on most tokens, the last expert on none."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(T, E - 1, generator=gen)
    scores[: 3 * T // 4, 0] += 1
    return scores.argsort(-1, descending=True)[:, :K]


@pytest.mark.parametrize("T,E,K,B", [(50, 4, 2, 3), (37, 5, 3, 1), (61, 6, 4, 7), (9, 3, 2, 5)])
def test_table_is_the_wave_schedule(T, E, K, B, monkeypatch):
    """Every row in exactly one tile, tiles in wave order, every wait on earlier tiles, and
    the scatter's counters zeroed (its buffers start as garbage here, not as free zeros)."""
    r = make_routing(skewed_routing(T, E, K).to(DEVICE), E)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(-7))
    tab, need, sync = wave_table(r.tok_R, r.off_S, E, T, B)
    want_tiles, want_need = wave_reference(r.tok_R.cpu(), r.off_S.cpu(), E, T, B, WAVE_BLOCK_M)
    assert need.tolist() == want_need
    assert sync.tolist() == [0] * (K * B + 2)
    assert [tuple(t) for t in tab[: need[-1]].tolist()] == want_tiles
    bm = WAVE_BLOCK_M
    covered = sorted(r for _, r0, end, _ in want_tiles for r in range(r0, min(r0 + bm, end)))
    assert covered == list(range(T * K))
    for pos, (_, _, _, g) in enumerate(want_tiles):
        if g % K:  # the block's previous slot: all of its tiles come earlier
            assert sum(1 for (_, _, _, h) in want_tiles[:pos] if h == g - 1) == need[g]


def _scatter_case(T, E, K, N, G, dtype, seed=0):
    expert_TK = skewed_routing(T, E, K, seed).to(DEVICE)
    r = make_routing(expert_TK, E)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(T * K, G, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(E, G, N, generator=gen) * G ** -0.5).to(DEVICE, dtype)
    scale = torch.rand(T * K, generator=gen).to(DEVICE, dtype)
    return r, expert_TK.reshape(-1)[r.order_R], a, w, scale


@pytest.mark.parametrize("K,B,dtype,scaled", [
    (1, 1, torch.float32, True), (2, 3, torch.float16, True), (3, 2, torch.float32, False),
    (4, 5, torch.float32, True), (8, 2, torch.float16, False)])
def test_wave_equals_slot_launches(K, B, dtype, scaled):
    """Same sums as the per-slot launches and as the float64 index_add; two runs, same bits."""
    T, E, N, G = 29, K + 2, 20, 24
    r, e_R, a, w, scale = _scatter_case(T, E, K, N, G, dtype, seed=K)
    kw = dict(scale=scale, order_R=r.order_R) if scaled else {}
    y = scatter_mm_wave(a, w, r.tok_R, r.off_S, T, n_blocks=B, **kw)
    y_slots = triton_launch.scatter_mm(a, w, r.tok_R, r.off_S, T, **kw)
    rows = torch.einsum("rg,rgd->rd", a.double(), w.double()[e_R])
    if scaled:
        rows = rows * scale.double()[r.order_R][:, None]
    want = torch.zeros(T, N, dtype=torch.float64, device=DEVICE).index_add(0, r.tok_R.long(), rows)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    torch.testing.assert_close(y, y_slots, rtol=tol, atol=tol)
    assert torch.equal(y, scatter_mm_wave(a, w, r.tok_R, r.off_S, T, n_blocks=B, **kw))



@pytest.mark.skipif(not kernels.TRITON_INTERPRET,
                    reason="the interpreter's check (on a GPU it would hang)")
def test_a_wait_on_a_later_tile_is_reported(monkeypatch):
    """A table whose slot-1 tiles come before the slot-0 ones they wait for: on a GPU that
    launch would hang (the tiles it waits on were never taken); the interpreter says so."""
    T, E, K = 21, 3, 2
    r, _, a, w, _ = _scatter_case(T, E, K, 8, 16, torch.float32)

    def reversed_table(tok_R, off_S, n_exp, n_tokens, n_blocks):
        tab, need, sync = wave_table(tok_R, off_S, n_exp, n_tokens, n_blocks)
        tab[: need[-1]] = tab[: need[-1]].flip(0).clone()
        return tab, need, sync

    monkeypatch.setattr(triton_wave, "wave_table", reversed_table)
    with pytest.raises(RuntimeError, match="would wait on later ones"):
        scatter_mm_wave(a, w, r.tok_R, r.off_S, T, n_blocks=1)


@pytest.mark.parametrize("backend", ["triton", "triton_unfused"])
def test_layer_with_wave_matches_reference(monkeypatch, backend):
    """SIGMA_MOE_SCATTER=wave: the down-projection and every input gradient that scatters
    (dx of the fused layer, dx and dh of the unfused CVMMs) run as one launch, 3 blocks."""
    calls = []
    monkeypatch.setattr(triton_ops, "SCATTER", "wave")
    monkeypatch.setattr(triton_wave, "wave_blocks", lambda *args: calls.append(args) or 3)
    case = random_case(T=23, D=20, E=5, G=16, K=3, device=DEVICE, n_unused=1)
    assert_close(compare(run_case(case, backend), reference_case(case)), torch.float32)
    assert len(calls) == 2  # the forward's scatter and dx's


def test_one_slot_keeps_its_single_launch(monkeypatch):
    """K = 1 is one launch either way: no tile table is built for it."""
    def no_wave(*args, **kwargs):
        raise AssertionError("the wave launcher ran for K = 1")

    monkeypatch.setattr(triton_ops, "SCATTER", "wave")
    monkeypatch.setattr(triton_ops, "scatter_mm_wave", no_wave)
    case = random_case(T=9, D=16, E=3, G=16, K=1, device=DEVICE)
    assert_close(compare(run_case(case, "triton"), reference_case(case)), torch.float32)


def test_wave_configs_keep_the_tables_block_m(monkeypatch):
    """Only configs whose BLOCK_M is the table's reach the autotuner (another would add
    rows twice or leave them unwritten), the fp32 FMA ones included."""
    import kernels.triton_launch as L

    monkeypatch.setattr(L, "max_shared_mem", lambda index: L.H100_SMEM)
    monkeypatch.setattr(L, "AUTOTUNE", True)
    monkeypatch.setattr(triton_wave, "WAVE_BLOCK_M", 64)  # the GPU's (the interpreter: 16)
    a16 = {"a_ptr": torch.zeros(1, dtype=torch.bfloat16)}
    configs = [*triton_wave.WAVE_CONFIGS, L._cfg(128, 128, 64, 8, 3)]
    kept = triton_wave._prune_to_table(configs, a16, DOT_F32=False, PRECISION="tf32")
    assert kept == triton_wave.WAVE_CONFIGS
    fma = triton_wave._prune_to_table(configs, {"a_ptr": torch.zeros(1)}, DOT_F32=True,
                                      PRECISION="ieee")
    assert fma and all(c.kwargs["BLOCK_M"] == 64 for c in fma)
    monkeypatch.setattr(triton_wave, "WAVE_BLOCK_M", 32)
    with pytest.raises(AssertionError, match="BLOCK_M = 32"):
        triton_wave._prune_to_table(configs, a16, DOT_F32=False, PRECISION="tf32")


def test_wave_blocks():
    from kernels.triton_wave import MAX_GROUPS, MAX_LANES, wave_blocks, wave_problem

    bm = WAVE_BLOCK_M
    # the target case (T 32768, E 32, K 4, d_model 1024, bf16): 8 blocks of 4096 tokens,
    # the 4 blocks of a diagonal 32 MB of Y rows, about 2 tiles an (expert, slot, block)
    assert wave_blocks(32768, 32, 4, 1024, 2) == 8
    assert wave_blocks(32768 * 64, 32, 4, 1024, 2) == MAX_GROUPS // 4  # capped
    assert wave_blocks(32768, 128, 4, 1024, 2) == min(8, 32768 // (128 * bm))  # rows a tile
    assert wave_blocks(100, 4, 2, 64, 4) == 1
    assert wave_problem(32, 4, 8) is None
    assert "at most" in wave_problem(MAX_LANES, 2)
    assert "at most" in wave_problem(4, MAX_GROUPS + 1)


def test_unknown_scatter_schedule_is_refused():
    import os
    import subprocess
    import sys

    env = {**os.environ, "SIGMA_MOE_SCATTER": "waves"}
    out = subprocess.run([sys.executable, "-c", "import kernels.triton_ops"], env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert ("scatter schedule 'waves' (SIGMA_MOE_SCATTER): choose one of "
            "('slots', 'wave')") in out.stderr


def test_table_kernel_compiles_for_hopper():
    """Real Triton compiles the tile-table kernel for sm_90 at the smallest and the largest
    table a launch builds, with no spills up to the target case's 32 x 32 lanes, and with
    its barriers around the lanes' exchange."""
    import json

    from kernels.triton_wave import MAX_GROUPS, MAX_LANES

    need_hopper_toolchain()
    stdout = outside_interpreter("-c", (
        "import json\nfrom kernels.triton_aot import compile_table\n"
        f"for g, e in ((1, 1), (32, 32), ({MAX_GROUPS}, {MAX_LANES // MAX_GROUPS})):\n"
        "    print(json.dumps(compile_table(g, e)))\n"))
    small, target, largest = (json.loads(line) for line in stdout.splitlines())
    assert small["spill_bytes"] == 0 and target["spill_bytes"] == 0, (small, target)
    assert largest["registers"] <= 255 and largest["shared_bytes"] <= 227 * 1024, largest
    # lanes trade their block starts through memory: the first stores (the starts), a
    # barrier, the loads of the neighbours', a barrier, then the table rows over them (the
    # interpreter runs a program as one, so only the compiled code can show this)
    for table in (small, target, largest):
        order = table["order"].split()
        first = order.index("st")
        assert order[first: first + 5] == ["st", "bar", "ld", "bar", "st"], table["order"]


def test_bench_scatter_times_every_variant(tmp_path, monkeypatch, capsys):
    """scripts/bench_scatter.py end to end on a tiny case (the interpreter: no graph times):
    each scatter's wave variants are checked against the slot launches before the timings
    (the lines gpu_check.sh reads); a wave that is off fails the run, after its JSON."""
    import json

    from scripts import bench_scatter

    path = tmp_path / "scatter.json"
    argv = ["--tokens", "24", "--d-model", "16", "--n-experts", "3", "--expert-size", "16",
            "--k", "2", "--blocks", "1", "2", "--dtype", "fp32", "--warmup", "0", "--reps",
            "1", "--out", str(path)]
    bench_scatter.main(argv)
    rows = json.loads(path.read_text())["results"]
    assert [(r["kind"], r["variant"]) for r in rows] == [
        (kind, v) for kind in ("fwd", "dx")
        for v in ("slots", "wave B=1 (default)", "wave B=2")]
    assert all(r["rel_diff"] < 1e-6 and r["ms"] > 0 for r in rows)
    said = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in said if ln.startswith("check")] == [
        "check fwd: ok", "check dx: ok"]
    # both checks before the first timing table
    assert said.index(next(ln for ln in said if ln.startswith("check dx"))) < said.index(
        next(ln for ln in said if ln.startswith("scatter ")))
    real = triton_wave.scatter_mm_wave  # a wave that misses a wait: a slot left out
    monkeypatch.setattr(triton_wave, "scatter_mm_wave",
                        lambda *a, n_blocks, **k: real(*a, n_blocks=n_blocks, **k) * (
                            1.0 if n_blocks == 1 else 0.5))
    checks = checks_of_a_failing_run(bench_scatter.main, argv, path,
                                     "a wave variant disagrees", capsys)
    assert checks[0].startswith("check fwd: FAIL {'wave B=2': ")


def test_bench_scatter_checks_the_graph_replays_too(monkeypatch):
    """On CUDA each variant is also checked as a CUDA-graph replay (what the layer
    benchmarks time), whose output starts as NaN: a replay that leaves rows unwritten fails
    even where the eager call was right. (A stand-in graph: capture runs fn, replay reruns
    it.)"""
    from scripts import bench_scatter

    class Graph:
        def __init__(self, fn):
            self.fn = fn
            fn()

        def replay(self):
            self.fn()

    want = torch.arange(6.0).reshape(2, 3)
    fns = {"slots": want.clone, "wave B=1": lambda: want * 1.001}
    monkeypatch.setattr(bench_scatter, "cuda_graph", Graph)
    assert bench_scatter.differences(fns, cuda=True) == {
        "slots": [0.0, 0.0], "wave B=1": [pytest.approx(0.001, rel=1e-3)] * 2}

    class Unwritten(Graph):  # a replay that writes nothing into its output
        def replay(self):
            pass

    monkeypatch.setattr(bench_scatter, "cuda_graph", Unwritten)
    eager, replay = bench_scatter.differences(fns, cuda=True)["wave B=1"]
    assert eager == pytest.approx(0.001, rel=1e-3) and replay != replay  # NaN: fails


# ---------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_wave_layer_matches_reference_and_is_deterministic(monkeypatch):
    """The target shape, 8 token blocks: the waits and the reads past L1 are what the CPU
    cannot check (a missed wait reads a partial sum: wrong, and different run to run)."""
    monkeypatch.setattr(triton_ops, "SCATTER", "wave")
    case = random_case(T=32768, D=1024, E=32, G=128, K=4, dtype=torch.bfloat16, device="cuda")
    got = run_case(case, "triton")
    assert_close(compare(got, reference_case(case)), torch.bfloat16)
    for _ in range(3):
        again = run_case(case, "triton")
        for a, b in zip((got[0], *got[1]), (again[0], *again[1])):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scaled", [True, False])
def test_gpu_wave_equals_slot_launches_bit_for_bit(dtype, scaled):
    """Both scatters of the layer (gate-scaled y; dx through W1^T, a stride swap): the wave's
    bits equal the per-slot launches' at 1-16 token blocks, over repeated launches (16
    blocks: many short waits) and over CUDA-graph replays of the launch."""
    from scripts.bench_common import cuda_graph

    T, E, K, G, N = 8192, 16, 4, 128, 512
    r, _, a, w, scale = _scatter_case(T, E, K, N, G, dtype)
    if not scaled:
        w = torch.randn(E, N, G, device="cuda", dtype=dtype).transpose(1, 2)
    kw = {"scale": scale, "order_R": r.order_R} if scaled else {}
    want = triton_launch.scatter_mm(a, w, r.tok_R, r.off_S, T, **kw)

    def run(b):
        return scatter_mm_wave(a, w, r.tok_R, r.off_S, T, n_blocks=b, **kw)

    for b in (1, 2, 8, 16):
        assert torch.equal(run(b), want), b
    assert all(torch.equal(run(16), want) for _ in range(30))
    held = {}
    graph = cuda_graph(lambda: held.update(y=run(8)))
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(held["y"], want)
