"""Data parallelism (torchrun / Slurm via submitit): process group, rank info, helpers.

`torchrun --nproc_per_node N run.py +exp=...` sets RANK / WORLD_SIZE / LOCAL_RANK; under
Slurm (hydra-submitit-launcher with tasks_per_node > 1) submitit's JobEnvironment gives
the same. gloo on CPU, nccl on CUDA. Without either, everything runs in one process.
"""
from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = DistInfo()


def _from_submitit() -> DistInfo | None:
    """Rank info of a multi-task Slurm job, exported as torch's env:// variables by
    submitit (MASTER_ADDR = first host, MASTER_PORT kept if set, else seeded by the job id)."""
    if "SLURM_JOB_ID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return None
    try:
        from submitit.helpers import TorchDistributedEnvironment

        # keep every GPU visible: the trainer picks cuda:<local rank> itself
        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False,
                                                   overwrite=True)
    except (ImportError, RuntimeError):
        return None
    return DistInfo(env.rank, env.world_size, env.local_rank)


def env_rank(local: bool = False) -> str:
    """This process's rank ("0" alone), or its rank on its node: from what torchrun (RANK,
    LOCAL_RANK) or Slurm (SLURM_PROCID, SLURM_LOCALID) sets, so it holds before the process
    group exists (a bad override is found first)."""
    torch_name, slurm_name = ("LOCAL_RANK", "SLURM_LOCALID") if local else ("RANK",
                                                                             "SLURM_PROCID")
    return os.environ.get(torch_name, os.environ.get(slurm_name, "0"))


def main_process() -> bool:
    return env_rank() == "0"


def _world_size() -> int:
    """Processes in the group (1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group if launched with several processes; no-op otherwise."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(),
                        int(os.environ.get("LOCAL_RANK", 0)))
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                        int(os.environ.get("LOCAL_RANK", 0)))
    else:
        info = _from_submitit() or DistInfo()
    if info.enabled:
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":  # before any collective: nccl runs on the current device
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)
        # ranks leaving with the group alive (a finished run's rerun exits right after one
        # broadcast) died in gloo's destructor: "terminate called", SIGABRT, 1 run in 4
        atexit.register(_leave_group)
    return info


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_cat(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate a tensor of equal shape from every rank (rank order)."""
    if _world_size() == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


def all_gather_object(obj: Any) -> list[Any]:
    if _world_size() == 1:
        return [obj]
    out: list[Any] = [None] * _world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's (picklable) obj, on every rank."""
    if _world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Average scalar metrics over ranks (what one process with the whole batch logs)."""
    if _world_size() == 1:
        return values
    keys = sorted(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: float(v) / _world_size() for k, v in zip(keys, t.tolist())}


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose gradient is the sum of the ranks' gradients (every rank's loss
    uses every rank's x). torch.distributed.nn's all_reduce does this but is deprecated, and
    its functional-collectives successor is differentiable only in recent torch."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _AllReduceSum.apply(grad)


def global_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over data-parallel workers, differentiable (REFERENCE: all-reduced reg.)."""
    if _world_size() == 1:
        return x
    return _AllReduceSum.apply(x) / _world_size()
