"""The feedforward-block interface shared by every variant (paper Sec. 2-4).

A variant is an `FFN`: `forward(x_BTD) -> y_BTD`. Everything else the trainer needs flows
through two side channels that keep the trainer ignorant of the variant:

* `add_loss(t)`: a regularizer (already multiplied by its coefficient, e.g. the entropy
  term gamma * L of Eq. `our_reg`). The model sums `pop_loss()` over layers each step.
* `stats`: routing statistics (expert share, dead experts, usage entropy, co-occurrence for
  MoEs; active hidden channels for dense/top-k), accumulated only while
  `stats.enabled` (evaluation), summarised by `stats.summary()`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from sigma_moe.framework.distributed import global_mean


class RoutingStats:
    """Sums over an evaluation pass; `summary()` turns them into the paper's figures' numbers."""

    def __init__(self) -> None:
        self.enabled = False
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def _add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().double()
        self.sums[name] = self.sums[name] + value if name in self.sums else value

    @torch.no_grad()
    def record_moe(self, expert_TK: torch.Tensor, gate_TK: torch.Tensor, n_experts: int) -> None:
        """Selection weight, selection counts and co-occurrence of the chosen experts."""
        if not self.enabled:
            return
        onehot_TKE = F.one_hot(expert_TK.long(), n_experts).to(gate_TK.dtype)
        self._add("weight_E", torch.einsum("tk,tke->e", gate_TK.float(), onehot_TKE.float()))
        sel_TE = onehot_TKE.sum(1).float()
        self._add("count_E", sel_TE.sum(0))
        self._add("cooc_EE", sel_TE.T @ sel_TE)
        self._add("tokens", torch.tensor(float(expert_TK.shape[0])))

    @torch.no_grad()
    def record_active(self, hidden_TF: torch.Tensor) -> None:
        """Number of non-zero hidden channels per token (paper Fig. 1)."""
        if not self.enabled:
            return
        active_T = (hidden_TF != 0).sum(-1).double()
        self._add("active_sum", active_T.sum())
        self._add("active_sqsum", (active_T**2).sum())
        self._add("tokens", torch.tensor(float(hidden_TF.shape[0])))
        self._add("width", torch.tensor(float(hidden_TF.shape[-1])))  # summed; divided below
        self._add("calls", torch.tensor(1.0))

    def summary(self) -> dict[str, object]:
        s = {k: v.cpu() for k, v in self.sums.items()}
        out: dict[str, object] = {}
        if "weight_E" in s:
            share = s["weight_E"] / s["weight_E"].sum().clamp_min(1e-30)
            usage = s["count_E"] / s["count_E"].sum().clamp_min(1e-30)
            out["expert_share"] = share.tolist()
            out["dead_fraction"] = float((s["count_E"] == 0).double().mean())
            ent = -(usage * usage.clamp_min(1e-30).log()).sum()
            out["usage_entropy"] = float(ent)
            out["usage_entropy_norm"] = float(ent / math.log(len(usage))) if len(usage) > 1 else 1.0
            diag = s["cooc_EE"].diagonal().clamp_min(1)
            out["cooccurrence"] = (s["cooc_EE"] / diag[:, None]).tolist()
        if "active_sum" in s:
            n = s["tokens"]
            mean = s["active_sum"] / n
            out["active_mean"] = float(mean)
            out["active_std"] = float((s["active_sqsum"] / n - mean**2).clamp_min(0).sqrt())
            out["width"] = float(s["width"] / s["calls"])
        return out


class FFN(nn.Module):
    """Base class of every feedforward variant; subclasses set `Config` and `forward`."""

    # True: a nonzero trainer.weight_decay leaves this layer's parameters alone (the MoE
    # layers: docs/REFERENCE.md "no weight decay"); read by sigma_moe/framework/optim.py
    no_weight_decay: bool = False

    def __init__(self) -> None:
        super().__init__()
        self._loss: torch.Tensor | None = None
        self.stats = RoutingStats()

    def add_loss(self, loss: torch.Tensor) -> None:
        self._loss = loss if self._loss is None else self._loss + loss

    def pop_loss(self) -> torch.Tensor | None:
        loss, self._loss = self._loss, None
        return loss


def entropy_regularizer(logits_TE: torch.Tensor) -> torch.Tensor:
    """Negative entropy of the batch-mean softmax selection distribution (Eq. `our_reg`).

    p = mean_t softmax(logits_t), computed in log space (logsumexp_t log p_t - log |B|);
    L = sum_e p[e] log p[e]. The softmax is used even when routing uses a sigmoid
    (docs/REFERENCE.md). Averaged over all data-parallel workers' tokens.
    """
    logp_TE = F.log_softmax(logits_TE.float(), dim=-1)
    logp_E = torch.logsumexp(logp_TE, dim=0) - math.log(max(1, logits_TE.shape[0]))
    p_E = global_mean(logp_E.exp())
    return (p_E * p_E.clamp_min(1e-30).log()).sum()


@torch.no_grad()
def trunc_normal_(w: torch.Tensor, std: float) -> torch.Tensor:
    """Normal truncated at +-2 sigma, rescaled so that the sample std is exactly `std`
    (docs/REFERENCE.md; the authors' `reset_prenorm_params`). Cutting the tails alone
    leaves 0.88 std: attention and dense layers would start with 0.77x the variance of
    the MoE experts (plain normal), which the paper initialises "identically"."""
    nn.init.trunc_normal_(w, std=1.0, a=-2.0, b=2.0)
    return w.mul_(std / w.std())
