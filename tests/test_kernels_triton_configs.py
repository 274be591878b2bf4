"""The CVMM kernels' autotune configs (sigma_moe/kernels/triton_tuning.py): what they need on sm_90
(shared memory, registers, wgmma and a pipelined loop, compiled ahead of time with real
Triton, no GPU needed), which ones a GPU's shared memory keeps, and how the autotuner
times them; the launchers' host-side arithmetic.
"""
import functools

import pytest
import torch

from tests.triton_helpers import TRITON_MARKS, need_hopper_toolchain, outside_interpreter

pytestmark = TRITON_MARKS


def _compile_for_hopper(*args: str) -> list[dict]:
    """Reports of `python -m sigma_moe.kernels.triton_aot *args` (skips without ptxas / a new
    Triton)."""
    import json

    need_hopper_toolchain()
    stdout = outside_interpreter("-m", "sigma_moe.kernels.triton_aot", *args)
    return [json.loads(line) for line in stdout.splitlines()]


@functools.cache
def _fp32_configs_for_hopper() -> list[dict]:
    """Every autotune config of every kernel variant, fp32 (its tiles are the largest)."""
    return _compile_for_hopper("fp32", "--all-configs")


def test_kernels_compile_for_hopper():
    """Real Triton (not the interpreter) compiles every kernel variant for sm_90, with
    wgmma products and a software-pipelined (cp.async) K loop; no GPU needed."""
    reports = _compile_for_hopper()
    assert len(reports) == 6
    for r in reports:
        assert r["wgmma"] > 0 and r["async_copies"] > 0, r
        assert r["shared_bytes"] <= 227 * 1024, r  # fits an H100 SM


def test_smem_estimate_is_what_triton_allocates():
    """fitting_configs' estimate is the shared memory of every compiled fp32 config (sm_90;
    of the wgrad kernel with 2 stages, an upper bound), so the pruning drops exactly the
    configs that cannot run on an H100."""
    from sigma_moe.kernels.triton_tuning import (
        H100_SMEM,
        MM_CONFIGS,
        SCATTER_CONFIGS,
        SMALL_CONFIG,
        WGRAD_CONFIGS,
        fitting_configs,
    )

    reports = _fp32_configs_for_hopper()
    by_kernel = {k: [r for r in reports if r["kernel"] == k]
                 for k in ("gather_mm_kernel", "scatter_mm_kernel", "wgrad_kernel")}
    gather, wgrad = by_kernel["gather_mm_kernel"], by_kernel["wgrad_kernel"]
    # two variants each x (the autotune configs + the small one)
    assert [len(r) for r in by_kernel.values()] == [
        2 * (len(c) + 1) for c in (MM_CONFIGS, SCATTER_CONFIGS, WGRAD_CONFIGS)]
    scatter, looped = [], []  # the scatter's one-tile programs, its column loops
    for r in by_kernel["scatter_mm_kernel"]:
        (looped if r["variant"].get("N_TILES", 1) > 1 else scatter).append(r)
    assert all(r["shared_bytes"] == r["estimate"] for r in gather + scatter), reports
    assert looped and all(r["shared_bytes"] <= r["estimate"] for r in looped), looped
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


def test_loads_stay_in_flight_across_loop_steps():
    """What each config's num_stages S buys on sm_90: the copy groups that a loop step's
    wait leaves in flight (PTX `cp.async.wait_group`). A gather or scatter step commits 2
    groups (A and W tiles) and keeps S - 2 steps ahead; a step of the scatter's column loop
    (N_TILES > 1) 1 group, its W tile (A is loaded once). A wgrad step commits 3
    (its rows' token ids, then the rows: a load behind a load, so the pipeliner gives the
    ids stages of their own) and keeps (S + 1) // 2 - 2 ahead: with S = 3 or 4 (runs 1-3's
    config, kept as the baseline) each step waited for all its loads, which fits its 105
    us on the H200 (benchmarks/gpu_h200.md item 9); every other wgrad config keeps loads
    in flight. A Triton whose pipeliner works otherwise fails here: WGRAD_CONFIGS' comment
    and smem_bytes would then be wrong too."""
    reports = _fp32_configs_for_hopper()
    for r in reports:
        s = r["num_stages"]
        wgrad = r["kernel"] == "wgrad_kernel"
        ahead = max(0, ((s + 1) // 2 if wgrad else s) - 2)
        groups = 3 if wgrad else 1 if r["variant"].get("N_TILES", 1) > 1 else 2
        assert r["copies_left_in_flight"] == groups * ahead, r
    from sigma_moe.kernels.triton_tuning import WGRAD_CONFIGS

    baseline = WGRAD_CONFIGS[-1]
    assert baseline.num_stages == 4 and all(c.num_stages >= 5 for c in WGRAD_CONFIGS[:-1])


def test_fitting_configs_per_gpu():
    from sigma_moe.kernels.triton_tuning import (
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
    import sigma_moe.kernels.triton_tuning as L

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

    from sigma_moe.kernels.triton_tuning import tf32_allowed

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
    from sigma_moe.kernels.triton_tuning import IEEE_CONFIGS

    assert len(reports) == 3 * 2 * len(IEEE_CONFIGS)
    assert all(r["spill_bytes"] == 0 for r in reports), reports


def test_gpu_autotuners_prune_and_cache():
    """Outside the interpreter the kernels are autotuned over the configs that fit the GPU,
    timed on CUDA-graph replays (`graph_bench`), and (Triton >= 3.4) the choice is kept on
    disk, so a resumed run sums in the same order."""
    import inspect

    import triton

    stdout = outside_interpreter("-c", (
        "import sigma_moe.kernels.triton_launch as L\n"
        "for a in (L._gather_mm, L._scatter_mm, L._wgrad):\n"
        "    print(getattr(a, 'cache_results', False), a.early_config_prune.__name__,\n"
        "          a._do_bench.__name__)\n"))
    caching = str("cache_results" in inspect.signature(triton.autotune).parameters)
    assert stdout.split() == [caching, "_prune_to_smem", "graph_bench",
                              caching, "_prune_to_smem", "graph_bench",
                              caching, "_prune_wgrad_to_smem", "graph_bench"]


def test_autotune_times_graph_replays_after_the_callers_kernels(monkeypatch):
    """graph_bench: a device sync first (do_bench_cudagraph runs on a stream of its own,
    which would not wait for the kernels that write this launch's inputs), then CUDA-graph
    replays of the launch, with the autotuner's quantiles."""
    import triton.testing

    from sigma_moe.kernels import triton_tuning

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph",
                        lambda fn, rep, quantiles: calls.append(("graphs", fn, rep, quantiles))
                        or [1.0, 0.9, 1.1])
    launch = object()
    assert triton_tuning.graph_bench(launch, quantiles=(0.5, 0.2, 0.8)) == [1.0, 0.9, 1.1]
    assert calls == ["sync", ("graphs", launch, triton_tuning.GRAPH_BENCH_REP_MS,
                              (0.5, 0.2, 0.8))]
    # a capture that fails: timed launch by launch after all, with a warning

    def no_capture(fn, rep, quantiles):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", no_capture)
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, quantiles: calls.append(("events", fn)) or [2.0, 1.9, 2.1])
    calls.clear()
    with pytest.warns(UserWarning, match="CUDA-graph replays failed .*stream is capturing"):
        assert triton_tuning.graph_bench(launch, quantiles=(0.5,)) == [2.0, 1.9, 2.1]
    assert calls == ["sync", "sync", ("events", launch)]
    # first launched inside a capture (no warm-up): said so, not a capture broken by a sync
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    calls.clear()
    with pytest.raises(RuntimeError, match="inside a CUDA-graph capture.*warm-up"):
        triton_tuning.graph_bench(launch, quantiles=(0.5,))
    assert calls == []


def test_host_arithmetic_is_tritons():
    """triton_tuning.cdiv / next_power_of_2 (plain Python on the host, where Triton's are
    constexpr functions costing ~1.4 us a call) agree with Triton's."""
    import triton

    from sigma_moe.kernels.triton_tuning import cdiv, next_power_of_2

    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(300) for b in range(1, 70))
    assert all(next_power_of_2(n) == triton.next_power_of_2(n) for n in range(1, 5000))
