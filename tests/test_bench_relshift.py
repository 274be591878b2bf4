"""scripts/bench_relshift.py end to end on a tiny case (the Triton interpreter on a CPU)."""
import json

import pytest
import torch

from tests.triton_helpers import TRITON_MARKS

pytestmark = TRITON_MARKS


def test_bench_relshift_checks_then_times(tmp_path, capsys):
    from scripts import bench_relshift

    path = tmp_path / "relshift.json"
    argv = ["--shapes", "mini", "--batch", "1", "--dtype", "fp32", "--warmup", "0",
            "--reps", "2", "--out", str(path)]
    bench_relshift.main(argv)
    (r,) = json.loads(path.read_text())["results"]
    assert (r["H"], r["B"], r["T"], r["L"], r["P"], r["equal"]) == (4, 1, 128, 256, 264, True)
    assert list(r["ms"]) == ["torch fwd", "triton fwd", "torch bwd", "triton bwd"]
    assert all(len(v) == 2 for v in r["ms_all"].values())
    assert r["gb_moved"] == pytest.approx(4 * 128 * (264 + 256) * 4 / 1e9)
    assert r["triton_over_torch"]["fwd"] == pytest.approx(
        r["ms"]["triton fwd"] / r["ms"]["torch fwd"])
    assert "check mini: Triton equals torch" in capsys.readouterr().out


def test_bench_relshift_fails_on_a_wrong_kernel(tmp_path, monkeypatch):
    """A Triton result that differs stops the run (non-zero exit), after its JSON."""
    from scripts import bench_relshift

    monkeypatch.setattr(bench_relshift, "relshift_bias_grad",
                        lambda g, P: torch.zeros(g.shape[1], g.shape[0], g.shape[2], P))
    path = tmp_path / "relshift.json"
    with pytest.raises(SystemExit, match="differs"):
        bench_relshift.main(["--shapes", "mini", "--batch", "1", "--reps", "1", "--warmup", "0",
                             "--out", str(path)])
    assert json.loads(path.read_text())["results"][0]["equal"] is False
