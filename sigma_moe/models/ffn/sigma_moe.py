"""sigma-MoE (paper Sec. 4): sigmoid selection, expert dropout, batch-entropy regularizer.

    s = sigmoid(W3 x) * m    (m ~ Bernoulli(1 - delta) per expert in training, Eq. expert_drop)
    E_x = argtopk(s, K),  y = sum_{e in E_x} s[e] W2^e relu(W1^e x)          (Eq. moe_out)
    loss += gamma * sum_e p[e] log p[e],  p = mean_batch softmax(W3 x)      (Eq. our_reg)

The ablations of Tab. `ablation_detailed` are config values: `selection` softmax (before
top-K, not renormalised) or softmax_renorm (top-K on logits, softmax over the K), expert
dropout vs `hidden_dropout`, gamma = 0, and `init: standard`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from sigma_moe.framework.config import check_probability
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.base import entropy_regularizer
from sigma_moe.models.ffn.experts import ExpertsConfig, ExpertsFFN


@dataclass(frozen=True)
class SigmaMoEConfig(ExpertsConfig):
    selection: Literal["sigmoid", "softmax", "softmax_renorm"] = "sigmoid"
    expert_dropout: float = 0.0  # delta: drop whole experts before top-K, no rescaling
    reg_gamma: float = 1e-3  # gamma of the entropy regularizer; 0 switches it off

    def __post_init__(self) -> None:
        super().__post_init__()
        check_probability("ffn.expert_dropout", self.expert_dropout)


def expert_dropout_mask(logits_TE: torch.Tensor, p: float, training: bool) -> torch.Tensor | None:
    """Boolean keep-mask [T, E] of Eq. `expert_drop`, or None when nothing is dropped."""
    if not training or p == 0:
        return None
    return torch.rand_like(logits_TE) >= p


@FFNS.register("sigma_moe")
class SigmaMoE(ExpertsFFN):
    Config = SigmaMoEConfig
    cfg: SigmaMoEConfig

    def select(self, logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        if self.training and cfg.reg_gamma > 0:
            self.add_loss(cfg.reg_gamma * entropy_regularizer(logits_TE))
        keep_TE = expert_dropout_mask(logits_TE, cfg.expert_dropout, self.training)
        if cfg.selection == "softmax_renorm":
            if keep_TE is not None:
                # finite, so a row with fewer than K kept experts still gives weights (~0)
                logits_TE = logits_TE.masked_fill(~keep_TE, torch.finfo(logits_TE.dtype).min)
            top_TK, expert_TK = self.topk(logits_TE)
            gate_TK = torch.softmax(top_TK, dim=-1)
            if keep_TE is not None:  # a token with no kept expert would get 1/K each
                gate_TK = gate_TK * keep_TE.gather(-1, expert_TK)
            return expert_TK, gate_TK
        act = torch.sigmoid if cfg.selection == "sigmoid" else lambda z: torch.softmax(z, -1)
        s_TE = act(logits_TE)
        if keep_TE is not None:
            s_TE = s_TE * keep_TE
        gate_TK, expert_TK = self.topk(s_TE)
        return expert_TK, gate_TK
