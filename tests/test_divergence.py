"""Never lose a run to a NaN (issue 8): `trainer.nan_policy=stop` stops with a message and keeps
the last good checkpoint; `skip` skips the step, its update and the memory it wrote."""
import pytest
import torch

from sigma_moe.framework.checkpoint import list_checkpoints, load_checkpoint
from sigma_moe.framework.divergence import TrainingDiverged
from sigma_moe.framework.trainer import Trainer
from tests.helpers import compose_cfg, metrics
from tests.test_faults import OVERRIDES, RUN


def test_nan_stops_with_a_message_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    real = Trainer.train_step

    def poisoned(self):
        if self.step == 3:
            with torch.no_grad():
                self.model.blocks[1].ffn.w1_EDG.fill_(float("nan"))
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    with pytest.raises(TrainingDiverged) as err:
        RUN(compose_cfg(OVERRIDES), tmp_path)
    msg = str(err.value)
    assert "at step 4" in msg and "blocks.1.ffn.w1_EDG" in msg and "\n" not in msg
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt"]
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # what the message advises: the same run with nan_policy=skip resumes from that checkpoint
    assert "rerun with trainer.nan_policy=skip" in msg
    monkeypatch.undo()
    resumed = []
    real_load = Trainer.load_state_dict
    monkeypatch.setattr(Trainer, "load_state_dict",
                        lambda self, s: (resumed.append(s["step"]), real_load(self, s)))
    assert RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)["steps"] == 10
    assert resumed == [2]


def test_nan_loss_stops_under_fp16_too(tmp_path, monkeypatch):
    """The fp16 loss scaler skips steps whose gradients overflow; a NaN loss is not such an
    overflow and still follows nan_policy (stop)."""
    nan_losses_at(monkeypatch, lambda n: True)
    with pytest.raises(TrainingDiverged, match="at step 1") as err:
        RUN(compose_cfg([*OVERRIDES, "trainer.precision=fp16"]), tmp_path)
    # before the first checkpoint the message promises none
    assert str(err.value).endswith(". No checkpoint was written yet: lower trainer.lr, or "
                                   "rerun with trainer.nan_policy=skip to skip such steps")


def test_fp16_overflows_are_skipped_steps_and_many_in_a_row_stop(tmp_path, monkeypatch):
    """A gradient that overflows at every loss scale (finite loss): each step the scaler
    skips is logged as skipped and leaves the weights alone, and MAX_OVERFLOWS_IN_ROW of
    them stop the run (before: 'finished' after 2 updates, with no line and results)."""
    from sigma_moe.framework import trainer

    monkeypatch.setattr(trainer, "MAX_OVERFLOWS_IN_ROW", 4)
    overflow_at(monkeypatch, lambda n: n >= 3)
    with pytest.raises(TrainingDiverged) as err:
        RUN(compose_cfg([*OVERRIDES, "trainer.precision=fp16"]), tmp_path)
    assert str(err.value).startswith("trainer.precision=fp16: the gradient overflowed in 4 "
                                     "steps in a row, up to step 6 (loss scale now ")
    assert [r["step"] for r in metrics(tmp_path) if r.get("train/skipped")] == [3, 4, 5]
    assert not (tmp_path / "results.json").exists()
    # no step-4 checkpoint: its weights are step 2's, saved already (no update since)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt"]


def test_overflows_do_not_count_towards_nan_skips_in_a_row(tmp_path, monkeypatch):
    """Each kind of step without an update has its own give-up count: a NaN loss after
    fp16 overflows is one skip, not the last of MAX_SKIPPED_IN_ROW."""
    from sigma_moe.framework import trainer

    monkeypatch.setattr(trainer, "MAX_SKIPPED_IN_ROW", 3)
    overflow_at(monkeypatch, lambda n: 3 <= n <= 6)
    nan_losses_at(monkeypatch, lambda n: n == 7)
    RUN(compose_cfg([*OVERRIDES, "trainer.precision=fp16", "trainer.nan_policy=skip"]),
        tmp_path)
    assert [r["step"] for r in metrics(tmp_path) if r.get("train/skipped")] == [3, 4, 5, 6, 7]


def test_skipped_steps_between_logged_rows_are_counted(tmp_path, monkeypatch):
    nan_losses_at(monkeypatch, lambda n: n in (3, 4))
    RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip", "trainer.log_every=5"]), tmp_path)
    rows = [(r["step"], r.get("train/skipped")) for r in metrics(tmp_path) if "train/loss" in r]
    assert rows == [(5, 2), (10, None)]


def test_the_count_of_skipped_steps_survives_a_resume(tmp_path, monkeypatch):
    """A skip before a checkpoint (step 4) and after the last logged row reaches the next
    row after a resume."""
    nan_losses_at(monkeypatch, lambda n: n == 3)
    real = Trainer.train_step

    def crash_at_5(self):
        if self.step == 4:
            raise RuntimeError("crashed")
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", crash_at_5)
    cfg = compose_cfg([*OVERRIDES, "trainer.nan_policy=skip", "trainer.log_every=5",
                       "trainer.ckpt_every=4"])
    with pytest.raises(RuntimeError, match="crashed"):
        RUN(cfg, tmp_path)
    monkeypatch.undo()
    RUN(cfg, tmp_path)
    rows = [(r["step"], r.get("train/skipped")) for r in metrics(tmp_path) if "train/loss" in r]
    assert rows == [(5, 1), (10, None)]


def overflow_at(monkeypatch, bad) -> None:
    """fp16: make a gradient of the training steps whose number n (from 1) has bad(n)
    overflow at any loss scale (the loss stays finite)."""
    real = Trainer.train_step

    def overflowing(self):
        if not bad(self.step + 1):
            return real(self)
        hook = self.model.blocks[0].ffn.w3_ED.register_hook(lambda g: g * float("inf"))
        try:
            return real(self)
        finally:
            hook.remove()

    monkeypatch.setattr(Trainer, "train_step", overflowing)


def nan_losses_at(monkeypatch, bad) -> None:
    """Make the losses of the training steps whose number n (from 1) has bad(n) NaN."""
    from sigma_moe.tasks.lm import LMTask

    real = LMTask.train_losses
    calls = [0]

    def poisoned(self, n):
        calls[0] += 1
        for loss, m in real(self, n):  # the loss metric too: a NaN loss, not an overflow
            yield ((loss * float("nan"), {**m, "loss": m["loss"] * float("nan")})
                   if bad(calls[0]) else (loss, m))

    monkeypatch.setattr(LMTask, "train_losses", poisoned)


def test_nan_skip_policy_skips_the_step(tmp_path, monkeypatch):
    nan_losses_at(monkeypatch, lambda n: n == 3)
    RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    skipped = [r["step"] for r in metrics(tmp_path) if r.get("train/skipped")]
    assert skipped == [3]
    assert all(torch.isfinite(v).all() for v in
               load_checkpoint(list_checkpoints(tmp_path)[-1])["model"].values())


def test_nan_skip_policy_gives_up_after_steps_skipped_in_a_row(tmp_path, monkeypatch):
    """Weights that give NaN on every batch: stop with a message, not 'train' to the end
    skipping every step and write NaN results. Skips with good steps between are fine."""
    from sigma_moe.framework import trainer

    monkeypatch.setattr(trainer, "MAX_SKIPPED_IN_ROW", 3)
    nan_losses_at(monkeypatch, lambda n: n == 2 or n >= 4)
    with pytest.raises(TrainingDiverged) as err:
        RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    assert str(err.value).startswith("trainer.nan_policy=skip skipped 3 steps in a row, up to "
                                     "step 6: every batch gives a non-finite loss")
    assert not (tmp_path / "results.json").exists()


def test_a_run_whose_final_evaluation_is_not_finite_has_not_finished(tmp_path, monkeypatch):
    """Weights gone bad in the last steps, fewer skipped than nan_policy=skip gives up after
    (a short run at a huge lr skips every step): the run is no result, and no results.json
    marks it finished with a NaN (invalid JSON, which every table then warns about)."""
    real = Trainer.fit

    def diverged(self):
        real(self)
        with torch.no_grad():
            self.model.blocks[1].ffn.w1_EDG.fill_(float("inf"))

    monkeypatch.setattr(Trainer, "fit", diverged)
    with pytest.raises(TrainingDiverged) as err:
        RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    assert str(err.value) == (
        "the valid set gives a non-finite loss nan, bpc nan with the weights of step 10: the "
        "run has diverged; lower trainer.lr and start over (fresh=true)")
    assert not (tmp_path / "results.json").exists()


def test_steps_skipped_in_a_row_do_not_prune_the_checkpoints_before_them(tmp_path,
                                                                          monkeypatch):
    """While steps are skipped the weights are those of the last applied step: saved once
    (step 4 holds step 3's), not at every ckpt_every, which kept only checkpoints of
    those weights and deleted step 2's, from before the trouble."""
    from sigma_moe.framework import trainer

    monkeypatch.setattr(trainer, "MAX_SKIPPED_IN_ROW", 5)
    nan_losses_at(monkeypatch, lambda n: n >= 4)
    with pytest.raises(TrainingDiverged, match="skipped 5 steps in a row, up to step 8"):
        RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000002.pt",
                                                           "checkpoint_00000004.pt"]


def test_a_preemption_while_steps_are_skipped_prunes_nothing_and_the_count_goes_on(
        tmp_path, monkeypatch):
    """A preemption checkpoint in a run of skipped steps holds the weights saved already: it
    deletes no older checkpoint (step 2's predates the trouble), and the requeued run goes
    on counting the steps skipped in a row."""
    import signal

    from sigma_moe.framework import trainer
    from sigma_moe.framework.trainer import Interrupted

    monkeypatch.setattr(trainer, "MAX_SKIPPED_IN_ROW", 6)
    nan_losses_at(monkeypatch, lambda n: n >= 4)
    real = Trainer._preempted

    def preempted_at_7(self):
        if self.step == 7:
            self._signal = signal.SIGINT  # (raised as Interrupted once checkpointed)
        return real(self)

    monkeypatch.setattr(Trainer, "_preempted", preempted_at_7)
    with pytest.raises(Interrupted):
        RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    assert [p.name[11:19] for p in list_checkpoints(tmp_path)] == ["00000002", "00000004",
                                                                  "00000007"]
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])["skipped_in_row"] == 4
    monkeypatch.setattr(Trainer, "_preempted", real)
    with pytest.raises(TrainingDiverged, match="skipped 6 steps in a row, up to step 9"):
        RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)


def test_nan_skip_policy_forgets_the_memory_of_the_skipped_step(tmp_path, monkeypatch):
    """A NaN in the forward also lands in the Transformer-XL memory: kept, it would make
    every later step NaN (and be checkpointed); the skipped step's memory is dropped."""
    from sigma_moe.tasks.lm import LMTask

    real = LMTask.train_losses
    calls = [0]

    def nan_forward_once(self, n):
        calls[0] += 1
        w = self.model.blocks[0].ffn.w1_EDG
        saved = w.detach().clone()
        if calls[0] == 3:
            with torch.no_grad():
                w.fill_(float("nan"))
        yield from real(self, n)
        with torch.no_grad():
            w.copy_(saved)  # only this step's forward is bad (its update is skipped)

    monkeypatch.setattr(LMTask, "train_losses", nan_forward_once)
    RUN(compose_cfg([*OVERRIDES, "trainer.nan_policy=skip"]), tmp_path)
    assert [r["step"] for r in metrics(tmp_path) if r.get("train/skipped")] == [3]
    state = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert all(torch.isfinite(m).all() for m in state["task"]["mems"])
    assert all(torch.isfinite(v).all() for v in state["model"].values())
