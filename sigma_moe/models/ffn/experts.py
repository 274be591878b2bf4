"""Shared machinery of every MoE variant (paper Sec. 3.3, Eq. `moe_out`).

    s = sel(x),  E_x = argtopk(s, K),  y = sum_{e in E_x} s[e] W2^e relu(W1^e x)

Variants differ only in `select` (scores -> chosen experts and their weights) and the
regularizer they add; the expert computation is one call to `kernels.moe_mlp`.
Parameters: w1_EDG [N_E, d_model, G] (keys), w2_EGD [N_E, G, d_model] (values),
w3_ED [N_E, d_model] (selector). No biases, no weight decay (docs/REFERENCE.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn

from sigma_moe import kernels
from sigma_moe.framework.config import ConfigError, check_probability
from sigma_moe.kernels import BACKENDS, moe_mlp, selection_backend, selector_logits, topk
from sigma_moe.models.ffn.base import FFN


@dataclass(frozen=True)
class ExpertsConfig:
    d_model: int
    n_layers: int
    n_experts: int  # N_E
    expert_size: int  # G
    k: int  # experts per token
    hidden_dropout: float = 0.0  # ordinary dropout on expert hidden units ("standard dropout")
    init: Literal["sigma_moe", "standard"] = "sigma_moe"  # W2 std from N_E*G, or from G
    backend: str = "auto"  # kernels.moe_mlp: auto|triton|triton_unfused|grouped_mm|torch|reference
    n_chunks: int | None = None  # kernels.moe_mlp's token chunks; None: the backend's choice
    d_ff: int = 0  # total expert width N_E * G; 0 = derived, else checked against N_E * G

    def __post_init__(self) -> None:
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", self.n_experts * self.expert_size)
        elif self.d_ff != self.n_experts * self.expert_size:
            raise ConfigError(
                f"ffn.d_ff={self.d_ff} != ffn.n_experts * ffn.expert_size = "
                f"{self.n_experts} * {self.expert_size} = {self.n_experts * self.expert_size}: "
                f"change one of them (d_ff = N_E * G, paper Sec. 3.3)"
            )
        if not 1 <= self.k <= self.n_experts:
            raise ConfigError(
                f"ffn.k={self.k} must be between 1 and ffn.n_experts={self.n_experts}: "
                f"lower ffn.k or raise ffn.n_experts"
            )
        check_probability("ffn.hidden_dropout", self.hidden_dropout)
        if self.expert_size <= 0:
            raise ConfigError(f"ffn.expert_size must be positive, got {self.expert_size}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"ffn.backend={self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.n_chunks is not None and self.n_chunks < 1:
            raise ConfigError(f"ffn.n_chunks={self.n_chunks} must be at least 1, or null (the "
                              "backend's choice)")

    def precompile(self, tokens: int, device, dtype: torch.dtype):
        """kernels.precompile_moe at this layer's shapes, dropout and backend, for `tokens`
        tokens a step: its Triton kernels compiled ahead. -> what it did (a Precompiled:
        its line, whether it failed); None: no Triton kernel would run."""
        return kernels.precompile_moe(tokens, self.d_model, self.n_experts, self.expert_size,
                                      self.k, self.hidden_dropout, self.backend,
                                      device=device, dtype=dtype, n_chunks=self.n_chunks)


@torch.no_grad()
def equal_norm_rows_(w_ED: torch.Tensor, std: float) -> torch.Tensor:
    """Selector init: normal rows rescaled to equal norm (so only the angle to x decides a
    token's initial scores), the whole matrix then scaled to `std`."""
    w_ED.normal_()
    w_ED.div_(w_ED.norm(dim=-1, keepdim=True))
    return w_ED.mul_(std / w_ED.std())


class ExpertsFFN(FFN):
    """Owns the expert weights and the expert computation; subclasses implement `select`."""

    no_weight_decay = True  # MoE layers are never decayed (docs/REFERENCE.md)

    def __init__(self, cfg: ExpertsConfig):
        super().__init__()
        self.cfg = cfg
        E, D, G = cfg.n_experts, cfg.d_model, cfg.expert_size
        self.w1_EDG = nn.Parameter(torch.empty(E, D, G))
        self.w2_EGD = nn.Parameter(torch.empty(E, G, D))
        self.w3_ED = nn.Parameter(torch.empty(E, D))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """sigma-MoE init (Sec. 4): as if W1/W2 were one dense layer of width N_E * G."""
        cfg = self.cfg
        gain = math.sqrt(2 / cfg.n_layers)
        std1 = gain / math.sqrt(cfg.d_model)
        fan2 = cfg.d_ff if cfg.init == "sigma_moe" else cfg.expert_size
        self.w1_EDG.normal_(0, std1)
        self.w2_EGD.normal_(0, gain / math.sqrt(fan2))
        equal_norm_rows_(self.w3_ED, std1)

    def select(self, logits_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores -> (expert_TK int64, gate_TK); may call `self.add_loss`."""
        raise NotImplementedError  # abstract: every variant defines its selection

    def topk(self, s_TE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(values_TK, ids_TK) of the K largest scores: kernels.topk, whose Triton kernel
        runs on CUDA unless the plain paths were asked for."""
        return topk(s_TE, self.cfg.k, backend=selection_backend(self.cfg.backend))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_TD = x_BTD.reshape(-1, x_BTD.shape[-1])
        # x cast once for both uses; the backward adds the two x gradients in one product
        logits_TE, x_TD = selector_logits(x_TD, self.w3_ED, self.cfg.backend)
        # selection in fp32: under bf16 autocast the sigmoid's 8-bit mantissa ties distinct
        # scores (top-K then picks by expert id), rounds gates of logits above ~5.5 to 1 (no
        # gradient) and expert dropout's uniform draws drop more than delta; [T, E] is small
        expert_TK, gate_TK = self.select(logits_TE.float())
        self.stats.record_moe(expert_TK, gate_TK, self.cfg.n_experts)
        y_TD = moe_mlp(
            x_TD, expert_TK, gate_TK, self.w1_EDG, self.w2_EGD,
            hidden_dropout=self.cfg.hidden_dropout, training=self.training,
            backend=self.cfg.backend, n_chunks=self.cfg.n_chunks,
        )
        return y_TD.view_as(x_BTD)
