"""Test setup: CPU-only by default, Triton kernels under the interpreter, wandb disabled."""
import os

import torch

# Before anything imports triton: without a GPU, run Triton kernels in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
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
