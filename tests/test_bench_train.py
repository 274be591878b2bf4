"""scripts/bench_train.py: runs on CPU, compares parameter-matched twins, writes its JSON."""
import json
import statistics

import pytest
import torch

from scripts import bench_common, bench_train


def test_bench_train_cpu_mini(tmp_path, capsys):
    out = bench_train.main(["--device", "cpu", "--shapes", "mini", "--warmup", "0",
                            "--reps", "3", "--chunks", "2", "--out", str(tmp_path / "t.json")])
    row = out["results"]["mini"]
    # the sigma-MoE twin in 2 token chunks, timed in the same rounds, its own ratio
    chunked = row["sigma_moe C=2"]
    assert chunked["n_params"] == row["sigma_moe"]["n_params"] and len(chunked["ms_all"]) == 3
    assert chunked["over_dense"] == pytest.approx(
        statistics.median(m / d for m, d in zip(chunked["ms_all"], row["dense"]["ms_all"])))
    assert "mini       sigma-MoE C=2 / dense step time: " in capsys.readouterr().out
    # the twins are parameter-matched (within 1%), and the ratio pairs steps of one round
    assert row["sigma_moe"]["n_params"] == pytest.approx(row["dense"]["n_params"], rel=0.01)
    moe, dense = row["sigma_moe"]["ms_all"], row["dense"]["ms_all"]
    assert len(moe) == len(dense) == 3
    assert row["moe_over_dense_time"] == pytest.approx(
        statistics.median(m / d for m, d in zip(moe, dense)))
    q1, q3 = row["moe_over_dense_quartiles"]
    assert q1 <= row["moe_over_dense_time"] <= q3
    assert json.loads((tmp_path / "t.json").read_text())["device"] == "cpu"


@pytest.mark.parametrize("argv, changed", [
    ([], []),
    (["--out", "x.json", "--shapes", "mini", "--dtype", "fp32", "--reps", "10"], []),
    (["--shapes", "wt_small"], ["--shapes"]),
    (["--reps", "3", "--warmup", "0"], ["--warmup", "--reps"]),
    (["--batch", "4", "--dtype", "bf16"], ["--dtype", "--batch"]),
])
def test_flags_that_change_the_results(argv, changed):
    assert bench_train.parse_args(["--device", "cpu", *argv])[1] == changed


def test_only_the_default_run_writes_benchmarks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_common, "ROOT", tmp_path)
    row = {"batch": 16, "moe_over_dense_time": 0.8, "moe_over_dense_quartiles": [0.7, 0.9],
           **{k: {"peak_mb": None, "n_params": 1, "ms": 1.0, "tokens_per_s": 1.0,
                  "over_dense": 0.8, "over_dense_quartiles": [0.7, 0.9]}
              for k in ("dense", "sigma_moe")}}
    monkeypatch.setattr(bench_train, "bench_shape", lambda *a: row)  # nothing is timed
    bench_train.main(["--device", "cpu", "--reps", "3"])
    assert (tmp_path / "runs" / "bench" / "train_cpu.json").is_file()
    assert not (tmp_path / "benchmarks").exists()
    assert "not the defaults (--reps)" in capsys.readouterr().out
    bench_train.main(["--device", "cpu"])
    assert (tmp_path / "benchmarks" / "train_cpu.json").is_file()


def test_profile_on_a_cpu_says_it_is_ignored(tmp_path, monkeypatch, capsys):
    """--profile times CUDA kernels only: on a CPU one note on stderr, and the run goes on;
    on a GPU (driven with a name, nothing run) and without --profile, no note."""
    row = {"batch": 16, "moe_over_dense_time": 0.8, "moe_over_dense_quartiles": [0.7, 0.9],
           **{k: {"peak_mb": None, "n_params": 1, "ms": 1.0, "tokens_per_s": 1.0,
                  "over_dense": 0.8, "over_dense_quartiles": [0.7, 0.9]}
              for k in ("dense", "sigma_moe")}}
    profiles = []
    monkeypatch.setattr(bench_train, "bench_shape",
                        lambda *a: profiles.append(a[6]) or row)  # nothing is timed
    out = ["--out", str(tmp_path / "t.json")]
    bench_train.main(["--device", "cpu", "--profile", "12", *out])
    said = capsys.readouterr()
    assert said.err.splitlines() == ["note: --profile times CUDA kernels; not on cpu (ignored)"]
    assert "mini" in said.out and (tmp_path / "t.json").is_file()  # and it went on
    bench_train.main(["--device", "cpu", *out])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    bench_train.main(["--device", "cuda", "--profile", "12", *out])
    assert "note:" not in capsys.readouterr().err
    assert profiles == [12, 0, 12, 12]  # wt_small and wt_big on the GPU


def test_bench_train_halves_the_batch_when_a_step_does_not_fit(monkeypatch, tmp_path):
    measure, tried = bench_train.bench_batch, []

    def gpu_of(max_batch):
        def bench_batch(shape, device, dtype, warmup, reps, batch, profile=0, chunks=()):
            tried.append(batch)
            if batch > max_batch:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return measure(shape, device, dtype, warmup, reps, batch, profile, chunks)
        return bench_batch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = ["--device", "cpu", "--shapes", "mini", "--warmup", "0", "--reps", "1",
            "--out", str(tmp_path / "t.json")]
    monkeypatch.setattr(bench_train, "bench_batch", gpu_of(4))
    out = bench_train.main(args)
    assert tried == [16, 8, 4] and out["results"]["mini"]["batch"] == 4
    tried.clear()
    monkeypatch.setattr(bench_train, "bench_batch", gpu_of(0))
    with pytest.raises(torch.cuda.OutOfMemoryError):  # not even one sequence: the error
        bench_train.main([*args, "--batch", "2"])
    assert tried == [2, 1]


def test_the_wt_big_step_target_is_judged_on_a_gpu(tmp_path, monkeypatch, capsys):
    """Issue 4: a WT-B sigma-MoE step at most 0.6x the dense one (bf16 on CUDA); driven with
    a GPU name and timings given, nothing run."""
    def row(ratio):
        return {"batch": 32, "moe_over_dense_time": ratio, "moe_over_dense_quartiles": [0, 1],
                **{k: {"peak_mb": 1.0, "n_params": 1, "ms": 1.0, "tokens_per_s": 1.0,
                       "over_dense": ratio, "over_dense_quartiles": [0, 1]}
                   for k in ("dense", "sigma_moe")}}

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for ratio, verdict in ((0.55, "PASS"), (0.65, "FAIL")):
        monkeypatch.setattr(bench_train, "bench_shape", lambda *a, r=ratio: row(r))
        out = bench_train.main(["--device", "cuda", "--out", str(tmp_path / "t.json")])
        assert out["results"]["wt_big"]["target"] == {"limit": 0.6, "pass": verdict == "PASS"}
        assert "target" not in out["results"]["wt_small"]
        assert f"wt_big     target: sigma-MoE step <= 0.6x dense: {verdict}" in \
            capsys.readouterr().out


@pytest.mark.parametrize("shape,exp", [("wt_small", "wt103_small"), ("wt_big", "wt103_big"),
                                       ("mini", "mini")])
def test_shapes_are_the_experiments(shape, exp):
    """bench_train times the models the experiments train: every number of SHAPES is
    configs/exp/<exp>_moe's (and d_ff its dense twin's)."""
    from sigma_moe.tasks.lm_run import vocab_of
    from tests.helpers import compose_cfg

    moe, dense = compose_cfg([], f"{exp}_moe"), compose_cfg([], f"{exp}_dense")
    m, f, t = moe["model"], moe["ffn"], moe["task"]
    want = (m["d_model"], m["n_layers"], m["n_heads"], m["head_dim"], t["context"],
            t["batch_size"], vocab_of(moe), dense["ffn"]["d_ff"], f["n_experts"],
            f["expert_size"], f["k"], m["dropout"], f["expert_dropout"], f["reg_gamma"])
    assert bench_train.SHAPES[shape] == want
    assert dense["model"]["dropout"] == m["dropout"]
