"""Experiment files and tables for the tests of scripts/paper_tables.py and its FLOPs
table: write an exp file, read a rendered Markdown table, the grid of Tab. flops_detailed."""
from __future__ import annotations

import json
from pathlib import Path

# Paper Tab. flops_detailed: (G, K) of each row -> % per column ("-": not run). (G, K) fixes
# the value, as every row keeps N_E * G of its column (the "N_E' = 2 N_E, G=64" row too).
PAPER_FLOPS = {
    (128, 4): ("25.0%", "3.1%", "12.5%", "25.0%"),
    (64, 8): ("25.0%", "3.1%", "12.5%", "25.0%"),
    (256, 2): ("25.0%", "3.1%", "12.5%", "25.0%"),
    (512, 1): ("25.0%", "3.1%", "12.5%", "25.0%"),
    (64, 4): ("12.5%", "1.6%", "-", "12.5%"),
    (128, 1): ("6.2%", "0.8%", "-", "6.2%"),
    (128, 2): ("12.5%", "1.6%", "-", "12.5%"),
    (128, 8): ("50.0%", "6.2%", "-", "50.0%"),
}
# column -> (d_model, N_E * G of its parameter-matched sigma-MoE) (paper Tab. moe_hyper)
PAPER_COLUMNS = {"WT-S": (412, 2048), "WT-S*": (412, 16384), "WT-B": (1024, 4096),
                 "E8": (512, 2048)}


def write_exp(exp_dir: Path, stem: str, ffn: str, ffn_cfg: dict, entries: list[dict],
              dataset: str = "enwik_mini", params_m=None, model: dict | None = None) -> None:
    exp_dir.mkdir(parents=True, exist_ok=True)
    body = {"defaults": [{"override /dataset": dataset}, {"override /ffn": ffn}],
            "name": stem, "ffn": ffn_cfg, "paper": {"params_m": params_m, "entries": entries}}
    if model:
        body["model"] = model
    (exp_dir / f"{stem}.yaml").write_text("# @package _global_\n" + json.dumps(body))


def table_lines(text: str, title_start: str) -> list[str]:
    block = text.split("### ")
    body = next(b for b in block if b.startswith(title_start))
    return body.splitlines()


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def paper_grid(exp_dir: Path) -> None:
    """Every (row, column) of Tab. flops_detailed as an experiment file."""
    for (g, k), values in PAPER_FLOPS.items():
        for col, value in zip(PAPER_COLUMNS, values):
            if value == "-":
                continue
            d_model, total = PAPER_COLUMNS[col]
            n_e = total // g
            stem = f"g{g}_k{k}_{col.replace('*', 'x').replace('-', '_')}"
            write_exp(exp_dir, stem, "sigma_moe", {"n_experts": n_e, "expert_size": g, "k": k},
                      model={"d_model": d_model},
                      entries=[{"table": "ablation", "row": f"G={g}, K={k}", "column": col,
                                "value": None}])
