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

from models.ffn.dense import DenseConfig
from models.ffn.experts import ExpertsConfig
from models.ffn.pkm import PKMConfig
from models.ffn.topk import TopKConfig

FLOPS_PER_MAC = 2


def ffn_flops(cfg: Any, include_selection: bool = False) -> int:
    """FLOPs of one token's forward pass through the FFN block described by `cfg` (the
    variant's Config dataclass). `include_selection` adds the MoE selector W3 (x N_E)."""
    D = cfg.d_model
    if isinstance(cfg, ExpertsConfig):  # sigma_moe, switch, sbase: K experts of G units
        macs = 2 * D * cfg.k * cfg.expert_size
        if include_selection:
            macs += D * cfg.n_experts
    elif isinstance(cfg, TopKConfig):  # full up-projection, only K rows of W2 are used
        macs = D * cfg.d_ff + cfg.k * D
    elif isinstance(cfg, DenseConfig):
        macs = 2 * D * cfg.d_ff
    elif isinstance(cfg, PKMConfig):
        # per head: both halves' sub-key scores (2 x n_subkeys x D/2); then the weighted sum
        # of the k selected values per head (k x D), or, when all n^2 values are scored
        # (cfg.dense), one product with the whole value table (n^2 x D)
        macs = cfg.heads * cfg.n_subkeys * D
        macs += cfg.n_values * D if cfg.dense else cfg.heads * cfg.k * D
    else:
        raise TypeError(f"no FLOPs formula for {type(cfg).__name__}")
    return FLOPS_PER_MAC * macs


def dense_counterpart(cfg: ExpertsConfig) -> DenseConfig:
    """The parameter-equal dense MLP of an MoE (d_ff = N_E * G), as Tab. flops_detailed."""
    return DenseConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_ff=cfg.d_ff)


def relative_ffn_flops(moe_cfg: ExpertsConfig, dense_cfg: DenseConfig | None = None,
                       include_selection: bool = False) -> float:
    """FLOPs of `moe_cfg`'s FFN block / those of `dense_cfg` (default: its dense counterpart
    with d_ff = N_E * G, giving the paper's K / N_E); `include_selection` as `ffn_flops`."""
    dense_cfg = dense_counterpart(moe_cfg) if dense_cfg is None else dense_cfg
    return ffn_flops(moe_cfg, include_selection) / ffn_flops(dense_cfg)
