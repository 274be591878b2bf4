"""Top-K activation (paper Sec. 3.1 `sec:topk`, Eqs. argtopk_in_topk-topk_in_topk, Tab. `topk`).

    u = relu(W1 x + b1),  E_x = argtopk(u, K),  y = W2 (u masked to E_x) + b2

A dense FFN whose hidden vector keeps only its K largest entries, in training and
evaluation. Everything else (init, biases, dropout) is the dense baseline's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.dense import DenseConfig, DenseFFN


@dataclass(frozen=True)
class TopKConfig(DenseConfig):
    k: int = 128  # hidden channels kept per token; the paper sweeps 64, 128, 256, 512

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.k <= self.d_ff:
            raise ConfigError(
                f"ffn.k={self.k} must be between 1 and ffn.d_ff={self.d_ff}: "
                f"lower ffn.k (or use kind: dense for no top-K)"
            )


def keep_topk(u_TF: torch.Tensor, k: int) -> torch.Tensor:
    """Zero all but the k largest entries of the last dim; gradient flows to the kept ones."""
    val_TK, idx_TK = u_TF.topk(k, dim=-1, sorted=False)
    return torch.zeros_like(u_TF).scatter(-1, idx_TK, val_TK)


@FFNS.register("topk")
class TopKFFN(DenseFFN):
    Config = TopKConfig
    cfg: TopKConfig

    def hidden(self, x_TD: torch.Tensor) -> torch.Tensor:
        # The authors' code applies dropout *before* choosing the K winners, so K channels
        # survive in training too (dropping after top-K would leave ~(1-p)K). Identical in eval.
        u_TF = F.dropout(super().hidden(x_TD), self.cfg.dropout, self.training)
        return keep_topk(u_TF, self.cfg.k)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        u_BTF = self.hidden(x_BTD)  # dropout already applied inside, see `hidden`
        self.stats.record_active(u_BTF.reshape(-1, u_BTF.shape[-1]))
        return self.w2(u_BTF)
