"""Relative FLOPs and activation memory of the feedforward block (paper App. "More on
Resource Efficiency", Tab. `flops_detailed`; the "% FLOPs" column of Tab. `moe`).

Per token, a dense 2-layer MLP of width d_ff costs 2 * d_model * d_ff multiply-adds (W1, W2)
and keeps d_ff hidden activations. A MoE with N_E experts of size G, K of them active,
costs 2 * d_model * K * G and keeps K * G activations, plus N_E * d_model multiply-adds for
the selector W3. The paper compares each MoE with the parameter-equal dense block
(d_ff = N_E * G, the selector is not counted: "FLOPs here do not take into account the
linear projection used to select the experts"), so the factor is K * G / (N_E * G) = K / N_E
for both FLOPs and memory: 4/16 = 25.0%, 4/128 = 3.1%, 4/32 = 12.5%, ...

The arithmetic lives in sigma_moe/models/flops.py; this module applies it to raw (uncomposed) exp
configs. `include_selector=True` adds the selector's N_E * d_model to the MoE's cost (an extra our
tables can show; it is not what the paper reports).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sigma_moe.models.ffn.experts import ExpertsConfig  # noqa: E402
from sigma_moe.models.flops import relative_ffn_flops  # noqa: E402

MOE_KINDS = ("sigma_moe", "switch", "sbase")


def config_relative_flops(cfg: dict[str, Any], include_selector: bool = False) -> float | None:
    """Relative FLOPs of a composed run config: 1.0 for dense / top-k, K / N_E for a MoE,
    None when the config does not say (PKM, or values missing)."""
    ffn = cfg.get("ffn") or {}
    kind = ffn.get("kind")
    if kind in ("dense", "topk"):
        return 1.0  # top-k keeps the dense matmuls (paper Sec. 3.1)
    if kind not in MOE_KINDS:
        return None
    try:
        n_e, g, k = (int(ffn[key]) for key in ("n_experts", "expert_size", "k"))
    except (KeyError, TypeError, ValueError):
        return None
    # every term of the ratio is linear in d_model, selector included: (2 d K G + d N_E) /
    # (2 d N_E G), so it needs none (an exp file's `${model.d_model}` is not resolved here)
    moe = ExpertsConfig(d_model=1, n_layers=1, n_experts=n_e, expert_size=g, k=k)
    return relative_ffn_flops(moe, include_selection=include_selector)


def format_percent(x: float | None) -> str:
    """The paper's format: one decimal, ties to even (6.25% -> 6.2%, as in the paper)."""
    return "—" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":  # a library without a CLI: say which script prints the table
    sys.exit("error: scripts/flops_table.py is a library; print the FLOPs table with "
             "`python scripts/paper_tables.py --table flops`")
