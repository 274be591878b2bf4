"""Where and how a run computes: its device and precision (trainer.device, .precision),
and the random number generators it seeds, checkpoints and restores
(sigma_moe/framework/trainer.py)."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from sigma_moe.framework.config import ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's own random draws (dropout masks): `seed` on rank 0, as in one
    process; another rank's is drawn from (seed, rank), so that no rank of one seed repeats
    a rank of another (seed + rank gave rank 1 of seed 0 the masks of rank 0 of seed 1)."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def resolve_device(name: str, setting: str = "") -> torch.device:
    """trainer.device: `auto` is CUDA when there is one, else the CPU. A device this machine
    lacks is a ConfigError here: the first `.to(device)` would fail with a traceback, after
    the run directory was written. `setting`: how the error names where `name` came from
    (default `trainer.device=NAME`)."""
    setting = setting or f"trainer.device={name}"
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{setting} is not a device: use auto, cpu, cuda, cuda:N or mps"
                          ) from None
    # each backend's own check (torch.cuda, torch.xpu, ...; MPS keeps it under backends)
    module = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    available = getattr(module, "is_available", None)
    if available is None or not available():
        raise ConfigError(f"{setting} but no {device.type.upper()} device is available; "
                          f"use cpu")
    count = getattr(module, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"{setting} but this machine has {count} {device.type.upper()} "
                          f"device(s): use {device.type}:0 .. {device.type}:{count - 1}")
    return device


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return PRECISIONS[precision]


def precision_name(dtype: torch.dtype) -> str:
    """trainer.precision's name of a compute dtype (what runs record)."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
