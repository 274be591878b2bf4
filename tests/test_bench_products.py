"""scripts/bench_products.py end to end on a tiny case (the Triton interpreter on a CPU)."""
import pytest

from tests.triton_helpers import CUDA, TRITON_MARKS, checks_of_a_failing_run

pytestmark = TRITON_MARKS


def test_bench_products_checks_the_rearranged_launches(tmp_path, monkeypatch, capsys):
    """scripts/bench_products.py end to end on a tiny case: the layer's launches, the
    rearranged ones (pre-gathered rows; an expert's rows token-interleaved by the routing's
    chunks, for the weight gradient: the same sum in another order; the scatter chunk by
    chunk) and bmm, timed in the same rounds; a rearranged launch that disagrees fails the
    run, after its JSON."""
    import json

    from scripts import bench_products
    from sigma_moe.kernels import triton_launch

    path = tmp_path / "products.json"
    argv = ["--tokens", "37", "--d-model", "16", "--n-experts", "5", "--expert-size", "16",
            "--k", "2", "--chunks", "2", "5", "--scatter-chunks", "3", "--dtype", "fp32",
            "--warmup", "0", "--reps",
            "1", "--out", str(path)]
    bench_products.main(argv)
    rows = {(r["product"], r["variant"]): r for r in json.loads(path.read_text())["results"]}
    wgrad_variants = ["layer", "interleaved C=2", "interleaved C=5", "bmm"]
    assert list(rows) == [
        *[("gather fwd", v) for v in ("layer", "rows pre-gathered", "bmm")],
        *[(p, v) for p in ("wgrad dW1", "wgrad dW2") for v in wgrad_variants],
        ("scatter fwd", "layer"), ("scatter fwd", "chunked C=3"), ("scatter fwd", "bmm"),
        *[(p, v) for p in ("wgrad dW1 skewed", "wgrad dW2 skewed")
          for v in ("layer", "one chunk an expert", "bmm")]]
    assert all(r["ms"] > 0 and r["x_layer"] > 0 for r in rows.values())
    assert rows["gather fwd", "layer"]["x_layer"] == 1.0
    assert rows["gather fwd", "bmm"]["flops"] == 2 * (37 * 2 // 5) * 5 * 16 * 16
    # the L2 model beside every Triton variant (the interpreter's 16 x 16 blocks), not bmm,
    # in TB/s (run 4 printed MB / ms / 1e6: 0.01 for 6 TB/s); a probe on a GPU only
    saved = json.loads(path.read_text())
    assert (saved["l2_probe_tb_s"] is None) == (not CUDA)
    if not CUDA:
        assert saved["l2_blocks"]["gather"] == [16, 16, 1]
    for r in rows.values():
        if "l2_mb" in r:
            assert r["l2_tb_s"] == pytest.approx(r["l2_mb"] * 1e6 / (r["ms"] * 1e-3) / 1e12)
    assert rows["wgrad dW1", "layer"]["l2_mb"] == rows["wgrad dW1", "interleaved C=5"]["l2_mb"]
    assert all(("l2_mb" in r) == (v not in ("bmm", "chunked C=3") and "skewed" not in p)
               for (p, v), r in rows.items())
    said = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in said if ln.startswith("check")] == [
        "check gather fwd: ok", "check wgrad dW1: ok", "check wgrad dW2: ok",
        "check scatter fwd: ok", "check wgrad dW1 skewed: ok", "check wgrad dW2 skewed: ok"]
    # a product whose tuner's choice is not found gets no L2 column (the others keep theirs)
    real_blocks = bench_products.product_blocks
    monkeypatch.setattr(bench_products, "product_blocks",
                        lambda *a: {**real_blocks(*a), "slot k": None})
    bench_products.main(argv)
    rows = {(r["product"], r["variant"]): r for r in json.loads(path.read_text())["results"]}
    assert "l2_mb" not in rows["scatter fwd", "layer"] and "l2_mb" in rows["gather fwd", "layer"]
    monkeypatch.undo()
    capsys.readouterr()
    real = triton_launch.wgrad  # one that drops a chunk's rows
    monkeypatch.setattr(triton_launch, "wgrad", lambda a, b, tok, off, E, *f, **kw: real(
        a, b, tok, off if off.numel() - 1 == E * 2 else off.clamp(max=off[1]), E, *f, **kw))
    checks = checks_of_a_failing_run(bench_products.main, argv, path,
                                     "a rearranged variant disagrees", capsys)
    assert checks[1].startswith("check wgrad dW1: FAIL {'interleaved C=2': ")


def _simulated_bytes(product, blocks, seg_rows, D, G, E, K):
    """Elements the layer's launches load and store, counted tile by tile as the kernels
    walk them (sigma_moe/kernels/triton_cvmm.py): the oracle of bench_products.l2_bytes."""
    moved = 0
    if product == "gather fwd":  # per (expert, slot) segment, BLOCK_M-row tiles x column tiles
        bm, bn, _ = blocks["gather"]
        for n in seg_rows:
            for r0 in range(0, n, bm):
                rows = min(bm, n - r0)
                for c0 in range(0, G, bn):
                    cols = min(bn, G - c0)
                    moved += rows * D + D * cols + rows * cols  # x rows, W slab, h out
        return moved
    if product.startswith("wgrad"):  # per expert, an (M, N) output tile walks all its rows
        M, N = (D, G) if product == "wgrad dW1" else (G, D)
        bm, bn, _ = blocks["wgrad " + product[-3:]]
        for e in range(E):
            rows = sum(seg_rows[e * K:(e + 1) * K])
            for m0 in range(0, M, bm):
                for n0 in range(0, N, bn):
                    mm, nn = min(bm, M - m0), min(bn, N - n0)
                    moved += rows * mm + rows * nn + mm * nn
        return moved
    for k in range(K):  # scatter: slot k's launch, its segment of every expert
        bm, bn, nt = blocks["slot 0" if k == 0 else "slot k"]
        for e in range(E):
            n = seg_rows[e * K + k]
            for r0 in range(0, n, bm):
                rows = min(bm, n - r0)
                for c0 in range(0, D, bn):
                    cols = min(bn, D - c0)
                    first = c0 % (bn * nt) == 0  # a program's first column tile loads A
                    moved += (rows * G * first + G * cols
                              + rows * cols * (1 if k == 0 else 2))
    return moved


def test_l2_model_counts_what_the_tiles_move():
    """bench_products.l2_bytes (gpu_h200.md item 13's model) against a tile-by-tile count of
    the loads and stores of the layer's launches, on random routings with empty and ragged
    segments and blocks that do and do not divide the sizes."""
    import torch

    from scripts.bench_products import l2_bytes

    gen = torch.Generator().manual_seed(0)
    for T, D, G, E, K in ((37, 24, 16, 5, 2), (64, 48, 40, 3, 3), (9, 16, 8, 7, 1)):
        counts = torch.randint(0, 2 * T * K // (E * K) + 1, (E * K,), generator=gen)
        counts[0] = 0  # an empty segment
        seg_rows = counts.tolist()
        blocks = {"gather": (16, 16, 1), "wgrad dW1": (16, 32, 1), "wgrad dW2": (32, 16, 1),
                  "slot 0": (8, 32, 1), "slot k": (16, 16, 2)}  # slot k: a column loop
        for product in ("gather fwd", "wgrad dW1", "wgrad dW2", "scatter fwd"):
            want = _simulated_bytes(product, blocks, seg_rows, D, G, E, K)
            got = l2_bytes(product, blocks, seg_rows, D, G, E, K, 2)
            assert got == 2 * want, (product, T, D, G, E, K)


def test_chosen_blocks_reads_the_autotuners_choice():
    """The block sizes the L2 column uses: the config an autotuner's cache holds for the
    key values (whatever the dtypes that follow them in its key), None for a key it did not
    tune (no L2 column then, rather than a model of the wrong tiles); the interpreter's
    blocks where the kernel has no autotuner."""
    import triton

    from scripts.bench_products import chosen_blocks
    from sigma_moe.kernels.triton_tuning import _INTERPRET_BLOCKS

    class Tuner:
        keys = ["N", "KD"]
        cache = {(64, 32, "torch.float16"): triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}),
                 (128, 32, "torch.bfloat16"): triton.Config({"BLOCK_M": 256, "BLOCK_N": 128,
                                                             "N_TILES": 4})}

    assert chosen_blocks(Tuner(), {"N": 128, "KD": 32}) == (256, 128, 4)
    assert chosen_blocks(Tuner(), {"N": 64, "KD": 32}) == (16, 64, 1)
    assert chosen_blocks(Tuner(), {"N": 1, "KD": 1}) is None  # not tuned: no model
    interpreter = (_INTERPRET_BLOCKS["BLOCK_M"], _INTERPRET_BLOCKS["BLOCK_N"], 1)
    assert chosen_blocks(object(), {}) == interpreter


def test_l2_probe_kernel_sums_its_slice_reps_times():
    """The L2 probe's kernel reads each program's STEPS x BLOCK elements `reps` times, a
    pass starting one block further on than the one before: each output is reps x its
    slice's sum."""
    import torch

    from scripts.bench_products import l2_read_kernel
    from tests.triton_helpers import DEVICE

    x = torch.arange(3 * 4 * 16, dtype=torch.float32, device=DEVICE) % 7
    out = torch.empty(3, device=DEVICE)
    l2_read_kernel[(3,)](x, out, 5, BLOCK=16, STEPS=4)
    torch.testing.assert_close(out, 5 * x.view(3, -1).sum(1))


PROBE_FOR_HOPPER = """
import torch
from scripts.bench_products import l2_read_kernel
x, out = torch.zeros(8 * 1024, dtype=torch.bfloat16), torch.zeros(1)
kernel = l2_read_kernel.warmup(x, out, 3, BLOCK=1024, STEPS=8, grid=(1,))
print(kernel.asm["ptx"].count("ld.global.cg"))
"""


def test_l2_probe_kernel_compiles_for_hopper_with_loads_past_l1():
    """Real Triton (a stand-in sm_90 driver) compiles the probe, and its loads skip L1
    (ld.global.cg), as the products' cp.async copies do: the probe reads from L2."""
    from tests.triton_helpers import STAND_IN_DRIVER, need_hopper_toolchain, outside_interpreter

    need_hopper_toolchain()
    assert int(outside_interpreter("-c", STAND_IN_DRIVER + PROBE_FOR_HOPPER)) > 0
