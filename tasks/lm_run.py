"""`task=lm`: one command trains, evaluates and logs one run of the paper's tables.

Modes (`mode=`): `train` (default; resumes from the run directory's last checkpoint, then
runs the final evaluation), `eval` (final evaluation of the last checkpoint only), and
`params` (parameter count and FFN share, on the meta device: nothing is allocated).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from framework.checkpoint import atomic_write_bytes, load_latest
from framework.config import ConfigError, from_dict
from framework.experiment import check_writable, config_hash, write_results
from framework.loggers import LoggerConfig, RunLogger
from framework.trainer import Trainer, TrainerConfig, resolve_device, seed_everything
from models.transformer_xl import TransformerXL, n_params
from tasks import TASKS
from tasks.lm import LMTask, LMTaskConfig, build_model_config, load_data


def ffn_param_share(model: torch.nn.Module) -> float:
    ffn = sum(p.numel() for n, p in model.named_parameters() if ".ffn." in n)
    return ffn / max(1, n_params(model))


@TASKS.register("lm")
def run(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    task_cfg = from_dict(LMTaskConfig, cfg["task"], "task")
    trainer_cfg = from_dict(TrainerConfig, cfg["trainer"], "trainer")
    logger_cfg = from_dict(LoggerConfig, cfg["logger"], "logger")
    mode = cfg.get("mode", "train")
    if mode not in ("train", "eval", "params"):
        raise ConfigError(f"mode={mode!r} is not one of train, eval, params")
    if mode == "params":
        return print_params(cfg)

    data = load_data(cfg)
    model_cfg = build_model_config(cfg, data.vocab_size)
    device = resolve_device(trainer_cfg.device)
    check_writable(run_dir)
    atomic_write_bytes(run_dir / "config.yaml", OmegaConf.to_yaml(cfg).encode())
    seed_everything(trainer_cfg.seed)
    model = TransformerXL(model_cfg).to(device)
    task = LMTask(task_cfg, data, model, device)
    chash = config_hash(cfg)
    logger = RunLogger(logger_cfg, run_dir, cfg, cfg.get("name", "run"))
    count = n_params(model)
    tqdm.write(f"run {run_dir} | {cfg.get('name')} | {count / 1e6:.2f}M params | "
               f"ffn={model_cfg.ffn_kind} | seed={trainer_cfg.seed} | device={device}")
    try:
        trainer = Trainer(trainer_cfg, task, run_dir, logger, device, config_hash=chash)
        start = time.perf_counter()
        if mode == "train":
            trainer.fit()
        else:
            state = load_latest(run_dir, warn=tqdm.write)
            if state is None:
                raise ConfigError(f"mode=eval: no checkpoint in {run_dir}; train this run first")
            model.load_state_dict(state["model"])
            trainer.step = int(state["step"])
        train_s = time.perf_counter() - start
        results: dict[str, Any] = {"name": cfg.get("name"), "metric": data.metric,
                                   "steps": trainer.step, "n_params": count,
                                   "config_hash": chash, "seed": trainer_cfg.seed,
                                   "train_seconds": round(train_s, 1)}
        for split in ("valid", "test"):
            r = task.evaluate(split, task_cfg.eval_batch_size, task_cfg.eval_mem_segments,
                              task_cfg.final_segments, stats=True, progress=trainer_cfg.progress)
            results[split] = {k: v for k, v in r.items() if k != "routing"}
            results[f"{split}_routing"] = r["routing"]
            logger.log({f"final_{split}/{k}": v for k, v in results[split].items()}, trainer.step)
        write_results(run_dir, results)
        logger.summary({f"{s}_{data.metric}": results[s][data.metric] for s in ("valid", "test")})
        print(f"final valid {data.metric} {results['valid'][data.metric]:.4f} | "
              f"test {data.metric} {results['test'][data.metric]:.4f} | results: "
              f"{run_dir / 'results.json'}")
        return results
    finally:
        logger.close()


def print_params(cfg: dict[str, Any]) -> dict[str, Any]:
    """Parameter count of an experiment without allocating it (meta device)."""
    vocab = int(cfg.get("vocab_size") or 0) or _vocab_of(cfg)
    model_cfg = build_model_config(cfg, vocab)
    with torch.device("meta"):
        model = TransformerXL(model_cfg)
    out = {"n_params": n_params(model), "ffn_param_share": ffn_param_share(model),
           "vocab_size": vocab}
    print(f"{cfg.get('name')}: {out['n_params'] / 1e6:.2f}M parameters "
          f"(FFN {100 * out['ffn_param_share']:.1f}%), vocab {vocab}")
    return out


def _vocab_of(cfg: dict[str, Any]) -> int:
    vocab = cfg["dataset"].get("vocab_size")
    if vocab:
        return int(vocab)
    return load_data(cfg).vocab_size
