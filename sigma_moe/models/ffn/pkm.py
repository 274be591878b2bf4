"""Product-key memory, PKM (paper Sec. 3.2 `sec:pkm`, App. `app:pkm`, Tabs. pkm, pkm_details).

Per head h, with x = x_a | x_b the LN output split in halves (no query projection, no
batch norm) and n = n_subkeys sub-keys per half:

    u_a = K_a^h x_a,  u_b = K_b^h x_b                         (n scores each)
    u^h[i * n + j] = u_a[i] + u_b[j]                          (n^2 values)
    E^h = argtopk(u^h, k)  -- found exactly from the k^2 sums of top-k(u_a) x top-k(u_b)
    y = sum_h sum_{v in E^h} act(s)[h, v] * V[v],   s = [u^h[E^h]]_h   ([tokens, heads*k])

act (ReLU or softmax) acts jointly on all heads' selected scores. The top-k search runs
without gradient; the chosen scores are recomputed from the gathered sub-key scores so
the keys get gradients. Values are an embedding bag of n^2 rows (F.embedding_bag).

When k >= n_subkeys (every row of the paper: 46..89 sub-keys, k=128) the top-k of each
half is the whole half. The authors' code then skips top-k entirely: it scores all n^2
values, *summing* the heads' tables, and applies act over those n^2 scores
(`dense_when_k_covers: true`). The default follows docs/REFERENCE.md instead: the per-half
top-k is clamped to n and the top-min(k, n^2) sums are kept per head.
No dropout inside the layer (App. `sec:hyperparams`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.base import FFN


@dataclass(frozen=True)
class PKMConfig:
    d_model: int
    n_layers: int
    n_subkeys: int  # n per half; n^2 values. Value-matched 46 (WT-S, E8) / 64 (WT-B),
    #                 parameter-matched 62 (WT-S, E8) / 89 (WT-B)
    heads: int = 4
    k: int = 128  # top-k of each half's sub-key scores, then of the k*k sums, per head
    activation: Literal["relu", "softmax"] = "relu"  # softmax: the original PKM
    value_init: Literal["default", "dense"] = "default"  # dense: the "+init" row
    dense_when_k_covers: bool = False  # True: k >= n_subkeys scores all n^2 values, no top-k

    def __post_init__(self) -> None:
        if self.d_model % 2:
            raise ConfigError(
                f"ffn.d_model={self.d_model} is odd: PKM splits the query into two halves; "
                f"use an even model.d_model"
            )
        for name in ("n_subkeys", "heads", "k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ffn.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def n_values(self) -> int:
        return self.n_subkeys**2

    @property
    def dense(self) -> bool:
        return self.dense_when_k_covers and self.k >= self.n_subkeys


@FFNS.register("pkm")
class PKM(FFN):
    Config = PKMConfig

    def __init__(self, cfg: PKMConfig):
        super().__init__()
        self.cfg = cfg
        H, n, C = cfg.heads, cfg.n_subkeys, cfg.d_model // 2
        self.subkeys_H2NC = nn.Parameter(torch.empty(H, 2, n, C))  # [:, 0] for x_a, [:, 1] x_b
        self.values_VD = nn.Parameter(torch.empty(cfg.n_values, cfg.d_model))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal init (as the authors' code): keys as the dense W1, so u_a + u_b has the
        variance of one dense key's score (fan-in d_model); values std from d_model, or
        with value_init=dense from n^2 as a dense W2 of width n^2 ("+init")."""
        cfg = self.cfg
        gain = math.sqrt(2 / cfg.n_layers)
        self.subkeys_H2NC.normal_(0, gain / math.sqrt(cfg.d_model))
        fan = cfg.d_model if cfg.value_init == "default" else cfg.n_values
        self.values_VD.normal_(0, gain / math.sqrt(fan))

    def subkey_scores(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u_a, u_b: [tokens, heads, n_subkeys], with gradient."""
        xa_TC, xb_TC = x_TD.chunk(2, dim=-1)
        ua_THN = torch.einsum("tc,hnc->thn", xa_TC, self.subkeys_H2NC[:, 0])
        ub_THN = torch.einsum("tc,hnc->thn", xb_TC, self.subkeys_H2NC[:, 1])
        return ua_THN, ub_THN

    def select(
        self, ua_THN: torch.Tensor, ub_THN: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per head, the top-k values of the n^2 table -> (value ids, scores), [T, H*k].

        The k^2 candidate sums take T*H*k^2 floats (256 KiB per token at k=128, H=4)."""
        n = self.cfg.n_subkeys
        k_half = min(self.cfg.k, n)
        k_out = min(self.cfg.k, k_half**2)
        with torch.no_grad():  # the search; the k^2 sums contain the table's top k
            va_THK, ia_THK = ua_THN.topk(k_half, dim=-1)
            vb_THK, ib_THK = ub_THN.topk(k_half, dim=-1)
            sums_THKK = va_THK[..., :, None] + vb_THK[..., None, :]
            pos_THM = sums_THKK.flatten(-2).topk(k_out, dim=-1).indices
            ia_THM = ia_THK.gather(-1, pos_THM // k_half)
            ib_THM = ib_THK.gather(-1, pos_THM % k_half)
        score_THM = ua_THN.gather(-1, ia_THM) + ub_THN.gather(-1, ib_THM)  # with gradient
        value_THM = ia_THM * n + ib_THM
        return value_THM.flatten(1), score_THM.flatten(1)

    def activation(self, s: torch.Tensor) -> torch.Tensor:
        return F.relu(s) if self.cfg.activation == "relu" else torch.softmax(s, dim=-1)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_TD = x_BTD.reshape(-1, x_BTD.shape[-1])
        ua_THN, ub_THN = self.subkey_scores(x_TD)
        if self.cfg.dense:
            # Heads summed before the outer sum: sum_h (a_h[i] + b_h[j]) = A[i] + B[j].
            u_TV = (ua_THN.sum(1)[:, :, None] + ub_THN.sum(1)[:, None, :]).flatten(1)
            a_TV = self.activation(u_TV)
            self.stats.record_active(a_TV)
            y_TD = a_TV @ self.values_VD.to(a_TV.dtype)
        else:
            value_TM, score_TM = self.select(ua_THN, ub_THN)
            a_TM = self.activation(score_TM).to(self.values_VD.dtype)
            if self.stats.enabled:  # the [tokens, n^2] activation only when measuring
                a_TV = a_TM.new_zeros(a_TM.shape[0], self.cfg.n_values)
                self.stats.record_active(a_TV.scatter_add_(1, value_TM, a_TM))
            y_TD = F.embedding_bag(value_TM, self.values_VD, per_sample_weights=a_TM, mode="sum")
        return y_TD.to(x_BTD.dtype).view_as(x_BTD)
