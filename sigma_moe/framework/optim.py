"""Optimizer and learning-rate schedule of the paper (App. B; docs/REFERENCE.md "Training").

Adam (PyTorch defaults: betas 0.9/0.999, eps 1e-8), lr 2.5e-4, a cosine with the run's
length as its period, started after an optional linear warmup (4000 steps for the
d_model=1024 models; with one it ends short of 0).
"""
from __future__ import annotations

import math

import torch


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based).

    As the authors' code (their tasks/task.py: CosineAnnealingLR(T_max=stop_after) stepped
    at max(0, iter - lr_warmup), under a linear warmup): the cosine's period is the whole run
    (docs/REFERENCE.md: "to 0 over 100k steps"), started after the warmup, so a run with
    warmup ends short of 0 (4000 of 100k: at 0.4% of the lr)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total))
    return 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; a nonzero `weight_decay` skips the parameters of modules whose
    `no_weight_decay` is True (the MoE layers, sigma_moe/models/ffn/experts.py: docs/REFERENCE.md
    says no weight decay for them). Weight decay 0, every paper run's, gives one parameter group,
    as checkpoints written before this split have."""
    params = list(model.parameters())
    kept = {id(p) for m in model.modules() if getattr(m, "no_weight_decay", False) is True
            for p in m.parameters()}
    if weight_decay == 0 or not kept:
        groups = [{"params": params}]
    else:
        groups = [{"params": [p for p in params if id(p) not in kept]},
                  {"params": [p for p in params if id(p) in kept], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def in_groups_of(saved: dict, optimizer: torch.optim.Optimizer, params: list) -> dict:
    """A checkpoint's optimizer state, laid out in `optimizer`'s parameter groups.

    One written with a single group by the code before MoE layers were kept out of weight
    decay (with a nonzero decay) is split as build_optimizer splits now: its per-parameter
    state follows each parameter (`params`: the model's, in the single group's order), each
    group keeps its own weight decay. Any other layout is returned as is."""
    if len(saved["param_groups"]) != 1 or len(optimizer.param_groups) == 1:
        return saved
    old = saved["param_groups"][0]
    index = {id(p): i for i, p in enumerate(params)}
    state, groups, k = {}, [], 0
    for group in optimizer.param_groups:
        ids = []
        for p in group["params"]:
            if index[id(p)] in saved["state"]:
                state[k] = saved["state"][index[id(p)]]
            ids.append(k)
            k += 1
        groups.append({**old, "weight_decay": group["weight_decay"], "params": ids})
    return {"state": state, "param_groups": groups}
