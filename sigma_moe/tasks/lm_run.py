"""`task=lm`: one command trains, evaluates and logs one run of the paper's tables.

Modes (`mode=`): `train` (default; resumes from the run directory's last checkpoint, then
runs the final evaluation), `eval` (final evaluation of the last checkpoint only), and
`params` (parameter count and FFN share, on the meta device: nothing is allocated).
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from sigma_moe import kernels
from sigma_moe.framework.checkpoint import atomic_write_bytes, list_checkpoints, load_latest
from sigma_moe.framework.code_version import code_version, library_versions
from sigma_moe.framework.config import ConfigError, first_line, from_dict
from sigma_moe.framework.distributed import all_gather_object, init_distributed
from sigma_moe.framework.divergence import TrainingDiverged
from sigma_moe.framework.experiment import (
    check_trained_as,
    check_writable,
    run_hashes,
    saved_config,
    write_results,
)
from sigma_moe.framework.loggers import LoggerConfig, RunLogger
from sigma_moe.framework.run_dirs import nothing_to_evaluate, write_overrides
from sigma_moe.framework.runtime import (
    precision_name,
    rank_seed,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from sigma_moe.framework.trainer import Trainer, note
from sigma_moe.framework.trainer_config import TrainerConfig
from sigma_moe.models.ffn.experts import ExpertsConfig
from sigma_moe.models.flops import ffn_flops, has_flops_formula, relative_ffn_flops
from sigma_moe.models.transformer_xl import TransformerXL, n_params
from sigma_moe.tasks import TASKS
from sigma_moe.tasks.lm import (
    LMTask,
    LMTaskConfig,
    build_model_config,
    check_batch_split,
    check_split_sizes,
    dataset_config,
    describe_data,
    load_data,
)


def reset_peak_rss() -> None:
    """Linux: restart the peak-RSS counter, so each in-process run (a sequential sweep)
    reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    """This process's peak resident memory, MB; None where neither /proc nor `resource`
    says (Windows)."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) / 1024
    except (OSError, TypeError):
        try:
            import resource
        except ImportError:
            return None

        scale = 2**20 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


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
    if mode == "params":  # a dry run of a sweep: what training would refuse, refused here
        check_batch_split(task_cfg.batch_size, 1, trainer_cfg.grad_accum)
        return print_params(cfg, run_dir)
    if mode == "eval":  # before the data loads and the logger starts: it only reads
        check_trained_as(run_dir, cfg)

    reset_peak_rss()
    device = resolve_device(trainer_cfg.device)
    dist_info = init_distributed(device.type)
    check_batch_split(task_cfg.batch_size, dist_info.world_size, trainer_cfg.grad_accum)
    # the model's values are checked before the data loads (minutes for C4); its vocabulary
    # is the data's
    model_cfg = build_model_config(cfg, vocab_size=1)
    amp_dtype = resolve_precision(trainer_cfg.precision, device)
    check_backend(model_cfg, device, amp_dtype)
    data = load_data(cfg)
    check_split_sizes(data, task_cfg)
    data_record, data_warning = describe_data(data, task_cfg, trainer_cfg.steps)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=data.vocab_size)
    if device.type == "cuda" and dist_info.enabled:  # init_distributed made it current
        device = torch.device("cuda", dist_info.local_rank)
    elif device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # what defaults to the current device means this one
    if dist_info.is_main:
        check_writable(run_dir)
        # a resumed run keeps the config it started with; an eval writes no config (it
        # fails when there is no checkpoint, and must leave no directory behind then)
        if mode == "train" and not list_checkpoints(run_dir):
            atomic_write_bytes(run_dir / "config.yaml", OmegaConf.to_yaml(cfg).encode())
            write_overrides(run_dir)
    seed_everything(trainer_cfg.seed)  # same init on every rank (DDP also broadcasts it)
    model = TransformerXL(model_cfg).to(device)
    seed_everything(rank_seed(trainer_cfg.seed, dist_info.rank))  # own dropout masks
    train_model = model
    if dist_info.enabled:
        train_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    task = LMTask(task_cfg, data, model, device, dist_info.rank, dist_info.world_size,
                  train_model)
    # an eval writes eval_results.json only: the run's metrics.jsonl (and its wandb run, with
    # the training config) stay the training's record
    logger = RunLogger(logger_cfg, run_dir, cfg, cfg.get("name", "run"),
                       dist_info.is_main and mode == "train")
    count = n_params(model)
    computes = precision_name(amp_dtype) if mode == "train" else "fp32"  # eval: no autocast
    if dist_info.is_main:
        tqdm.write(f"run {run_dir} | {cfg.get('name')} | {count / 1e6:.2f}M params | "
                   f"ffn={model_cfg.ffn_kind} | seed={trainer_cfg.seed} | device={device} | "
                   f"{computes} | ranks={dist_info.world_size}")
        tqdm.write(data_line(data_record))
        if data_warning and mode == "train":
            note(f"warning: {data_warning}")
    try:
        trainer = Trainer(trainer_cfg, task, run_dir, logger, device, dist_info,
                          run_hashes(cfg))
        if mode == "train":
            trainer.fit()
        else:
            found = len(list_checkpoints(run_dir))
            # every rank checks the same files: rank 0 says what it skips
            state = load_latest(run_dir, warn=note if dist_info.is_main else lambda _: None)
            if state is None:
                raise ConfigError(nothing_to_evaluate(run_dir, found))
            # a file copied in: its numbers are not this run's (the config it trained, as
            # its config.yaml says: this one's evaluation settings may differ; without one,
            # as check_trained_as, nothing to check against)
            if (trained := saved_config(run_dir)) is not None:
                trainer.check_own(state, run_hashes(trained), "move it away to evaluate the "
                                  "run's own checkpoints")
            try:
                model.load_state_dict(state["model"])
            except RuntimeError as e:  # torch's size mismatch list: many lines
                raise ConfigError(f"mode=eval: the step-{state['step']} checkpoint in "
                                  f"{run_dir} does not fit this model ({first_line(e)})"
                                  ) from None
            trainer.load_progress(state)
        # the largest process's (all ranks); null where not known
        peak_rss = max((p for p in all_gather_object(peak_rss_mb()) if p is not None),
                       default=None)
        results: dict[str, Any] = {"name": cfg.get("name"), "metric": data.metric,
                                   "steps": trainer.step, "n_params": count,
                                   "config_hash": trainer.config_hash, "seed": trainer_cfg.seed,
                                   "ranks": dist_info.world_size,  # processes of the last leg
                                   "threads": torch.get_num_threads(),  # of the last leg too
                                   "train_seconds": round(trainer.train_seconds, 1),
                                   "peak_rss_mb": None if peak_rss is None else round(peak_rss, 1),
                                   "code": code_version(trainer.code_fingerprints),
                                   "libraries": library_versions(),  # of the last leg
                                   "precision": trainer.precisions,  # of the training
                                   "data": data_record,
                                   # how valid/test were evaluated (mode=eval may change it)
                                   "evaluation": {k: getattr(task_cfg, k) for k in (
                                       "eval_mem_segments", "final_segments",
                                       "eval_batch_size")}}
        # Every rank evaluates the same streams (identical numbers); rank 0 writes them.
        for split in ("valid", "test"):
            with trainer.said_on_signal("the final evaluation"):
                r = task.evaluate(split, task_cfg.eval_batch_size, task_cfg.eval_mem_segments,
                                  task_cfg.final_segments, stats=True,
                                  progress=trainer_cfg.progress and dist_info.is_main)
            results[split] = {k: v for k, v in r.items() if k != "routing"}
            results[f"{split}_routing"] = r["routing"]
            logger.log({f"final_{split}/{k}": v for k, v in results[split].items()}, trainer.step)
            check_finite(results[split], split, trainer.step, mode)
        if not dist_info.is_main:
            return results
        # results.json marks a finished run (a rerun skips it): an eval of a checkpoint
        # mid-training must not, or the run could never resume
        out = write_results(run_dir, results, "results.json" if mode == "train"
                            else "eval_results.json")
        if mode == "train":  # the summary marks a finished run (scripts/paper_tables.py)
            logger.summary({**{f"{s}_{data.metric}": results[s][data.metric]
                               for s in ("valid", "test")}, "n_params": count,
                            "code": results["code"], "data": data_record})
        logger.close()  # before the result line: wandb's summary would print below it
        def shown(split):  # word-level ppl beside, when the dataset counted its words
            r = results[split]
            word = f" (word-level {r['word_ppl']:.2f})" if "word_ppl" in r else ""
            return f"{split} {data.metric} {r[data.metric]:.4f}{word}"

        # an eval names the step it evaluated: the newest checkpoint's, unless that one did
        # not load (the warnings above say which did)
        what = "final" if mode == "train" else f"eval of the step-{trainer.step} checkpoint:"
        print(f"{what} {shown('valid')} | {shown('test')} | results: {out}")
        return results
    finally:
        logger.close()


def check_finite(metrics: dict[str, float], split: str, step: int, mode: str) -> None:
    """A non-finite final loss is a diverged run (nan_policy=skip can skip every step of a
    short run, fewer than it gives up after), not a result: no results.json (it would mark
    the run finished, with a NaN no table can read)."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad:
        what = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise TrainingDiverged(
            f"the {split} set gives a non-finite {what} with the weights of step {step}: "
            + ("the run has diverged; lower trainer.lr and start over (fresh=true)"
               if mode == "train" else "this checkpoint's weights have diverged"))


def data_line(record: dict[str, Any]) -> str:
    """The start line about the data: split sizes, passes over train, where it came from."""
    sizes = "/".join(f"{n:,}" for n in record["tokens"].values())
    source = record.get("source")  # a dataset of your own may record its file here
    where = record.get("cache_entry") or (source if isinstance(source, str) else "embedded")
    return (f"data {record['name']}: {'/'.join(record['tokens'])} {sizes} tokens, "
            f"{record['train_epochs']:g} epochs of train | {where}")


def backend_problem(ffn, device: torch.device, dtype: torch.dtype,
                    dropout: bool = False) -> str | None:
    """Why an FFN's fixed `ffn.backend` cannot run on `device` in `dtype` (None: it can, or
    the FFN has no expert kernel, or `auto` picks one that can)."""
    if not isinstance(ffn, ExpertsConfig) or ffn.backend == "auto":
        return None
    x_TD = torch.empty(1, ffn.d_model, device=device, dtype=dtype)
    w1_EDG = torch.empty(1, ffn.d_model, ffn.expert_size, device=device, dtype=dtype)
    return kernels.backend_problem(ffn.backend, x_TD, w1_EDG, dropout)


def check_backend(model_cfg, device: torch.device, dtype: torch.dtype) -> None:
    """A fixed ffn.backend that cannot run here stops before anything is written (the layer
    would only fail in its first forward, or its first evaluation, with a traceback).
    Training computes in `dtype`, with hidden dropout; evaluation in float32, without."""
    ffn = model_cfg.ffn
    for phase, dt, dropout in (("training", dtype, getattr(ffn, "hidden_dropout", 0) > 0),
                               ("evaluation", torch.float32, False)):
        problem = backend_problem(ffn, device, dt, dropout)
        if problem is not None:
            raise ConfigError(f"ffn.backend={ffn.backend} cannot run the {phase} on {device} "
                              f"({dt}): {problem}; ffn.backend=auto picks one that can")


def print_params(cfg: dict[str, Any], run_dir: Path | None = None) -> dict[str, Any]:
    """Parameter count of an experiment without allocating it (meta device). The line
    names the run directory when it is not the experiment's own (overrides, sweep jobs)."""
    vocab = vocab_of(cfg)
    model_cfg = build_model_config(cfg, vocab)
    with torch.device("meta"):
        model = TransformerXL(model_cfg)
    ffn = model_cfg.ffn
    out = {"n_params": n_params(model), "ffn_param_share": ffn_param_share(model),
           "vocab_size": vocab}
    label = cfg.get("name")
    if run_dir is not None and run_dir.name != label:
        label = f"{label} [{run_dir.name}]"
    line = (f"{label}: {out['n_params'] / 1e6:.2f}M parameters "
            f"(FFN {model_cfg.ffn_kind}: {100 * out['ffn_param_share']:.1f}%), vocab {vocab}, ")
    if not has_flops_formula(ffn):  # a new variant: its own formula belongs in models/flops.py
        line += (f"FFN FLOPs unknown (no formula for {type(ffn).__name__} in "
                 "sigma_moe/models/flops.py)")
    else:
        out["ffn_flops_per_token"] = ffn_flops(ffn)
        line += f"FFN {out['ffn_flops_per_token'] / 1e6:.2f} MFLOPs/token/layer"
        if isinstance(ffn, ExpertsConfig):
            # Tab. flops_detailed: FLOPs and activation memory vs the dense MLP of width N_E*G
            out["ffn_relative_flops"] = relative_ffn_flops(ffn)
            line += f" = {100 * out['ffn_relative_flops']:.1f}% of dense FLOPs and memory"
    print(line)
    return out


def vocab_of(cfg: dict[str, Any]) -> int:
    """The vocabulary from the config when it fixes it, else from the (prepared) data. The
    dataset's config is validated as training would (dataset.vocab_size's range, ...)."""
    cls, data_cfg = dataset_config(cfg)
    nominal = getattr(cls, "nominal_vocab_size", None)
    return int(getattr(data_cfg, "vocab_size", 0) or nominal or load_data(cfg).vocab_size)
