"""Dense 2-layer MLP, the baseline that every variant approximates (paper Eqs. upproj-downproj).

    u = relu(W1 x),  y = W2 dropout(u)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sigma_moe.framework.config import ConfigError, check_probability
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.base import FFN, trunc_normal_


@dataclass(frozen=True)
class DenseConfig:
    d_model: int
    n_layers: int
    d_ff: int
    dropout: float = 0.0  # on the hidden layer u (docs/REFERENCE.md, "Dropout")

    def __post_init__(self) -> None:
        if self.d_ff <= 0:
            raise ConfigError(f"ffn.d_ff must be positive, got {self.d_ff}")
        check_probability("ffn.dropout", self.dropout)


@FFNS.register("dense")
class DenseFFN(FFN):
    Config = DenseConfig

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        self.cfg = cfg
        # The dense baseline keeps biases (initialised to 0); MoE layers have none.
        self.w1 = torch.nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = torch.nn.Linear(cfg.d_ff, cfg.d_model)
        for lin in (self.w1, self.w2):
            trunc_normal_(lin.weight, math.sqrt(2 / (cfg.n_layers * lin.in_features)))
            torch.nn.init.zeros_(lin.bias)

    def hidden(self, x_TD: torch.Tensor) -> torch.Tensor:
        return F.relu(self.w1(x_TD))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        u_BTF = self.hidden(x_BTD)
        self.stats.record_active(u_BTF.reshape(-1, u_BTF.shape[-1]))
        return self.w2(F.dropout(u_BTF, self.cfg.dropout, self.training))
