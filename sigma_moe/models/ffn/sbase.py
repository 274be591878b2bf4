"""S-BASE: BASE layers with Sinkhorn routing (paper Sec. 5 `sec:moe_variants`, Eqs.
sigmoid-assignment; Clark et al. 2022), extended to top-K as in Tab. `ablation_existing`.

    training:   z = Sinkhorn_n(W3 x over the tokens of each sequence),  E_x = argtopk(z, K)
    evaluation: E_x = argtopk(W3 x, K)
    always:     y = sum_{e in E_x} sigmoid(W3 x)[e] W2^e relu(W1^e x)            (Eq. moe_out)

Sinkhorn runs in log space over each sequence's [T, N_E] logits, alternating "each token
spreads one unit over the experts" and "each expert receives the same total"; ending on
the expert step, which is the one that reorders a token's experts. It only chooses the
experts: no gradient flows through it. Like sigma-MoE it adds the batch-entropy
regularizer (Eq. our_reg, on the raw logits) and supports expert dropout (Eq.
expert_drop; the paper's S-BASE rows use none). The token step first and the regularizer
on the raw logits are those of the authors' `sinkmoid2` selection, the one their S-BASE
sweeps run (their older `sinkmoid` starts with the expert step and regularizes the
balanced scores).

The per-sequence grouping needs the batch shape, which `ExpertsFFN.forward` flattens away:
`forward` records it (`self._n_seq`) before delegating, and `select` regroups the logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sigma_moe.framework.config import ConfigError, check_probability
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.base import entropy_regularizer
from sigma_moe.models.ffn.experts import ExpertsConfig, ExpertsFFN
from sigma_moe.models.ffn.sigma_moe import expert_dropout_mask


@dataclass(frozen=True)
class SBaseConfig(ExpertsConfig):
    sinkhorn_iters: int = 3  # log-space Sinkhorn iterations per sequence (training only)
    expert_dropout: float = 0.0  # delta, as sigma-MoE; applied to the balanced scores
    reg_gamma: float = 1e-3  # gamma of the entropy regularizer; 0 switches it off

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sinkhorn_iters < 1:
            raise ConfigError(
                f"ffn.sinkhorn_iters must be >= 1, got {self.sinkhorn_iters} "
                f"(for unbalanced sigmoid top-K use kind: sigma_moe)"
            )
        check_probability("ffn.expert_dropout", self.expert_dropout)


@torch.no_grad()
def sinkhorn_log(logits_BTE: torch.Tensor, n_iters: int) -> torch.Tensor:
    """Log-space Sinkhorn over dims (T, E) of each sequence; returns balanced log scores."""
    z_BTE = logits_BTE.float()
    for _ in range(n_iters):
        z_BTE = z_BTE - z_BTE.logsumexp(dim=-1, keepdim=True)  # rows: one unit per token
        z_BTE = z_BTE - z_BTE.logsumexp(dim=-2, keepdim=True)  # columns: equal per expert
    return z_BTE


@FFNS.register("sbase")
class SBaseMoE(ExpertsFFN):
    Config = SBaseConfig
    cfg: SBaseConfig
    _n_seq = 1  # sequences in the current forward's tokens; set by `forward`

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # [B, T, D] -> B sequences; a bare [T, D] is one sequence.
        self._n_seq = x_BTD.shape[0] if x_BTD.dim() == 3 else 1
        return super().forward(x_BTD)

    def select(self, logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        if self.training and cfg.reg_gamma > 0:
            self.add_loss(cfg.reg_gamma * entropy_regularizer(logits_TE))
        if self.training:
            z_BTE = sinkhorn_log(logits_TE.view(self._n_seq, -1, cfg.n_experts), cfg.sinkhorn_iters)
            rank_TE = z_BTE.view_as(logits_TE)
        else:
            rank_TE = logits_TE.detach()
        keep_TE = expert_dropout_mask(logits_TE, cfg.expert_dropout, self.training)
        if keep_TE is not None:
            rank_TE = rank_TE.masked_fill(~keep_TE, float("-inf"))
        expert_TK = self.topk(rank_TE)[1]
        gate_TK = torch.sigmoid(logits_TE.gather(-1, expert_TK))
        if keep_TE is not None:
            # a row with fewer than K kept experts still picks dropped ones: weight 0
            gate_TK = gate_TK * keep_TE.gather(-1, expert_TK)
        return expert_TK, gate_TK
