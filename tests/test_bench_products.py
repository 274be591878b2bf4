"""scripts/bench_products.py end to end on a tiny case (the Triton interpreter on a CPU)."""
from tests.triton_helpers import TRITON_MARKS, checks_of_a_failing_run

pytestmark = TRITON_MARKS


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
    checks = checks_of_a_failing_run(bench_products.main, argv, path,
                                     "a rearranged variant disagrees", capsys)
    assert checks[1].startswith("check wgrad dW1: FAIL {'interleaved C=2': ")
