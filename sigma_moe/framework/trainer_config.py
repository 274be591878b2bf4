"""The trainer's settings (configs/trainer/default.yaml; docs/REFERENCE.md "Training"),
checked when built: a bad value is one line before anything is written."""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from sigma_moe.framework.config import ConfigError

# POSIX signals that Windows lacks: named in preempt_signals there, they are not handled
# (nothing sends them: no Slurm), rather than refused
POSIX_ONLY = frozenset({"SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGXCPU",
                        "SIGCONT"})


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 100_000
    lr: float = 2.5e-4
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    grad_clip: float = 0.25  # global norm; 0 = off (authors' small dense baselines: 0.1)
    grad_accum: int = 1  # micro-batches per step (the batch is split along its streams)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on CUDA, else fp32
    seed: int = 0
    val_every: int = 2000
    ckpt_every: int = 10_000
    keep_checkpoints: int = 2
    log_every: int = 50
    nan_policy: Literal["stop", "skip"] = "stop"
    device: str = "auto"  # auto (CUDA if any, else CPU) | cpu | cuda | cuda:N | mps
    progress: bool = True
    # Slurm's warning before a time limit / preemption: checkpoint, then let the signal act
    # (default: exit; under submitit: requeue). The rerun resumes.
    preempt_signals: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGTERM")

    def __post_init__(self) -> None:
        for key in ("steps", "grad_accum", "val_every", "ckpt_every", "log_every"):
            if getattr(self, key) < 1:
                raise ConfigError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        # a traceback after the run directory exists (AdamW refuses a negative lr or decay),
        # or a silent misreading (a negative warmup; eps 0: a division by zero); lr 0 is a
        # throughput measurement
        if not self.eps > 0:
            raise ConfigError(f"trainer.eps must be > 0, got {self.eps}")
        for key in ("lr", "weight_decay", "grad_clip", "warmup_steps", "keep_checkpoints"):
            if getattr(self, key) < 0:
                raise ConfigError(f"trainer.{key} must be >= 0, got {getattr(self, key)}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"trainer.betas must be two numbers in [0, 1), got "
                              f"{list(self.betas)}")
        unknown = [n for n in self.preempt_signals
                   if n not in signal.Signals.__members__ and n not in POSIX_ONLY]
        if unknown:  # else a traceback once the data loaded and config.yaml was written
            raise ConfigError(f"trainer.preempt_signals: no signal {unknown[0]} here (known: "
                              f"e.g. SIGUSR1, SIGUSR2, SIGTERM)")
