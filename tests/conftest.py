"""Test setup: CPU-only by default, Triton kernels under the interpreter (on a GPU: without
autotuning), wandb disabled."""
import os

import torch

# Before anything imports triton: without a GPU, run Triton kernels in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# On a GPU: one block config per kernel variant, not a compile of each of six and timing
# trials (sigma_moe/kernels/triton_tuning.py AUTOTUNE); the GPU session's device time is short, and
# `scripts/bench_moe.py --check` verifies the autotuned kernels
os.environ.setdefault("SIGMA_MOE_TRITON_AUTOTUNE", "0")
os.environ.setdefault("SIGMA_MOE_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
torch.set_num_threads(min(2, torch.get_num_threads()))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def c4_dir(tmp_path):
    """Two C4-style train shards and one validation shard: (root, train docs, valid docs)."""
    from tests.data_helpers import write_shards

    train = write_shards(tmp_path / "c4", "en/c4-train.{:05d}-of-01024.json.gz", 2, 60, 3)
    valid = write_shards(tmp_path / "c4", "en/c4-validation.{:05d}-of-00008.json.gz", 1, 30, 4)
    return tmp_path / "c4", train, valid
