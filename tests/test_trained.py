"""A trained run in Python (sigma_moe/tasks/trained.py): the model and data as run.py built
them, its evaluation equal to the run's own, nothing in the run directory touched."""
import json

import pytest
import torch

from sigma_moe.framework.checkpoint import (
    CheckpointError,
    CheckpointUnloadable,
    list_checkpoints,
    save_checkpoint,
)
from sigma_moe.framework.config import ConfigError
from sigma_moe.tasks import TASKS
from sigma_moe.tasks.trained import load_trained
from tests.helpers import TINY, TINY_MOE, compose_cfg


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "moe"
    # checkpoints at steps 2 and 4 (the two newest are kept); the final evaluation: 2 segments
    TASKS.get("lm")(compose_cfg([*TINY, *TINY_MOE, "trainer.steps=4", "trainer.ckpt_every=2",
                                 "task.final_segments=2", "name=tiny_moe"]), run_dir)
    return run_dir


def snapshot(run_dir):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")}


def test_evaluation_is_the_runs_own(run_dir):
    before = snapshot(run_dir)
    run = load_trained(run_dir, "cpu")
    results = json.loads((run_dir / "results.json").read_text())
    assert run.step == 4 and run.spec.name == "tiny_moe" and not run.model.training
    for split in ("valid", "test"):
        got = run.evaluate(split)
        assert got["tokens"] == 2 * 2 * 32  # 2 segments of eval_batch_size 2 x context 32
        assert got["bpc"] == pytest.approx(results[split]["bpc"], abs=1e-6), split
    routing = run.evaluate("valid", stats=True)["routing"]
    assert len(routing) == 2 and all(len(r["expert_share"]) == 4 for r in routing)
    # the model itself: logits over the data's vocabulary, one memory a layer
    x_BT = torch.from_numpy(run.data.split("valid")[:3 * 32].reshape(3, 32)).long()
    logits_BTV, mems = run.model(x_BT)
    assert logits_BTV.shape == (3, 32, run.data.vocab_size) and len(mems) == 2
    assert snapshot(run_dir) == before  # no file written, repaired or moved


def test_a_checkpoint_file_loads_its_step(run_dir):
    first = list_checkpoints(run_dir)[0]
    run = load_trained(first, "cpu")
    assert run.step == 2 and run.spec.run_dir == run_dir
    assert run.evaluate("valid", max_segments=1)["tokens"] == 2 * 32


def test_bad_input_is_one_clear_error(run_dir, tmp_path):
    with pytest.raises(ConfigError, match="does not exist: pass a run directory"):
        load_trained(tmp_path / "nowhere", "cpu")
    with pytest.raises(ConfigError, match="has no config.yaml"):
        load_trained(tmp_path, "cpu")
    if not torch.cuda.is_available():
        for device in ("cuda", torch.device("cuda")):
            with pytest.raises(ConfigError, match="^device='cuda' but no CUDA device"):
                load_trained(run_dir, device)
        with pytest.raises(ConfigError, match="^device='cuda:1' but no CUDA device"):
            load_trained(run_dir, "cpu").to(torch.device("cuda", 1))
    empty = tmp_path / "untrained"
    empty.mkdir()
    (empty / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    with pytest.raises(CheckpointError, match="no valid checkpoint in .*; train the run first"):
        load_trained(empty, "cpu")


class _Payload:  # pickles as a call of print: a checkpoint that would run code
    def __reduce__(self):
        return print, ("ran",)


def test_a_checkpoint_that_would_run_code_or_is_damaged_is_named_once(run_dir, tmp_path):
    """The run's newest checkpoint would call print: refused, named by its path (once), the
    run directory as it was; a damaged file passed directly: named, with what to pass."""
    import shutil

    copy = tmp_path / "shared"
    shutil.copytree(run_dir, copy)
    state = torch.load(list_checkpoints(copy)[-1], weights_only=True)
    evil = save_checkpoint(copy, 6, {**state, "x": _Payload()}, keep=0)
    before = snapshot(copy)
    for path in (copy, evil):
        with pytest.raises(CheckpointUnloadable) as e:
            load_trained(path, "cpu")
        assert str(e.value).startswith(f"{evil} holds a pickled print, which ")
    assert snapshot(copy) == before
    damaged = copy / "checkpoint_00000008.pt"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=f"^{damaged}: cannot be loaded .*; pass the run "
                                              f"directory .* or another checkpoint$"):
        load_trained(damaged, "cpu")


def test_the_readme_example_runs(run_dir):
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = readme.split("### A trained run in Python\n```python\n", 1)[1].split("```", 1)[0]
    assert '"runs/mini_moe"' in code
    scope: dict = {}
    exec(code.replace('"runs/mini_moe"', repr(str(run_dir))), scope)
    assert scope["logits_BTV"].shape == (2, 256, scope["run"].data.vocab_size)


def test_a_backend_that_cannot_run_on_the_device_is_one_clear_error(run_dir, monkeypatch):
    """read_run picks ffn.backend for the device it is given (a Triton run read for a GPU
    keeps triton): evaluated after .to() a device that cannot run it, a ConfigError saying
    how to load it, not the kernel's ValueError."""
    import dataclasses

    from sigma_moe import kernels

    run = load_trained(run_dir, "cpu")  # as if read for a GPU (the check reads model.cfg)
    ffn = dataclasses.replace(run.model.cfg.ffn, backend="triton")
    run.model.cfg = dataclasses.replace(run.model.cfg, ffn=ffn)
    monkeypatch.setattr(kernels, "backend_problem", lambda backend, *a: f"no {backend} here")
    with pytest.raises(ConfigError, match=r"^ffn.backend=triton cannot run on cpu \(no triton "
                                          r"here\); load the run with that device"):
        run.evaluate("valid")
