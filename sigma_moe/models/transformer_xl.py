"""Pre-LN Transformer-XL language model (paper Sec. 5 / App. B; docs/REFERENCE.md "Model").

    x = x + drop(attn(LN1(x), mem));  x = x + drop(ffn(LN2(x)))

Each layer keeps its *input* hidden states of the previous segment(s) as memory
(detached). The FFN block is any registered variant (sigma_moe/models/ffn), built from its own
frozen Config; the model collects the regularizers the FFNs report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigma_moe.framework.config import ConfigError, check_probability
from sigma_moe.models.attention import AttentionConfig, RelativeAttention
from sigma_moe.models.ffn import FFN, FFNS

Memory = list[torch.Tensor]  # per layer [B, M, d_model]


@dataclass(frozen=True)
class TransformerXLConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    dropout: float
    mem_len: int  # training memory (REFERENCE: one segment = the context length)
    eval_mem_len: int  # evaluation memory (paper: 4 x the context length)
    ffn_kind: str
    ffn: Any  # the FFN variant's own Config dataclass

    def __post_init__(self) -> None:
        if self.ffn_kind not in FFNS:
            FFNS.get(self.ffn_kind)  # raises with the known names
        for key in ("d_model", "n_layers", "n_heads", "head_dim"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.mem_len < 0 or self.eval_mem_len < 0:
            raise ConfigError("model.mem_len and model.eval_mem_len must be >= 0")
        check_probability("model.dropout", self.dropout)


class Block(nn.Module):
    def __init__(self, cfg: TransformerXLConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = RelativeAttention(
            AttentionConfig(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.n_layers)
        )
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn: FFN = FFNS.get(cfg.ffn_kind)(cfg.ffn)
        self.p = cfg.dropout

    def forward(self, x_BTD: torch.Tensor, mem_BMD: torch.Tensor | None) -> torch.Tensor:
        # Memory holds layer *inputs*, so it goes through the same pre-LN as x.
        mem_BMD = None if mem_BMD is None else self.ln1(mem_BMD.to(x_BTD.dtype))
        x_BTD = x_BTD + F.dropout(self.attn(self.ln1(x_BTD), mem_BMD), self.p, self.training)
        return x_BTD + F.dropout(self.ffn(self.ln2(x_BTD)), self.p, self.training)


class TransformerXL(nn.Module):
    def __init__(self, cfg: TransformerXLConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # as the authors' code (pre-LN: Xavier-uniform, no sqrt(d_model) scale; docs/REFERENCE.md
        # is silent): nn.Embedding's N(0, 1) would dwarf the layers' updates of the residual
        nn.init.xavier_uniform_(self.embedding.weight)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)  # untied, with bias

    def ffns(self) -> list[FFN]:
        return [b.ffn for b in self.blocks]

    def pop_loss(self) -> torch.Tensor | None:
        """Sum of the regularizers the FFN layers reported since the last call."""
        losses = [loss for f in self.ffns() if (loss := f.pop_loss()) is not None]
        return torch.stack([loss.float() for loss in losses]).sum() if losses else None

    def forward(
        self, tokens_BT: torch.Tensor, mems: Memory | None = None
    ) -> tuple[torch.Tensor, Memory]:
        mem_len = self.cfg.mem_len if self.training else self.cfg.eval_mem_len
        x_BTD = F.dropout(self.embedding(tokens_BT), self.cfg.dropout, self.training)
        new_mems: Memory = []
        for i, block in enumerate(self.blocks):
            mem = mems[i] if mems else None
            if mem_len > 0:  # the last mem_len positions of [memory ; segment]
                keep = mem_len - x_BTD.shape[1]  # of the old memory (none: no [B, L, D] copy)
                full = x_BTD if keep <= 0 or mem is None else torch.cat(
                    [mem[:, -keep:].to(x_BTD.dtype), x_BTD], 1)
                new_mems.append(full[:, -mem_len:].detach())
            x_BTD = block(x_BTD, mem if mem is None or mem.shape[1] else None)
        x_BTD = F.dropout(self.ln_f(x_BTD), self.cfg.dropout, self.training)
        return self.head(x_BTD), new_mems


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
