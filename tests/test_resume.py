"""Stopping and resuming a run: exact resume (RNG, loss scale, data, memory), what a
checkpoint holds, signals during validation and the final evaluation, and a resume on
other ranks or in another precision."""
import json

import pytest
import torch

from sigma_moe.framework.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from sigma_moe.framework.trainer import Trainer
from sigma_moe.tasks import TASKS
from tests.helpers import (
    TINY,
    TINY_MOE,
    compose_cfg,
    interrupt_after_first_checkpoint,
    losses,
    metrics,
)

RUN = TASKS.get("lm")


@pytest.mark.parametrize("ffn", ["sigma_moe", "dense"])
def test_resume_gives_identical_losses(tmp_path, monkeypatch, ffn):
    common = [*TINY, "trainer.val_every=5", "trainer.log_every=1", "task.val_segments=1",
              "model.dropout=0.1", "trainer.steps=12", "trainer.ckpt_every=6"]
    common += [*TINY_MOE, "ffn.expert_dropout=0.1"] if ffn == "sigma_moe" else ["ffn.d_ff=64"]
    cfg = compose_cfg(common, "mini_moe" if ffn == "sigma_moe" else "mini_dense")
    RUN(cfg, tmp_path / "a")
    # The same run, interrupted right after its step-6 checkpoint, then rerun as is.
    interrupt_after_first_checkpoint(monkeypatch, cfg, tmp_path / "b")
    resumed = RUN(cfg, tmp_path / "b")
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert list(b) == list(range(1, 13))
    assert a == b  # bitwise-identical losses on CPU
    ref = json.loads((tmp_path / "a" / "results.json").read_text())
    assert resumed["valid"] == ref["valid"] and resumed["test"] == ref["test"]


def test_resuming_on_another_number_of_ranks_says_so(tmp_path, capsys):
    """Each rank has its own dropout stream: the result differs from both uninterrupted
    runs (measured: 5.5314 resuming 1 -> 2 ranks, 5.5287 on 1, 5.5474 on 2)."""

    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=4", "trainer.ckpt_every=2"])
    RUN(cfg, tmp_path)
    (tmp_path / "results.json").unlink()
    (tmp_path / "checkpoint_00000004.pt").unlink()
    state = load_checkpoint(tmp_path / "checkpoint_00000002.pt")
    save_checkpoint(tmp_path, 2, {**state, "rng": state["rng"] * 2})  # as 2 ranks wrote it
    capsys.readouterr()
    RUN(cfg, tmp_path)
    assert ("note: resuming on 1 rank(s) a run that 2 trained until step 2: each rank draws "
            "its own dropout masks") in capsys.readouterr().err


@pytest.mark.parametrize("theirs", ["returns", "default"])
def test_a_signal_during_the_final_evaluation_says_so(tmp_path, monkeypatch, capsys, theirs):
    """After fit the handlers are back: a SIGTERM/SIGUSR* there stopped the run with no line
    (rc 143). It does what it did (a handler of someone else's, as submitit's that logs and
    returns: the evaluation goes on; the default: stop), after the line."""
    import os
    import signal

    from sigma_moe.tasks.lm import LMTask

    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=2", "trainer.ckpt_every=2"])
    from sigma_moe.framework.loggers import RunLogger

    got, raised, real_close = [], [], RunLogger.close
    previous = signal.signal(signal.SIGUSR1, (lambda *a: got.append("theirs")) if
                             theirs == "returns" else signal.SIG_DFL)
    monkeypatch.setattr(signal, "raise_signal", raised.append)  # the default would stop pytest
    # the default action ends the process past the callers' `finally`: wandb closed first
    monkeypatch.setattr(RunLogger, "close", lambda self: raised.append("close") or
                        real_close(self))
    real = LMTask.evaluate

    def evaluate(self, split, *args, **kwargs):
        if split == "test" and kwargs.get("stats"):
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(self, split, *args, **kwargs)

    monkeypatch.setattr(LMTask, "evaluate", evaluate)
    try:
        if theirs == "returns":
            assert RUN(cfg, tmp_path)["steps"] == 2 and got == ["theirs"]
            assert signal.SIGUSR1 not in raised
        else:
            with pytest.raises(SystemExit) as e:
                RUN(cfg, tmp_path)
            assert e.value.code == 128 + signal.SIGUSR1
            assert raised[:2] == ["close", signal.SIGUSR1]
            assert not (tmp_path / "results.json").exists() and list_checkpoints(tmp_path)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert (f"SIGUSR1 during the final evaluation: the step-2 checkpoint in {tmp_path} stays; "
            f"if the run stops here, rerunning the same command does it again"
            ) in capsys.readouterr().err


def test_a_signal_during_a_periodic_validation_checkpoints_first(tmp_path, monkeypatch,
                                                                   capsys):
    """The validation stops at its next segment and the checkpoint is written: torchrun
    SIGKILLs its workers 30 s after passing a signal on, and a WT-B validation takes longer
    (the promised checkpoint was lost). The resumed run does that validation first. The
    logger is closed before the signal ends the process (wandb lost its unwritten rows)."""
    import os
    import signal

    from sigma_moe.framework.loggers import RunLogger
    from sigma_moe.tasks.lm import LMTask

    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=6", "trainer.val_every=2",
                       "trainer.ckpt_every=100", "trainer.log_every=1"])
    events, segments, real, real_close = [], [], LMTask.evaluate, RunLogger.close
    # the default action would stop pytest
    monkeypatch.setattr(signal, "raise_signal", lambda s: events.append(("raise", s)))
    monkeypatch.setattr(RunLogger, "close", lambda self: events.append("close") or
                        real_close(self))

    def evaluate(self, split, *args, stop=None, **kwargs):
        if stop is not None:  # the periodic validation: SIGTERM arrives in it
            os.kill(os.getpid(), signal.SIGTERM)

            def counted():
                segments.append(stop())
                return segments[-1]
            return real(self, split, *args, stop=counted, **kwargs)
        return real(self, split, *args, **kwargs)

    monkeypatch.setattr(LMTask, "evaluate", evaluate)
    with pytest.raises(SystemExit) as e:
        RUN(cfg, tmp_path)
    assert e.value.code == 128 + signal.SIGTERM
    assert events[:2] == ["close", ("raise", signal.SIGTERM)]
    assert segments == [True]  # not one segment evaluated
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt"]
    assert not any("valid/loss" in r for r in metrics(tmp_path))
    assert ("the step-2 validation was left unfinished; the resumed run does it first"
            in capsys.readouterr().err)
    # cut short again while the resumed run redoes it: that run stops before training
    with pytest.raises(SystemExit):
        RUN(cfg, tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt"]
    monkeypatch.undo()
    RUN(cfg, tmp_path)
    assert [r["step"] for r in metrics(tmp_path) if "valid/loss" in r] == [2, 4]
    assert not load_checkpoint(list_checkpoints(tmp_path)[-1])["val_pending"]


def test_a_resume_in_another_precision_says_so_and_results_list_both(tmp_path, monkeypatch,
                                                                     capsys):
    """trainer.precision=auto is bf16 on a GPU and fp32 on a CPU: a run moved between them
    changes precision without changing its config."""
    from sigma_moe.framework import trainer as trainer_module

    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=4", "trainer.ckpt_every=2"])
    monkeypatch.setattr(trainer_module, "resolve_precision", lambda p, d: torch.bfloat16)
    interrupt_after_first_checkpoint(monkeypatch, cfg, tmp_path)
    assert load_checkpoint(tmp_path / "checkpoint_00000002.pt")["precisions"] == ["bf16"]
    monkeypatch.undo()
    capsys.readouterr()
    RUN(cfg, tmp_path)
    assert ("note: steps up to 2 were trained in bf16, this process computes in fp32 "
            "(trainer.precision=auto on cpu); results.json will list both"
            ) in capsys.readouterr().out
    assert json.loads((tmp_path / "results.json").read_text())["precision"] == ["bf16", "fp32"]


def test_checkpoint_holds_everything_needed(tmp_path):
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=4", "trainer.ckpt_every=2",
                       "trainer.keep_checkpoints=2", "task.val_segments=1"])
    RUN(cfg, tmp_path)
    ckpts = list_checkpoints(tmp_path)
    assert [p.name for p in ckpts] == ["checkpoint_00000002.pt", "checkpoint_00000004.pt"]
    state = torch.load(ckpts[-1], weights_only=False)
    assert {"model", "optimizer", "scaler", "task", "rng", "step", "config_hash"} <= set(state)
    assert state["task"]["batcher"] == {"epoch": 0, "step_in_epoch": 4}
    assert len(state["task"]["mems"]) == 2 and state["task"]["mems"][0].shape == (4, 32, 32)
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_restores_the_fp16_loss_scale(tmp_path, monkeypatch):
    """The GradScaler's scale is part of the state: a resumed fp16 run must not start over
    at 65536 and overflow its way down again (nor skip the steps that takes)."""
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.precision=fp16", "trainer.steps=4",
                       "trainer.ckpt_every=2", "task.val_segments=1", "task.final_segments=1"])
    real_checkpoint = Trainer.checkpoint

    def checkpoint_with_backed_off_scale(self):
        self.scaler.update(new_scale=1234.0)  # as if overflows had lowered it
        real_checkpoint(self)

    monkeypatch.setattr(Trainer, "checkpoint", checkpoint_with_backed_off_scale)
    interrupt_after_first_checkpoint(monkeypatch, cfg, tmp_path)
    monkeypatch.undo()
    scales = []
    real_load = Trainer.load_state_dict

    def load(self, state):
        real_load(self, state)
        scales.append(self.scaler.get_scale())

    monkeypatch.setattr(Trainer, "load_state_dict", load)
    RUN(cfg, tmp_path)
    assert scales == [1234.0]
