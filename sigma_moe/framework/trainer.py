"""The training loop (docs/REFERENCE.md "Training"): model-agnostic, driven by a task.

The task owns data, memory and loss; the trainer owns the optimizer, schedule, precision,
clipping, accumulation, validation schedule, checkpoints and resume. A task provides:

    model                                   the nn.Module to optimize
    train_losses(n_micro) -> iterator       yields (loss, metrics) per micro-batch
    validate() -> dict                      metrics on the validation split
    tokens_per_step: int                    for tokens/s
    precompile(n_micro, dtype) -> [(line, failed)]  optional: compile the GPU kernels ahead
    state_dict() / load_state_dict(s)       data position and memory
    discard_step()                          forget state the last step left (a skipped
                                            non-finite step: its memory may hold NaN)
"""
from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

import torch
from tqdm import tqdm

from sigma_moe.framework.checkpoint import (
    CheckpointError,
    CheckpointUnloadable,
    checkpoint_path,
    list_broken,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from sigma_moe.framework.code_version import UNRECORDED, code_fingerprint
from sigma_moe.framework.config import ConfigError
from sigma_moe.framework.distributed import (
    SINGLE_PROCESS,
    DistInfo,
    all_gather_object,
    broadcast_from_main,
    mean_over_ranks,
)
from sigma_moe.framework.divergence import (
    MAX_OVERFLOWS_IN_ROW,
    MAX_SKIPPED_IN_ROW,
    TrainingDiverged,
    nonfinite_report,
)
from sigma_moe.framework.optim import build_optimizer, in_groups_of, lr_factor
from sigma_moe.framework.runtime import (
    precision_name,
    resolve_precision,
    rng_state,
    seed_everything,
    set_rng_state,
)
from sigma_moe.framework.trainer_config import TrainerConfig


@contextmanager
def handling(names: tuple[str, ...], handler) -> Iterator[dict[int, Any]]:
    """`handler` for the signals `names` while the block runs; -> the handlers it replaced
    (put back after). Names this platform lacks (SIGUSR1 on Windows) are left out."""
    previous = {getattr(signal, n): signal.signal(getattr(signal, n), handler) for n in names
                if hasattr(signal, n)}
    try:
        yield previous
    finally:
        for sig, theirs in previous.items():
            signal.signal(sig, theirs)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C once the trainer has written its checkpoint and said so (the CLI adds no
    line of its own)."""


def note(line: str) -> None:
    """A warning or note: on stderr, with the progress bar (stdout keeps the results)."""
    tqdm.write(line, file=sys.stderr)


def to_host(values: dict[str, Any]) -> dict[str, float]:
    """Python floats of scalar metrics: the device tensors in one transfer (float() on each
    would wait for the GPU once per metric)."""
    keys = [k for k, v in values.items() if torch.is_tensor(v)]
    host = {}
    if keys:  # one dtype and device (the grad norm of a model without gradients is on the CPU)
        like = values[keys[0]]
        stacked = torch.stack([values[k].detach().to(like.device, torch.float64) for k in keys])
        host = dict(zip(keys, stacked.tolist()))
    return {k: host[k] if k in host else float(v) for k, v in values.items()}


class Trainer:
    def __init__(self, cfg: TrainerConfig, task, run_dir: Path, logger, device: torch.device,
                 dist_info: DistInfo = SINGLE_PROCESS, config_hashes: tuple[str, ...] = ()):
        self.cfg, self.task, self.run_dir, self.logger = cfg, task, run_dir, logger
        # the first is written into checkpoints; any of them is this run's (earlier versions)
        self.device, self.dist, self.config_hashes = device, dist_info, config_hashes
        self.config_hash = config_hashes[0] if config_hashes else ""
        self.is_main = dist_info.is_main
        self.model = task.model
        self._signal: int | None = None
        self.amp_dtype = resolve_precision(cfg.precision, device)
        self.optimizer = build_optimizer(self.model, cfg.lr, tuple(cfg.betas), cfg.eps,
                                         cfg.weight_decay)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.step = 0
        # steps since the last update: skipped by nan_policy=skip, and fp16 overflows the
        # loss scaler skipped; each has its own give-up count
        self.skipped_in_row = self.overflows_in_row = 0
        self.skipped_since_log = 0  # both kinds, reported at the next logged step
        self.val_pending = False  # a signal cut the periodic validation of self.step short
        self.saved_step = -1  # the step of the newest checkpoint written or resumed from
        self.train_seconds = 0.0  # wall time of fit() up to self.step, over every resume
        # every code version (sigma_moe/framework/code_version.py) that trained up to self.step
        self.code_fingerprints = [code_fingerprint()]
        # and every precision (trainer.precision=auto follows the device of each leg)
        self.precision = precision_name(self.amp_dtype)  # this process's
        self.precisions = [self.precision]

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "task": self.task.state_dict(), "rng": all_gather_object(rng_state()),
                "config_hash": self.config_hash, "metrics_bytes": self.logger.size(),
                "train_seconds": self.train_seconds, "code_fingerprints": self.code_fingerprints,
                "precisions": self.precisions, "skipped_in_row": self.skipped_in_row,
                "overflows_in_row": self.overflows_in_row,
                "skipped_since_log": self.skipped_since_log, "val_pending": self.val_pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(in_groups_of(state["optimizer"], self.optimizer,
                                                    list(self.model.parameters())))
        self.scaler.load_state_dict(state["scaler"])
        self.task.load_state_dict(state["task"])
        rngs = state["rng"]  # one per rank
        self.load_progress(state)
        if self.is_main and len(rngs) != self.dist.world_size:
            note(f"note: resuming on {self.dist.world_size} rank(s) a run that {len(rngs)} "
                 f"trained until step {self.step}: each rank draws its own dropout masks, so "
                 f"the result will equal neither count's uninterrupted run")
        if self.dist.rank < len(rngs):
            set_rng_state(rngs[self.dist.rank])
        else:  # resumed on more ranks: a stream of its own (a copy of rank 0's would give
            # the same dropout masks on two ranks)
            seed_everything(hash((self.cfg.seed, self.dist.rank, self.step)) % 2**31)
        self.logger.truncate(state.get("metrics_bytes"))  # the steps redone are logged anew
        self.skipped_in_row = int(state.get("skipped_in_row", 0))  # a requeue counts on
        self.overflows_in_row = int(state.get("overflows_in_row", 0))
        self.skipped_since_log = int(state.get("skipped_since_log", 0))
        self.val_pending = bool(state.get("val_pending", False))

    def load_progress(self, state: dict[str, Any]) -> None:
        """The step, the training time and the code versions of a checkpoint (also what
        mode=eval reports of the run it evaluates)."""
        self.step = int(state["step"])
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.code_fingerprints = list(state.get("code_fingerprints") or [UNRECORDED])
        self.precisions = list(state.get("precisions") or [UNRECORDED])

    def checkpoint(self) -> None:
        state = self.state_dict()  # collective under DDP (memory and RNG of every rank)
        # weights saved already (a preemption or the last step while steps are skipped):
        # prune nothing, the older checkpoints predate the trouble
        keep = 0 if self.weights_saved() else self.cfg.keep_checkpoints
        error = None
        if self.is_main:
            try:
                save_checkpoint(self.run_dir, self.step, state, keep)
            except OSError as e:  # a full disk, a lost mount: every rank stops, none waits
                error = (f"cannot write the step-{self.step} checkpoint in {self.run_dir} "
                         f"({e}); the previous checkpoints are kept: free space and rerun")
        error = broadcast_from_main(error)  # also the barrier: written before anyone goes on
        if error is not None:
            raise CheckpointError(error, shared=True)
        self.saved_step = self.step

    def weights_saved(self) -> bool:
        """Whether a checkpoint holds the current weights already: those of the last applied
        step, which skipped steps (nan_policy=skip, fp16 overflows) leave as they were."""
        return self.saved_step >= self.step - self.skipped_in_row - self.overflows_in_row

    def check_own(self, state: dict[str, Any], hashes: tuple[str, ...] = (),
                  advice: str = "pass fresh=true to start a new run beside it, or "
                                "hydra.run.dir=<new dir> (or move that file away if it was "
                                "copied in)") -> None:
        """ConfigError unless the checkpoint `state` is one of the config's (not a run of
        another config, nor a file copied in from one). `hashes`: the config's (default
        this trainer's, today's first)."""
        hashes = hashes or self.config_hashes
        if hashes and state.get("config_hash") not in (None, *hashes):
            raise ConfigError(
                f"{checkpoint_path(self.run_dir, int(state['step'])).name} in {self.run_dir} "
                f"is a checkpoint of another config (hash {state['config_hash']}, not "
                f"{hashes[0]}); {advice}")

    def resume(self) -> bool:
        # rank 0 picks the checkpoint (and moves broken ones aside); the others load that one
        state = None
        if self.is_main:
            try:
                state = load_latest(self.run_dir, warn=note, repair=True)
            except CheckpointUnloadable as e:  # every rank stops (said below), none waits
                state = str(e)
            broken = len(list_broken(self.run_dir))  # this time's and any earlier run's
            if state is None and broken:  # not a silent start over: the user decides
                state = (f"none of the {broken} checkpoints in {self.run_dir} loads (moved "
                         f"aside as *.pt.bad); to resume, repair one and rename it back to "
                         f"*.pt; to start over, pass fresh=true (a new sibling directory)")
        said = broadcast_from_main(state if isinstance(state, str) else
                                   None if state is None else int(state["step"]))
        if isinstance(said, str):
            raise CheckpointError(said, shared=True)
        step = said
        if step is None:
            return False
        if state is None:
            state = load_checkpoint(checkpoint_path(self.run_dir, step))
        self.check_own(state)
        self.load_state_dict(state)
        self.saved_step = self.step
        return True

    # -- loop ----------------------------------------------------------------------------
    def autocast(self):
        if self.amp_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(self.step, cfg.steps, cfg.warmup_steps, cfg.schedule)
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, Any] = {}  # tensors on the device until the step ends
        losses = self.task.train_losses(cfg.grad_accum)
        while True:
            with self.autocast():
                item = next(losses, None)
            if item is None:
                break
            loss, metrics = item
            self.scaler.scale(loss / cfg.grad_accum).backward()
            for k, v in metrics.items():  # device tensors: one sync per step, not per batch
                v = v.double() if torch.is_tensor(v) else v
                totals[k] = totals.get(k, 0.0) + v / cfg.grad_accum
        self.scaler.unscale_(self.optimizer)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        # clipping stays on the device: the norm reaches the host with the metrics, in the
        # step's one wait for the GPU
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        totals = to_host({**totals, "grad_norm": norm})
        grad_norm = totals.pop("grad_norm")  # equal on every rank (gradients are all-reduced)
        totals = mean_over_ranks(totals)  # every rank decides the same (skip/stop) below
        loss_finite = math.isfinite(totals.get("loss", 0.0))
        # fp16: a gradient overflow is the scaler's (it skips the step and lowers the
        # scale); a non-finite loss is not (the scaling comes after it) and would be
        # skipped forever
        if not loss_finite or (not math.isfinite(grad_norm) and not self.scaler.is_enabled()):
            self._diverged(totals, grad_norm)
            self.optimizer.zero_grad(set_to_none=True)  # nan_policy == skip
            self.task.discard_step()
            totals["skipped"] = 1.0
        else:
            self.scaler.step(self.optimizer)  # fp16 overflow: the scaler skips the update
            if math.isfinite(grad_norm):
                self.skipped_in_row = self.overflows_in_row = 0
            else:
                self._overflowed()
                totals["skipped"] = 1.0
        self.scaler.update()
        totals["grad_norm"] = grad_norm
        totals["lr"] = self.optimizer.param_groups[0]["lr"]
        return totals

    def _diverged(self, totals: dict[str, float], grad_norm: float) -> None:
        where = nonfinite_report(self.model)
        msg = (f"non-finite loss/gradient at step {self.step + 1}: "
               f"{', '.join(f'{k}={v:.4g}' for k, v in totals.items())}, "
               f"grad_norm={grad_norm:.4g}{where}")
        if self.cfg.nan_policy == "stop":
            raise TrainingDiverged(msg + (
                ". The last good checkpoint is kept: rerun with trainer.nan_policy=skip to "
                "resume from it skipping such steps, or lower trainer.lr (a new run)"
                if list_checkpoints(self.run_dir) else
                ". No checkpoint was written yet: lower trainer.lr, or rerun with "
                "trainer.nan_policy=skip to skip such steps"))
        self.skipped_in_row += 1
        if self.skipped_in_row >= MAX_SKIPPED_IN_ROW:  # the weights themselves are bad
            raise TrainingDiverged(
                f"trainer.nan_policy=skip skipped {self.skipped_in_row} steps in a row, up to "
                f"step {self.step + 1}: every batch gives a non-finite loss or gradient with "
                f"these weights, so skipping cannot help; lower trainer.lr and start over "
                f"(fresh=true)")
        if self.is_main:  # every rank skips the same step (the totals are all-reduced)
            note("warning: skipping step: " + msg)

    def _overflowed(self) -> None:
        """An fp16 step the GradScaler skipped (a gradient overflowed at this loss scale;
        it halves the scale). A few in a row are how it finds its scale; many mean that no
        scale helps (the default 2^16 halved 31 times is 2^-15)."""
        self.overflows_in_row += 1
        if self.overflows_in_row >= MAX_OVERFLOWS_IN_ROW:
            raise TrainingDiverged(
                f"trainer.precision=fp16: the gradient overflowed in {self.overflows_in_row} "
                f"steps in a row, up to step {self.step + 1} (loss scale now "
                f"{self.scaler.get_scale():.3g}): no update since; lower trainer.lr, or train "
                f"in bf16 (trainer.precision=bf16) and start over (fresh=true)")

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    def _on_interrupt(self, signum, frame) -> None:
        """Ctrl-C: finish the step, checkpoint, stop; a second Ctrl-C stops at once."""
        self._signal = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.is_main:  # a terminal's Ctrl-C reaches every rank: one line, not one a rank
            note("interrupted: stopping after this step with a checkpoint (Ctrl-C again to "
                 "stop at once, losing the steps since the last checkpoint)")

    def _preempted(self) -> bool:
        """Whether any rank got a preemption signal (collective under DDP: all agree)."""
        if self.dist.enabled:
            if mean_over_ranks({"s": float(self._signal or 0)})["s"] > 0:
                self._signal = self._signal or signal.SIGTERM
        return self._signal is not None

    def fit(self) -> None:
        ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # no one else's
        with handling(self.cfg.preempt_signals, self._on_signal), \
                handling(("SIGINT",) if ours else (), self._on_interrupt):
            self._fit()
        if self._signal is not None:  # checkpoint written: now let the signal do its job
            if self.is_main:
                note(f"{signal.Signals(self._signal).name} at step {self.step}: checkpoint "
                     f"written in {self.run_dir}; rerun the same command to resume")
            if self._signal == signal.SIGINT:
                raise Interrupted
            self._stop_by(self._signal)

    def _stop_by(self, signum: int) -> NoReturn:
        """Let `signum` do what its handler does now. The default action ends the process
        past the callers' `finally`s: the logger is closed first (wandb would lose every row
        since its last flush). A handler that returned: stop anyway."""
        self.logger.close()
        signal.raise_signal(signum)
        raise SystemExit(128 + signum)

    @contextmanager
    def said_on_signal(self, what: str) -> Iterator[None]:
        """While `what` runs (the final evaluation, after fit has put the handlers back): a
        preemption signal does what it would have done (the default: stop; submitit's
        handler: requeue, or log and go on; ignored), after a line saying that a rerun does
        `what` again (before: a stop without a line, rc 143)."""
        previous: dict[int, Any] = {}  # filled as the handlers go in

        def on_signal(signum, frame):
            if self.is_main:
                note(f"{signal.Signals(signum).name} during {what}: the step-{self.step} "
                     f"checkpoint in {self.run_dir} stays; if the run stops here, rerunning "
                     f"the same command does it again")
            theirs = previous.get(signum, signal.SIG_DFL)
            if callable(theirs):
                theirs(signum, frame)
            elif theirs == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                self._stop_by(signum)

        with handling(self.cfg.preempt_signals, on_signal) as replaced:
            previous.update(replaced)
            yield

    def _precompile(self) -> None:
        """On a GPU, the task compiles its kernels ahead where it can (LMTask.precompile:
        the Triton autotune configs in parallel), so that the first step does not compile
        them one by one. Only a time saver: whatever goes wrong is a note, and the kernels
        then compile when first run."""
        if (self.device.type != "cuda" or not hasattr(self.task, "precompile")
                or self.step >= self.cfg.steps):
            return
        try:
            said = self.task.precompile(self.cfg.grad_accum, self.amp_dtype)
        except Exception as err:
            said = [(f"precompile: failed ({type(err).__name__}: {err})", True)]
        for line, failed in said:  # the main process's lines, and any process's failure
            if self.is_main or failed:
                note(line if self.is_main else f"rank {self.dist.rank}: {line}")

    def _continue_code(self) -> None:
        """After a resume: this code trains on, one more version when it is another; and in
        this precision, one more when it is another (trainer.precision=auto: bf16 on a GPU,
        fp32 on a CPU)."""
        if self.is_main:
            tqdm.write(f"resumed from step {self.step} in {self.run_dir}")
        self._carry_on(self.code_fingerprints, code_fingerprint(), lambda before, now: (
            f"were trained by other code (code fingerprint {before}, this code's is {now})"))
        self._carry_on(self.precisions, self.precision, lambda was, now: (
            f"were trained in {was}, this process computes in {now} (trainer.precision="
            f"{self.cfg.precision} on {self.device.type})"))

    def _carry_on(self, legs: list[str], now: str, differs) -> None:
        """One more entry in `legs` (what trained the run so far) when `now` is another,
        said unless the earlier one was not recorded."""
        if self.is_main and legs[-1] not in (now, UNRECORDED):
            tqdm.write(f"note: steps up to {self.step} {differs(legs[-1], now)}; results.json "
                       f"will list both")
        if legs[-1] != now:
            legs.append(now)

    def _validate(self, shown: bool) -> None:
        """The periodic validation of self.step. A signal ends it: the checkpoint comes first
        (torchrun kills its workers 30 s after passing on a Ctrl-C or SIGTERM; a Slurm grace
        time is short), and the resumed run does it before its first step."""
        result = self.task.validate(stop=lambda: self._signal is not None)
        self.val_pending = result is None
        if result is None:
            if self.is_main:
                note(f"the step-{self.step} validation was left unfinished; the resumed run "
                     f"does it first")
        else:
            self.logger.log({f"valid/{k}": v for k, v in result.items()}, self.step)
            if shown:
                tqdm.write(f"step {self.step} | valid " + " | ".join(
                    f"{k} {v:.4f}" for k, v in result.items() if k != "tokens"))
        self.model.train()

    def _fit(self) -> None:
        cfg = self.cfg
        if self.resume():
            self._continue_code()
        else:  # from step 0: rows of an earlier start of this run (stopped before its first
            # checkpoint; a directory of another run's is refused,
            # sigma_moe/framework/run_dirs.py) go
            self.logger.truncate(0)
        self._precompile()
        if self.val_pending and self.step < cfg.steps:  # cut short by the signal that stopped
            self._validate(self.is_main and cfg.progress)  # the last leg
            if self._preempted():  # cut short again: the step's checkpoint still says so
                return
        self.model.train()
        t0, tokens = time.perf_counter(), 0
        clock = t0  # the time of the steps redone after a resume counts once
        shown = self.is_main and cfg.progress
        # a log file (Slurm, nohup) gets a line per log_every steps, not a bar redrawn in it
        lines = shown and not sys.stderr.isatty()
        # closed on an error too, so that the error's line does not end up glued to the bar
        with tqdm(total=cfg.steps, initial=self.step, dynamic_ncols=True, desc="train",
                  disable=not shown or lines) as bar:
            while self.step < cfg.steps:
                metrics = self.train_step()
                self.skipped_since_log += int(metrics.pop("skipped", 0))
                self.step += 1
                tokens += self.task.tokens_per_step
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    if self.skipped_since_log:  # steps without an update since the last row
                        metrics["skipped"], self.skipped_since_log = self.skipped_since_log, 0
                    dt = time.perf_counter() - t0
                    metrics["tokens_per_s"] = tokens / max(dt, 1e-9)
                    bar.set_postfix(loss=f"{metrics['loss']:.3f}",
                                    tok_s=f"{metrics['tokens_per_s']:.0f}")
                    if lines:
                        left = (cfg.steps - self.step) * dt * self.task.tokens_per_step / tokens
                        note(f"step {self.step}/{cfg.steps} | loss {metrics['loss']:.3f} | "
                             f"{metrics['tokens_per_s']:.0f} tok/s | "
                             f"{tqdm.format_interval(left)} left")
                    self.logger.log({f"train/{k}": v for k, v in metrics.items()}, self.step)
                    t0, tokens = time.perf_counter(), 0
                if self.step % cfg.val_every == 0 and self.step < cfg.steps:
                    self._validate(shown)
                    t0, tokens = time.perf_counter(), 0  # tokens/s: of the training only
                now = time.perf_counter()
                self.train_seconds, clock = self.train_seconds + now - clock, now
                preempted = self._preempted()
                # while steps are skipped the weights are saved once, not again and again,
                # which would prune the checkpoints from before the trouble
                periodic = self.step % cfg.ckpt_every == 0 and not self.weights_saved()
                if periodic or self.step == cfg.steps or preempted:
                    self.checkpoint()
                    t0, tokens = time.perf_counter(), 0
                if preempted:
                    break
