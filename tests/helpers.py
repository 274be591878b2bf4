"""Shared test helpers: compose configs like run.py does, and tiny-model overrides."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework.cli import register_resolvers

CONFIGS = str(Path(__file__).resolve().parent.parent / "configs")

TINY = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.head_dim=16",
    "task.batch_size=4", "task.context=32", "task.eval_batch_size=2", "task.val_segments=3",
    "task.final_segments=4",
    "trainer.progress=false", "trainer.log_every=5", "trainer.warmup_steps=0",
]
TINY_MOE = ["ffn.n_experts=4", "ffn.expert_size=16", "ffn.k=2"]


register_resolvers()


def compose_cfg(overrides: list[str], exp: str = "mini_moe") -> dict[str, Any]:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose("config", overrides=[f"+exp={exp}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)
