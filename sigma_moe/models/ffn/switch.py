"""Switch Transformer MoE (paper Sec. 5 `sec:moe_variants`, Eq. `switchreg`; Fedus et al. 2022).

    p = softmax(W3 x),  E_x = argtopk(p, K),  y = sum_{e in E_x} p[e] W2^e relu(W1^e x)
    loss += coef * N_E * f . P,   f[e] = mean_batch 1{e in E_x},  P[e] = mean_batch p[e]

Top-1 in the paper's Switch rows (G=512, N_E/4 experts); K is free for the "K=4" row. The
gate is the softmax probability itself (top-K after softmax, no renormalisation).
Capacity factor (off by default, as in the paper's runs): in training, each expert takes
at most ceil(cf * T * K / N_E) of the layer's T tokens, first come first served in token
order; the overflow keeps its slot with gate 0 (the token's residual passes unchanged).
The "with dropout" rows use `hidden_dropout` (dropout on the expert hidden units).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.distributed import global_mean
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.experts import ExpertsConfig, ExpertsFFN, equal_norm_rows_


@dataclass(frozen=True)
class SwitchConfig(ExpertsConfig):
    init: Literal["sigma_moe", "standard"] = "standard"  # Switch: W2 std from G
    balance_coef: float = 0.01  # coefficient of N_E * f . P (paper: 0.01)
    capacity_factor: float = 0.0  # mu; 0 = no capacity limit, no token dropping
    init_scale: float = 0.1  # Switch's variance scale s: std = sqrt(s * 2/L / fan_in)
    selector_init: Literal["normal", "equal_norm"] = "normal"  # equal_norm: sigma-MoE's rows

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.balance_coef < 0:
            raise ConfigError(f"ffn.balance_coef must be >= 0, got {self.balance_coef}")
        if self.capacity_factor < 0:
            raise ConfigError(
                f"ffn.capacity_factor must be >= 0 (0 = off), got {self.capacity_factor}"
            )
        if self.init_scale <= 0:
            raise ConfigError(f"ffn.init_scale must be positive, got {self.init_scale}")


def balancing_loss(p_TE: torch.Tensor, expert_TK: torch.Tensor) -> torch.Tensor:
    """N_E * f . P of Eq. `switchreg`, f and P averaged over all data-parallel workers.

    f[e] is the fraction of tokens that chose e (so sum_e f = K); no gradient flows
    through f, only through the mean router probability P.
    """
    n_experts = p_TE.shape[-1]
    f_E = F.one_hot(expert_TK, n_experts).sum(1).to(p_TE.dtype).mean(0)
    P_E = p_TE.mean(0)
    return n_experts * (global_mean(f_E.detach()) * global_mean(P_E)).sum()


def within_capacity(expert_TK: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """Bool [T, K]: the (token, slot) is among the first `capacity` in its expert's queue,
    the queue ordered by token index (then slot)."""
    onehot_ME = F.one_hot(expert_TK.reshape(-1), n_experts)
    position_M = (onehot_ME.cumsum(0) * onehot_ME).sum(-1) - 1
    return (position_M < capacity).view_as(expert_TK)


@FFNS.register("switch")
class SwitchMoE(ExpertsFFN):
    Config = SwitchConfig
    cfg: SwitchConfig

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Switch init (Fedus et al.: std sqrt(s / fan_in), s = 0.1), applied as the authors'
        reimplementation does: on top of the pre-LN depth gain 2/L, plain normal (not
        truncated, like the sigma-MoE experts), W2's fan-in G (`init: standard`) or N_E * G
        (`init: sigma_moe`), and a plain normal selector (`selector_init: normal`) or
        sigma-MoE's equal-norm rows (`equal_norm`, the authors' C4-B/peS2o-B sweeps)."""
        cfg = self.cfg
        gain = math.sqrt(cfg.init_scale * 2 / cfg.n_layers)
        std1 = gain / math.sqrt(cfg.d_model)
        fan2 = cfg.d_ff if cfg.init == "sigma_moe" else cfg.expert_size
        self.w1_EDG.normal_(0, std1)
        self.w2_EGD.normal_(0, gain / math.sqrt(fan2))
        if cfg.selector_init == "equal_norm":
            equal_norm_rows_(self.w3_ED, std1)
        else:
            self.w3_ED.normal_(0, std1)

    def select(self, logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        p_TE = torch.softmax(logits_TE, dim=-1)
        gate_TK, expert_TK = self.topk(p_TE)
        if self.training and cfg.balance_coef > 0:
            self.add_loss(cfg.balance_coef * balancing_loss(p_TE, expert_TK))
        if self.training and cfg.capacity_factor > 0:
            T = expert_TK.shape[0]
            capacity = math.ceil(cfg.capacity_factor * T * cfg.k / cfg.n_experts)
            gate_TK = gate_TK * within_capacity(expert_TK, cfg.n_experts, capacity)
        return expert_TK, gate_TK
