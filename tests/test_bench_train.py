"""scripts/bench_train.py: runs on CPU, compares parameter-matched twins, writes its JSON."""
import json

import pytest

from scripts import bench_train


def test_bench_train_cpu_mini(tmp_path):
    out = bench_train.main(["--device", "cpu", "--shapes", "mini", "--warmup", "0",
                            "--reps", "1", "--out", str(tmp_path / "t.json")])
    row = out["results"]["mini"]
    # the twins are parameter-matched (within 1%), and the ratio is of the same run
    assert row["sigma_moe"]["n_params"] == pytest.approx(row["dense"]["n_params"], rel=0.01)
    assert row["moe_over_dense_time"] == pytest.approx(row["sigma_moe"]["ms"] / row["dense"]["ms"])
    assert json.loads((tmp_path / "t.json").read_text())["device"] == "cpu"
