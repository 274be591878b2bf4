"""Language modelling with Transformer-XL memory (paper Sec. 5, App. B).

Training reads `batch_size` contiguous streams in segments of `context` tokens with one
segment of memory; the final evaluation (paper's test numbers) reads valid and test with
4 segments of memory and batch size 4. Metric: bits/char for byte data (enwik8), perplexity
per SentencePiece token for subword data (docs/REFERENCE.md "Metrics").
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from sigma_moe.framework.config import ConfigError, from_dict
from sigma_moe.framework.data import DATASETS, DataError, StreamBatcher, TokenData
from sigma_moe.framework.data.base import train_tokens_for
from sigma_moe.framework.distributed import all_gather_cat
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.experts import ExpertsFFN
from sigma_moe.models.transformer_xl import Memory, TransformerXL, TransformerXLConfig

EVAL_LINE_S = 60.0  # into a log file, an evaluation says how far it got this often


@dataclass(frozen=True)
class LMTaskConfig:
    kind: str = "lm"
    batch_size: int = 64  # global batch (streams), split over ranks and micro-batches
    context: int = 256  # segment length
    train_mem_segments: int = 1
    eval_mem_segments: int = 4
    eval_batch_size: int = 4
    val_segments: int = 0  # periodic validation: first N segments only (0 = whole split)
    final_segments: int = 0  # final evaluation: first N segments (0 = whole split, the paper)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.context < 1 or self.eval_batch_size < 1:
            raise ConfigError("task.batch_size, task.context and task.eval_batch_size must be >= 1")
        for key in ("train_mem_segments", "eval_mem_segments", "val_segments",
                    "final_segments"):
            if getattr(self, key) < 0:
                raise ConfigError(f"task.{key} must be >= 0, got {getattr(self, key)}")


@dataclass(frozen=True)
class ModelShape:
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    dropout: float


def build_model_config(cfg: dict[str, Any], vocab_size: int) -> TransformerXLConfig:
    """Model + FFN configs from the composed config (each validated strictly)."""
    task = from_dict(LMTaskConfig, cfg["task"], "task")
    shape = from_dict(ModelShape, cfg["model"], "model")
    ffn = dict(cfg["ffn"])
    kind = ffn.pop("kind", None)
    if kind is None:
        raise ConfigError("ffn.kind is missing: choose one of " + ", ".join(FFNS.names()))
    ffn_cfg = from_dict(FFNS.get(kind).Config, ffn, "ffn")
    return TransformerXLConfig(
        vocab_size=vocab_size, d_model=shape.d_model, n_layers=shape.n_layers,
        n_heads=shape.n_heads, head_dim=shape.head_dim, dropout=shape.dropout,
        mem_len=task.train_mem_segments * task.context,
        eval_mem_len=task.eval_mem_segments * task.context, ffn_kind=kind, ffn=ffn_cfg,
    )


def check_batch_split(batch_size: int, world_size: int, grad_accum: int) -> None:
    """task.batch_size is the global batch: split over the processes, then each process's
    share into trainer.grad_accum micro-batches. Checked before training starts."""
    if batch_size % world_size:
        raise ConfigError(f"task.batch_size={batch_size} (the global batch) does not divide "
                          f"by the {world_size} processes of this run: choose a multiple of "
                          f"{world_size}")
    per_rank = batch_size // world_size
    if per_rank % grad_accum:
        share = (f"task.batch_size={batch_size}" if world_size == 1 else
                 f"the {per_rank} sequences of each process (task.batch_size={batch_size} "
                 f"over {world_size} processes)")
        raise ConfigError(f"trainer.grad_accum={grad_accum} does not divide {share}")


def dataset_config(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """(the dataset class of `dataset.kind`, its validated Config)."""
    data_cfg = dict(cfg["dataset"])
    cls = DATASETS.get(data_cfg.pop("kind"))
    return cls, from_dict(cls.Config, data_cfg, "dataset")


def load_data(cfg: dict[str, Any]) -> TokenData:
    cls, data_cfg = dataset_config(cfg)
    return cls.load(data_cfg)


def check_split_sizes(data: TokenData, cfg: LMTaskConfig) -> None:
    """Every stream of every split holds one whole segment (context + 1 tokens), checked
    before anything is written (sigma_moe/tasks/lm_run.py): a shorter train split trains on short
    wrapped segments, and a short valid or test split failed only at its first evaluation,
    after steps were trained."""
    for split, streams, key in (("train", cfg.batch_size, "task.batch_size"),
                                ("valid", cfg.eval_batch_size, "task.eval_batch_size"),
                                ("test", cfg.eval_batch_size, "task.eval_batch_size")):
        n = len(data.split(split))
        if n < streams * (cfg.context + 1):
            raise DataError(
                f"dataset {data.name!r}: its {split} split has {n} tokens, fewer than "
                f"{key}={streams} streams x (task.context={cfg.context} + 1): use a larger "
                f"{split} split, or lower {key} or task.context")


def describe_data(data: TokenData, cfg: LMTaskConfig, steps: int
                  ) -> tuple[dict[str, Any], str | None]:
    """(what results.json records of the data, a warning or None).

    The record: the dataset, tokens per split, how many passes over the train split
    `steps` training steps make (StreamBatcher wraps at the end of its streams), and where
    the tokens came from (`TokenData.origin`: the cache entry, its source and sha256s). The
    warning: a corpus the paper reads once (C4, peS2o) that this run would read again,
    e.g. after `trainer.steps` was raised without the matching training tokens.
    """
    n_train = len(data.split("train"))
    per_epoch = StreamBatcher(data.split("train"), cfg.batch_size, cfg.context).steps_per_epoch
    record = {"name": data.name, "tokens": {s: len(a) for s, a in data.splits.items()},
              "train_epochs": float(f"{steps / per_epoch:.4g}"), **data.origin}
    warning = None
    if data.one_pass_key and steps > per_epoch:
        need = train_tokens_for(steps, cfg.batch_size, cfg.context)
        warning = (f"dataset {data.name!r}: {steps} steps read its {n_train:,}-token train "
                   f"split {steps / per_epoch:.2f} times, where the paper reads it once; "
                   f"{data.one_pass_key}={need} trains on fresh text throughout")
    return record, warning


def metrics(metric: str, ce: float) -> dict[str, float]:
    """A mean cross-entropy (nats a token) as the loss and the data's metric (`bpc`: bits a
    byte, `ppl`: perplexity)."""
    if metric == "bpc":
        return {"loss": ce, "bpc": ce / math.log(2)}
    return {"loss": ce, "ppl": math.exp(min(ce, 50.0))}


class LMTask:
    def __init__(self, cfg: LMTaskConfig, data: TokenData, model: TransformerXL,
                 device: torch.device, rank: int = 0, world_size: int = 1, train_model=None):
        self.cfg, self.data, self.model, self.device = cfg, data, model, device
        self.train_model = train_model or model  # DDP wrapper when distributed
        self.rank, self.world_size = rank, world_size
        self.batcher = StreamBatcher(data.split("train"), cfg.batch_size, cfg.context,
                                     rank, world_size)
        self.mems: Memory | None = None
        self.tokens_per_step = cfg.batch_size * cfg.context

    # -- training --------------------------------------------------------------------------
    def precompile(self, n_micro: int, dtype: torch.dtype) -> list:
        """Compile the Triton kernels of the model's expert layers ahead, in parallel, at
        this process's micro-batch (ExpertsConfig.precompile: one dry run a distinct layer
        config, on random inputs; the model, its memory and its statistics are untouched).
        Without it the first step's autotuning compiles them one by one (every autotune
        config of every launch of a layer shape). -> what each dry run did (Precompiled:
        the line it said, whether it failed)."""
        tokens = self.cfg.batch_size // self.world_size // n_micro * self.cfg.context
        layers = dict.fromkeys(m.cfg for m in self.model.modules() if isinstance(m, ExpertsFFN))
        said = (cfg.precompile(tokens, self.device, dtype) for cfg in layers)
        return [line for line in said if line is not None]

    def train_losses(self, n_micro: int
                     ) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor | float]]]:
        """(loss, metrics) per micro-batch; metrics stay on the device (no sync per batch)."""
        x_BT, y_BT, epoch_start = self.batcher.next()
        if epoch_start:
            self.mems = None
        B = x_BT.shape[0]
        assert B % n_micro == 0, "checked before training (check_batch_split)"
        x_BT, y_BT = x_BT.to(self.device), y_BT.to(self.device)
        new_mems: list[list[torch.Tensor]] = []
        m = B // n_micro
        ddp = self.train_model is not self.model
        for i in range(n_micro):
            rows = slice(i * m, (i + 1) * m)
            mems = [mem[rows] for mem in self.mems] if self.mems else None
            # DDP all-reduces in the backward of a forward run outside no_sync: only the last
            # micro-batch's, when the gradients of all of them have been summed
            with self.train_model.no_sync() if ddp and i < n_micro - 1 else nullcontext():
                logits, mems_out = self.train_model(x_BT[rows], mems)
            ce = F.cross_entropy(logits.float().flatten(0, 1), y_BT[rows].flatten())
            # the regularizers see this micro-batch's tokens (with grad_accum > 1 not the
            # whole batch's, as in the authors' code, which splits the same way)
            reg = self.model.pop_loss()
            loss = ce if reg is None else ce + reg
            new_mems.append(mems_out)
            yield loss, {"loss": loss.detach(), "ce": ce.detach(),
                         "reg": 0.0 if reg is None else reg.detach()}
        self.mems = [torch.cat(parts) for parts in zip(*new_mems)] if new_mems[0] else None

    def discard_step(self) -> None:
        """The last step was skipped (non-finite): its memory may hold NaN, which later
        segments would attend to. Start the memory over, as at an epoch start."""
        self.mems = None

    # -- evaluation ------------------------------------------------------------------------
    def metric(self, ce: float) -> dict[str, float]:
        return metrics(self.data.metric, ce)

    @torch.no_grad()
    def evaluate(self, split: str, batch_size: int, mem_segments: int, max_segments: int = 0,
                 stats: bool = False, progress: bool = False, add_stats: bool = False,
                 stop: Callable[[], bool] | None = None) -> dict[str, Any] | None:
        """Token-weighted mean cross-entropy over a split, memory reset at the start.
        `add_stats`: the routing statistics add to the previous evaluation's (splits pooled,
        scripts/analyze.py) instead of starting over. None if `stop()` became true first."""
        was_training = self.model.training
        self.model.eval()
        ffns = self.model.ffns()
        for f in ffns:
            if not add_stats:
                f.stats.reset()
            f.stats.enabled = stats
        batcher = StreamBatcher(self.data.split(split), batch_size, self.cfg.context)
        n_seg = -(-(batcher.stream_len - 1) // self.cfg.context)
        total = min(n_seg, max_segments) if max_segments else n_seg
        mem_len = mem_segments * self.cfg.context
        sum_ce, count, mems = 0.0, 0, None
        # word-level perplexity, an extra beside the subword one (docs/REFERENCE.md
        # "Metrics"): the same cross-entropy over the words of the targets read
        starts = (torch.from_numpy(self.data.word_start).to(self.device)
                  if self.data.metric == "ppl" and self.data.word_start is not None else None)
        n_words = 0
        # no bar into a log file (disable=None: a terminal only), where it is one long line,
        # but a line every EVAL_LINE_S: a final evaluation can take minutes
        lines = progress and not sys.stderr.isatty()
        started = last = time.perf_counter()
        stopped = False
        for i, (x_BT, y_BT) in enumerate(tqdm(batcher.segments(), total=total,
                                              disable=None if progress else True,
                                              desc=f"eval {split}", leave=False)):
            if i == total:
                break
            if stop is not None and stop():
                stopped = True
                break
            if lines and i and (now := time.perf_counter()) - last >= EVAL_LINE_S:
                last, left = now, (total - i) * (now - started) / i
                tqdm.write(f"eval {split}: segment {i}/{total} | "
                           f"{tqdm.format_interval(left)} left", file=sys.stderr)
            logits, mems = self.model(x_BT.to(self.device), mems)
            mems = [mem[:, -mem_len:] for mem in mems] if mem_len else None
            y_BT = y_BT.to(self.device)
            ce = F.cross_entropy(logits.float().flatten(0, 1), y_BT.flatten(), reduction="sum")
            sum_ce = sum_ce + ce.double()  # summed on the device: no sync per batch
            count += y_BT.numel()
            if starts is not None:
                n_words = n_words + starts[y_BT].sum()
        for f in ffns:
            f.stats.enabled = False
        self.model.train(was_training)
        if stopped:
            return None
        result: dict[str, Any] = self.metric(float(sum_ce) / max(count, 1))
        result["tokens"] = count
        if starts is not None and (n_words := int(n_words)):
            result["words"] = n_words
            result["word_ppl"] = math.exp(min(float(sum_ce) / n_words, 50.0))
        if stats:
            result["routing"] = [f.stats.summary() for f in ffns]
        return result

    def validate(self, stop: Callable[[], bool] | None = None) -> dict[str, Any] | None:
        """The periodic validation; None if `stop()` (a signal: the checkpoint first)."""
        return self.evaluate("valid", self.cfg.eval_batch_size, self.cfg.eval_mem_segments,
                             self.cfg.val_segments, stop=stop)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Data position and the memory of the *whole* batch (gathered over ranks)."""
        mems = [all_gather_cat(m).cpu() for m in self.mems] if self.mems else None
        return {"batcher": self.batcher.state_dict(), "mems": mems}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batcher.load_state_dict(state["batcher"])
        mems = state["mems"]
        if mems:
            per_rank = mems[0].shape[0] // self.world_size
            rows = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
            self.mems = [m[rows].to(self.device) for m in mems]
        else:
            self.mems = None
