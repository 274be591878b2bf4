"""FLOPs per token of a feedforward block (paper App. "More on Resource Efficiency",
Tab. flops_detailed; Sec. 5 "Main results", column "% FLOPs" of Tab. moe).

The paper compares an MoE's feedforward block with "its dense counterpart": the dense MLP
with the same number of (key/value) parameters, d_ff = N_E * G. Both are two matrix
products; a token's MoE output uses only K experts of G units each, so the ratio is
K * G / (N_E * G) = K / N_E, and the FLOPs of the expert-selection projection W3
(d_model x N_E) are left out ("negligible within the range of N_E used here"). The same
ratio holds for the activation memory, so it is not computed separately.

Against the *actual* dense baselines (d_ff 2053, not 2048 = 16 x 128) the ratio is
slightly lower (512 / 2053 = 24.9%); the paper's table reports K / N_E (25.0%), which is
`relative_ffn_flops(moe_cfg)` with the default counterpart.

Counts are multiply-accumulates x 2; the non-matmul work (activation, top-k) is left out.
"""
from __future__ import annotations

from typing import Any

from sigma_moe.models.ffn.dense import DenseConfig
from sigma_moe.models.ffn.experts import ExpertsConfig
from sigma_moe.models.ffn.pkm import PKMConfig
from sigma_moe.models.ffn.sbase import SBaseConfig
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig
from sigma_moe.models.ffn.switch import SwitchConfig
from sigma_moe.models.ffn.topk import TopKConfig

FLOPS_PER_MAC = 2


def _experts_macs(cfg: ExpertsConfig, include_selection: bool) -> int:
    """K experts of G units (two matrices each), and the selector W3 when asked."""
    D = cfg.d_model
    return 2 * D * cfg.k * cfg.expert_size + (D * cfg.n_experts if include_selection else 0)


def _pkm_macs(cfg: PKMConfig, include_selection: bool) -> int:
    """Per head: both halves' sub-key scores (2 x n_subkeys x D/2); then the weighted sum of
    the k selected values per head (k x D), or, when all n^2 values are scored (cfg.dense),
    one product with the whole value table (n^2 x D)."""
    D = cfg.d_model
    values = cfg.n_values if cfg.dense else cfg.heads * cfg.k
    return cfg.heads * cfg.n_subkeys * D + values * D


# by exact type: a subclass (a new variant built on one of these) may compute differently
# (a GLU expert has three matrices), so it needs a formula of its own here
_MACS = {
    DenseConfig: lambda c, _: 2 * c.d_model * c.d_ff,
    TopKConfig: lambda c, _: c.d_model * c.d_ff + c.k * c.d_model,  # only K rows of W2 used
    PKMConfig: _pkm_macs,
    ExpertsConfig: _experts_macs,  # the generic MoE of scripts/flops_table.py
    SigmaMoEConfig: _experts_macs,
    SwitchConfig: _experts_macs,
    SBaseConfig: _experts_macs,
}


def has_flops_formula(cfg: Any) -> bool:
    return type(cfg) in _MACS


def ffn_flops(cfg: Any, include_selection: bool = False) -> int:
    """FLOPs of one token's forward pass through the FFN block described by `cfg` (the
    variant's Config dataclass). `include_selection` adds the MoE selector W3 (x N_E)."""
    if not has_flops_formula(cfg):
        raise TypeError(f"no FLOPs formula for {type(cfg).__name__}: add one to "
                        f"sigma_moe/models/flops.py (_MACS)")
    return FLOPS_PER_MAC * _MACS[type(cfg)](cfg, include_selection)


def dense_counterpart(cfg: ExpertsConfig) -> DenseConfig:
    """The parameter-equal dense MLP of an MoE (d_ff = N_E * G), as Tab. flops_detailed."""
    return DenseConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_ff=cfg.d_ff)


def relative_ffn_flops(moe_cfg: ExpertsConfig, dense_cfg: DenseConfig | None = None,
                       include_selection: bool = False) -> float:
    """FLOPs of `moe_cfg`'s FFN block / those of `dense_cfg` (default: its dense counterpart
    with d_ff = N_E * G, giving the paper's K / N_E); `include_selection` as `ffn_flops`."""
    dense_cfg = dense_counterpart(moe_cfg) if dense_cfg is None else dense_cfg
    return ffn_flops(moe_cfg, include_selection) / ffn_flops(dense_cfg)
