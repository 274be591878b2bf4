"""The relative-FLOPs table (paper Tab. flops_detailed, Tab. moe's "% FLOPs"):
scripts/flops_table.py and sigma_moe/models/flops.py, on a grid of experiments and on
configs/exp/."""
from pathlib import Path

import pytest

from scripts import paper_tables
from scripts.flops_table import config_relative_flops
from sigma_moe.models.ffn.dense import DenseConfig
from sigma_moe.models.ffn.experts import ExpertsConfig
from sigma_moe.models.flops import ffn_flops, relative_ffn_flops
from tests.tables_helpers import PAPER_COLUMNS, PAPER_FLOPS, cells, paper_grid, table_lines

ROOT = Path(__file__).resolve().parent.parent


def test_flops_table_equals_the_papers(tmp_path):
    paper_grid(tmp_path / "exp")
    text = paper_tables.main(["--exp-dir", str(tmp_path / "exp"), "--runs", str(tmp_path),
                              "--table", "flops"])
    lines = table_lines(text, "Tab. flops_detailed")
    assert lines[2] == "|  | G | K | WT-S | WT-S* | WT-B | E8 |"
    assert "| d_model |  |  | 412 | 412 | 1024 | 512 |" in lines
    got = {}
    for line in lines:
        row = cells(line)
        if row[0].startswith("G="):
            got[(int(row[1]), int(row[2]))] = tuple(row[3:])
    assert got == PAPER_FLOPS
    # the functions behind it
    moe = ExpertsConfig(d_model=412, n_layers=16, n_experts=16, expert_size=128, k=4)
    dense = DenseConfig(d_model=412, n_layers=16, d_ff=2053)
    assert relative_ffn_flops(moe) == 0.25
    assert relative_ffn_flops(moe, dense) == pytest.approx(512 / 2053)
    with_sel = ffn_flops(moe, include_selection=True) / ffn_flops(DenseConfig(412, 16, 2048))
    assert with_sel == pytest.approx((2 * 412 * 512 + 16 * 412) / (2 * 412 * 2048))
    assert ffn_flops(dense) == 2 * (2 * 412 * 2053)  # FLOPs = 2 x multiply-adds


def test_real_experiment_files_give_the_papers_flops():
    """Once configs/exp/ holds the paper's runs: their FLOPs equal Tab. flops_detailed."""
    exps = paper_tables.load_experiments(ROOT / "configs" / "exp")
    checked = 0
    for exp in exps.values():
        for e in exp.entries:
            ffn = exp.cfg.get("ffn") or {}
            if e.get("table") == "moe":  # Tab. moe's "% FLOPs": 25% small, 12.5% big, dense 100%
                want = "100.0%" if e["row"] == "Dense" else \
                    "12.5%" if e["column"].endswith("-B") else "25.0%"
                assert paper_tables.format_percent(config_relative_flops(exp.cfg)) == want, e
            key = (ffn.get("expert_size"), ffn.get("k"))
            if e.get("table") != "ablation" or e.get("column") not in PAPER_COLUMNS \
                    or key not in PAPER_FLOPS:
                continue
            want = PAPER_FLOPS[key][list(PAPER_COLUMNS).index(e["column"])]
            got = paper_tables.format_percent(config_relative_flops(exp.cfg))
            assert got == want, (exp.stem, e)
            checked += 1
    if not checked:
        pytest.skip("no ablation experiments in configs/exp yet")


def test_topk_keeps_the_dense_flops():
    """Mutant `("dense", "topk")` -> `("dense",)`: a top-k config gets no FLOPs (None)."""
    assert config_relative_flops({"ffn": {"kind": "topk", "k": 128, "d_ff": 2053}}) == 1.0
    assert config_relative_flops({"ffn": {"kind": "dense", "d_ff": 2053}}) == 1.0


def test_moe_flops_need_no_d_model():
    """The ratio is the same for any d_model, selector included; an unresolved one
    (`${model.d_model}`) printed "—" in the selector column."""
    ffn = {"kind": "sigma_moe", "n_experts": 16, "expert_size": 128, "k": 4}
    assert config_relative_flops({"ffn": ffn}) == 0.25
    with_sel = (2 * 4 * 128 + 16) / (2 * 16 * 128)
    for d in ("${model.d_model}", 412, 1024):
        cfg = {"ffn": {**ffn, "d_model": d}}
        assert config_relative_flops(cfg, include_selector=True) == pytest.approx(with_sel)
