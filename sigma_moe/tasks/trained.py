"""A trained run in Python: its model and data rebuilt as run.py built them, for notebooks
and analysis scripts (scripts/analyze.py draws the paper's routing figures with it).

    import torch
    from sigma_moe.tasks.trained import load_trained

    run = load_trained("runs/mini_moe")  # its newest valid checkpoint (or a checkpoint_*.pt)
    run.evaluate("test")       # {'loss': .., 'bpc': .., 'tokens': ..}: results.json's numbers
    run.evaluate("valid", stats=True)["routing"]  # per layer: expert shares, co-occurrence
    x_BT = torch.from_numpy(run.data.split("valid")[:512]).long().view(2, 256).to(run.device)
    logits_BTV, mems = run.model(x_BT)  # the model in eval mode; mems: the next call's memory

Nothing in the run directory changes (a training may be writing there). Bad input is a
`ConfigError` (no config.yaml, a config this code cannot build), a `CheckpointError` (no
valid checkpoint, weights that do not fit the config; `CheckpointUnloadable`: a whole
checkpoint that does not load here, e.g. one whose pickle would run code) or a `DataError`
(the dataset is not prepared on this machine: the message says how to prepare it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sigma_moe.framework.checkpoint import (
    CheckpointError,
    CheckpointUnloadable,
    load_checkpoint,
    load_latest,
)
from sigma_moe.framework.config import ConfigError, first_line, from_dict
from sigma_moe.framework.data import TokenData
from sigma_moe.framework.runtime import resolve_device
from sigma_moe.framework.trainer import note as _note
from sigma_moe.models.transformer_xl import TransformerXL, TransformerXLConfig
from sigma_moe.tasks.lm import LMTask, LMTaskConfig, build_model_config, load_data
from sigma_moe.tasks.lm_run import backend_problem


@dataclass(frozen=True)
class RunSpec:
    """What a run's config.yaml says, checked; nothing loaded yet."""
    path: Path  # as given: the run directory, or one checkpoint file in it
    run_dir: Path
    name: str  # the experiment's `name`, else the directory's
    cfg: dict[str, Any]  # config.yaml, resolved
    task_cfg: LMTaskConfig
    model_cfg: TransformerXLConfig  # vocab_size 0: it comes with the data


def read_run(path: str | Path, device: torch.device, note: Callable[[str], None] = _note
             ) -> RunSpec:
    """A run directory or one checkpoint file in one: its config.yaml, read and checked
    (cheap: check every run of an analysis before the first loads)."""
    import yaml
    from omegaconf import DictConfig, OmegaConf

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist: pass a run directory or a checkpoint in one")
    run_dir = path.parent if path.is_file() else path
    file = run_dir / "config.yaml"
    if not file.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml (not a run directory)")
    try:
        conf = OmegaConf.load(file)
        cfg = OmegaConf.to_container(conf, resolve=True)
    except (yaml.YAMLError, ValueError) as e:  # OmegaConf's errors and bad UTF-8 are ValueErrors
        raise ConfigError(f"{file} cannot be read ({type(e).__name__}: {first_line(e)}); "
                          f"restore it (run.py writes it when the run starts)") from None
    missing = [key for key in ("task", "dataset.kind", "model", "ffn")
               if not isinstance(conf, DictConfig) or OmegaConf.select(conf, key) is None]
    if missing:
        raise ConfigError(f"{file} has no {', '.join(missing)}: not the config.yaml run.py "
                          f"writes; restore it")
    try:  # the vocabulary size comes with the data (load); every other field is checked
        task_cfg = from_dict(LMTaskConfig, cfg["task"], "task")
        model_cfg = build_model_config(cfg, vocab_size=0)
    except ConfigError as e:  # several runs at once: say which
        raise ConfigError(f"{file}: {first_line(e)}") from None
    return RunSpec(path, run_dir, str(cfg.get("name", run_dir.name)), cfg, task_cfg,
                   runnable_backend(model_cfg, device, note))


def runnable_backend(model_cfg: TransformerXLConfig, device: torch.device,
                     note: Callable[[str], None] = _note) -> TransformerXLConfig:
    """The run's ffn.backend, or `auto` where it cannot evaluate on this device (a run trained
    with Triton on a GPU, analysed on a laptop). Every backend computes the same MLP
    (tests/test_kernels*.py), so the numbers agree up to float rounding; `note` says so."""
    ffn = model_cfg.ffn
    problem = backend_problem(ffn, device, torch.float32)  # evaluation: float32, no dropout
    if problem is None:
        return model_cfg
    note(f"note: ffn.backend={ffn.backend} cannot run on {device} ({problem}): evaluating "
         f"with ffn.backend=auto (the same numbers up to float rounding)")
    return dataclasses.replace(model_cfg, ffn=dataclasses.replace(ffn, backend="auto"))


@dataclass
class Trained:
    """A run's model (eval mode, on `device`, weights of checkpoint `step`) and its data."""
    spec: RunSpec
    data: TokenData
    model: TransformerXL
    step: int
    device: torch.device

    def to(self, device: str | torch.device) -> Trained:
        """The model moved to `device` (and evaluated there)."""
        self.device = _device(device)
        self.model.to(self.device)
        return self

    def evaluate(self, split: str = "valid", max_segments: int | None = None,
                 stats: bool = False, progress: bool = False, add_stats: bool = False
                 ) -> dict[str, Any]:
        """The run's final evaluation (its eval batch size and memory) on `split`: loss and
        metric, tokens, and with `stats` the routing statistics per layer (`RoutingStats`,
        sigma_moe/models/ffn/base.py; `add_stats`: added to the previous call's).
        max_segments: the first N segments (0 = the whole split; default the run's
        task.final_segments, which its results.json used)."""
        problem = backend_problem(self.model.cfg.ffn, self.device, torch.float32)
        if problem is not None:  # the backend was picked for the device read_run was given
            raise ConfigError(f"ffn.backend={self.model.cfg.ffn.backend} cannot run on "
                              f"{self.device} ({problem}); load the run with that device "
                              f"(load_trained(path, device)), which picks one that can")
        cfg = self.spec.task_cfg
        segments = cfg.final_segments if max_segments is None else max_segments
        task = LMTask(cfg, self.data, self.model, self.device)
        result = task.evaluate(split, cfg.eval_batch_size, cfg.eval_mem_segments, segments,
                               stats=stats, progress=progress, add_stats=add_stats)
        assert result is not None, "no stop() given: always a result"
        return result


def load(spec: RunSpec, device: torch.device, data: TokenData | None = None,
         note: Callable[[str], None] = _note) -> Trained:
    """The run's checkpoint (spec.path, or the run directory's newest valid one) in a model
    on `device`; `data`: the run's dataset if already loaded (seeds of one experiment)."""
    path, run_dir = spec.path, spec.run_dir
    try:
        state = load_checkpoint(path) if path.is_file() else load_latest(run_dir, warn=note)
    except CheckpointUnloadable:  # whole, but not loadable here: its message names the file
        raise
    except CheckpointError as e:  # a damaged file, named by its file name
        raise CheckpointError(f"{run_dir}/{e}; pass the run directory (its newest valid "
                              f"checkpoint) or another checkpoint") from None
    if state is None:
        raise CheckpointError(f"no valid checkpoint in {run_dir}; train the run first")
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: no model weights (not a checkpoint run.py writes); "
                              f"pass a run directory or a checkpoint_*.pt in one")
    data = data or load_data(spec.cfg)
    model = TransformerXL(dataclasses.replace(spec.model_cfg, vocab_size=data.vocab_size))
    try:
        model.load_state_dict(state["model"])
    except (TypeError, RuntimeError) as e:  # another run's checkpoint
        detail = str(e).strip().splitlines()[-1].strip()  # load_state_dict's 1st: a heading
        raise CheckpointError(f"{path}: its weights do not fit the model {run_dir}/config.yaml "
                              f"describes ({detail}); use a checkpoint with the config.yaml "
                              f"of the run that wrote it") from None
    return Trained(spec, data, model.to(device).eval(), int(state.get("step", 0)), device)


def load_trained(path: str | Path, device: str | torch.device = "auto") -> Trained:
    """A run directory (its newest valid checkpoint) or one checkpoint_*.pt in one, ready
    to evaluate or to call. device: auto (a GPU if there is one), cpu, cuda, cuda:1, ..."""
    dev = _device(device)
    return load(read_run(path, dev), dev)


def _device(device: str | torch.device) -> torch.device:
    """A device this machine has (ConfigError otherwise: not an error in the first .to())."""
    return resolve_device(str(device), f"device={str(device)!r}")
