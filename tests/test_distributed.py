"""Data parallelism: 2 gloo processes == 1 process with the combined batch (issue 6)."""
import os
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from sigma_moe.tasks import TASKS
from tests.helpers import TINY, TINY_MOE, compose_cfg, metrics

COMMON = [*TINY, *TINY_MOE, "model.dropout=0.0", "trainer.steps=4", "trainer.log_every=1",
          "trainer.val_every=100", "trainer.ckpt_every=2", "task.final_segments=2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_rank(rank: int, world: int, port: int) -> None:
    """torch's env:// variables of one of `world` local processes (as torchrun sets them)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))


def _worker(rank: int, world: int, port: int, cfg: dict, run_dir: str) -> None:
    _as_rank(rank, world, port)
    import torch

    torch.set_num_threads(1)
    TASKS.get("lm")(cfg, Path(run_dir))
    torch.distributed.destroy_process_group()


def _choose_worker(rank: int, world: int, port: int, cfg: dict, run_dir: str) -> None:
    _as_rank(rank, world, port)
    import torch

    from sigma_moe.framework.config import ConfigError
    from sigma_moe.framework.run_dirs import choose_run_dir

    try:
        answer = str(choose_run_dir(cfg, Path(run_dir)))
    except ConfigError as e:
        answer = f"ConfigError: {e}"
    Path(run_dir).with_name(f"answer{rank}").write_text(answer)
    torch.distributed.destroy_process_group()


def _exit_worker(rank: int, world: int, port: int, out: str) -> None:
    import atexit

    import torch

    from sigma_moe.framework.distributed import init_distributed

    _as_rank(rank, world, port)
    init_distributed("cpu")
    atexit._run_exitfuncs()  # what interpreter exit runs
    Path(out).with_name(f"left{rank}").write_text(str(torch.distributed.is_initialized()))


def losses(run_dir):
    return [r["train/loss"] for r in metrics(run_dir) if "train/loss" in r]


@pytest.mark.parametrize("extra,exp", [
    # gamma > 0: the entropy regularizer's batch statistics must be all-reduced to match
    (["ffn.reg_gamma=0.01"], "mini_moe"),
    # accumulation: only the last micro-batch all-reduces (no_sync), which must not matter
    # (gamma = 0: the regularizer's statistics are per micro-batch, whose rows differ)
    (["ffn.reg_gamma=0.0", "trainer.grad_accum=2"], "mini_moe"),
    # Switch's balancing loss f . P: both means over the global batch, not per rank
    (["ffn.balance_coef=0.5"], "mini_enwik_switch"),
], ids=["reg", "grad_accum", "switch_balance"])
def test_two_gloo_processes_match_one_process(tmp_path, extra, exp):
    cfg = compose_cfg([*COMMON, *extra], exp)
    TASKS.get("lm")(cfg, tmp_path / "single")
    mp.start_processes(_worker, args=(2, free_port(), cfg, str(tmp_path / "ddp")), nprocs=2,
                       start_method="spawn")
    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(single) == len(ddp) == 4
    for a, b in zip(single, ddp):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
    # The checkpoint holds the memory of the whole batch, gathered from both ranks.
    import torch

    state = torch.load(sorted((tmp_path / "ddp").glob("checkpoint_*.pt"))[-1],
                       weights_only=False)
    ref = torch.load(sorted((tmp_path / "single").glob("checkpoint_*.pt"))[-1],
                     weights_only=False)
    assert state["task"]["mems"][0].shape == ref["task"]["mems"][0].shape == (4, 32, 32)
    assert len(state["rng"]) == 2
    torch.testing.assert_close(state["task"]["mems"][1], ref["task"]["mems"][1],
                               atol=1e-4, rtol=1e-4)


def test_ranks_leave_the_group_at_exit(tmp_path):
    """A rank exiting with the group alive could die in gloo's destructor ("terminate
    called without an active exception", SIGABRT): a finished run's rerun under torchrun
    failed 1 time in 4."""
    mp.start_processes(_exit_worker, args=(2, free_port(), str(tmp_path / "x")), nprocs=2,
                       start_method="spawn")
    assert [(tmp_path / f"left{r}").read_text() for r in range(2)] == ["False", "False"]


def test_rank_info_from_a_slurm_job(monkeypatch):
    """Under a multi-task Slurm job (submitit's environment), rank info and torch's env://
    variables come from submitit; every GPU stays visible (the trainer picks its own)."""
    from sigma_moe.framework.distributed import _from_submitit

    slurm = dict(SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="1",
                 SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node01",
                 SLURM_STEP_NODELIST="node01", SUBMITIT_EXECUTOR="slurm")
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(k, "")  # recorded, so that undo removes what submitit exports
        monkeypatch.delenv(k)
    info = _from_submitit()
    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)
    assert (os.environ["MASTER_ADDR"], os.environ["RANK"], os.environ["WORLD_SIZE"]) == (
        "node01", "1", "2")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("SLURM_NTASKS", "1")  # one task: not distributed
    assert _from_submitit() is None


@pytest.mark.parametrize("same_config", [True, False])
def test_ranks_agree_on_the_run_dir(tmp_path, same_config):
    """Rank 0 picks the directory and the others follow it: with fresh=true every rank
    trains in the same new sibling, and a refusal stops every rank (none waits forever)."""
    from sigma_moe.framework.experiment import config_hash, write_results

    cfg = compose_cfg(COMMON)
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    write_results(run_dir, {"config_hash": config_hash(cfg) if same_config else "other",
                            "metric": "bpc", "valid": {"bpc": 1.0}, "test": {"bpc": 1.0}})
    cfg = {**cfg, "fresh": same_config}
    mp.start_processes(_choose_worker, args=(3, free_port(), cfg, str(run_dir)), nprocs=3,
                       start_method="spawn")
    answers = {(tmp_path / "runs" / f"answer{r}").read_text() for r in range(3)}
    if same_config:
        assert answers == {str(tmp_path / "runs" / "r-2")}
        assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == [
            "r", "r-2"]
    else:
        assert len(answers) == 1 and answers.pop().startswith(
            "ConfigError: " + f"{run_dir} holds a finished run with another config")


def test_ranks_resume_from_the_checkpoint_rank_0_picked(tmp_path):
    """Rank 0 chooses the checkpoint (moving a broken newest one aside), the others load
    that same file: here the newest is truncated, so both must resume from step 2."""
    cfg = compose_cfg([*COMMON, "trainer.keep_checkpoints=3"])
    run = tmp_path / "ddp"
    mp.start_processes(_worker, args=(2, free_port(), cfg, str(run)), nprocs=2,
                       start_method="spawn")
    (run / "results.json").unlink()
    newest = run / "checkpoint_00000004.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    mp.start_processes(_worker, args=(2, free_port(), cfg, str(run)), nprocs=2,
                       start_method="spawn")
    assert (run / "checkpoint_00000004.pt.bad").exists() and (run / "results.json").exists()
    # steps 3 and 4 redone, logged once
    assert [r["step"] for r in metrics(run) if "train/loss" in r] == [1, 2, 3, 4]


def test_no_rank_of_one_seed_repeats_a_rank_of_another():
    """The paper's seeds 0-2 must draw independent dropout masks on every rank (seed + rank
    gave rank 1 of seed 0 rank 0 of seed 1's); rank 0 keeps the seed of one process."""
    from sigma_moe.framework.runtime import rank_seed

    assert len({rank_seed(seed, rank) for seed in range(3) for rank in range(8)}) == 24
    assert [rank_seed(seed, 0) for seed in range(3)] == [0, 1, 2]
