"""scripts/bench_train.py: runs on CPU, compares parameter-matched twins, writes its JSON."""
import json
import statistics

import pytest

from scripts import bench_train


def test_bench_train_cpu_mini(tmp_path):
    out = bench_train.main(["--device", "cpu", "--shapes", "mini", "--warmup", "0",
                            "--reps", "3", "--out", str(tmp_path / "t.json")])
    row = out["results"]["mini"]
    # the twins are parameter-matched (within 1%), and the ratio pairs steps of one round
    assert row["sigma_moe"]["n_params"] == pytest.approx(row["dense"]["n_params"], rel=0.01)
    moe, dense = row["sigma_moe"]["ms_all"], row["dense"]["ms_all"]
    assert len(moe) == len(dense) == 3
    assert row["moe_over_dense_time"] == pytest.approx(
        statistics.median(m / d for m, d in zip(moe, dense)))
    lo, hi = row["moe_over_dense_range"]
    assert lo <= row["moe_over_dense_time"] <= hi
    assert json.loads((tmp_path / "t.json").read_text())["device"] == "cpu"
