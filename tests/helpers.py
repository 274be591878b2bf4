"""Shared test helpers: compose configs and sweeps like run.py does, build an experiment's
model on the meta device, tiny-model overrides, and a run stopped after its first
checkpoint."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from sigma_moe.framework.cli import register_resolvers
from sigma_moe.framework.trainer import Trainer
from sigma_moe.models.transformer_xl import TransformerXL, n_params
from sigma_moe.tasks.lm import build_model_config
from sigma_moe.tasks.lm_run import vocab_of

CONFIGS = str(Path(__file__).resolve().parent.parent / "configs")
EXP_DIR = Path(CONFIGS) / "exp"
EXPS = sorted(p.stem for p in EXP_DIR.glob("*.yaml"))


def tables_of(name: str) -> set[str]:
    """The tables whose cells an experiment's file claims (its `paper:` block)."""
    paper = yaml.safe_load((EXP_DIR / f"{name}.yaml").read_text()).get("paper") or {}
    return {e["table"] for e in paper.get("entries") or []}

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


@functools.cache
def _vocab(dataset_json: str) -> int:
    return vocab_of({"dataset": json.loads(dataset_json)})


@functools.cache
def load(name: str) -> tuple[dict[str, Any], Any, int]:
    """Composed config, validated model config and parameter count (meta device), with the
    vocabulary `mode=params` uses: the config's, the dataset's nominal one (enwik8: 205,
    docs/REFERENCE.md), else the (embedded) data's."""
    cfg = compose_cfg([], name)
    vocab = _vocab(json.dumps(cfg["dataset"], sort_keys=True))
    model_cfg = build_model_config(cfg, vocab)
    with torch.device("meta"):
        count = n_params(TransformerXL(model_cfg))
    return cfg, model_cfg, count


def compose_sweep(table: str, *overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose("config", overrides=[f"+sweep={table}", *overrides],
                       return_hydra_config=True)


def jobs(cfg, *cli: str) -> list[dict[str, str]]:
    """The jobs BasicSweeper launches: its params, then command-line overrides (which win)."""
    args = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()] + list(cli)
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)
    return [dict(o.split("=", 1) for o in job) for batch in batches for job in batch]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    """step -> logged training loss."""
    return {r["step"]: r["train/loss"] for r in metrics(run_dir) if "train/loss" in r}


class Stop(Exception):
    pass


def interrupt_after_first_checkpoint(monkeypatch, cfg: dict[str, Any], run_dir: Path) -> None:
    """Train `cfg` in run_dir as if the process were killed right after its first
    checkpoint was written (a rerun resumes from it)."""
    from sigma_moe.tasks import TASKS

    save = Trainer.checkpoint

    def save_then_stop(self):
        save(self)
        raise Stop

    with monkeypatch.context() as m, pytest.raises(Stop):
        m.setattr(Trainer, "checkpoint", save_then_stop)
        TASKS.get("lm")(cfg, run_dir)
