"""Test setup: the framework's tests on the CPU even where a GPU is, the kernel tests on the
GPU where there is one (else the Triton kernels under the interpreter; on a GPU without
autotuning), wandb disabled."""
import os

import torch

CUDA = torch.cuda.is_available()
# Before anything imports triton: without a GPU, run Triton kernels in the interpreter.
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# On a GPU: one block config per kernel variant, not a compile of each of six and timing
# trials (sigma_moe/kernels/triton_tuning.py AUTOTUNE); the GPU session's device time is short, and
# `scripts/bench_moe.py --check` verifies the autotuned kernels
os.environ.setdefault("SIGMA_MOE_TRITON_AUTOTUNE", "0")
os.environ.setdefault("SIGMA_MOE_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
torch.set_num_threads(min(2, torch.get_num_threads()))

import pytest  # noqa: E402

# the test files that see a GPU where there is one (_cuda_for_kernel_tests_only)
SEE_THE_GPU = ("test_kernels", "test_bench_")


def pytest_collection_modifyitems(config, items):
    elsewhere = [i.nodeid for i in items
                 if i.get_closest_marker("gpu") and not i.path.name.startswith(SEE_THE_GPU)]
    if elsewhere:
        raise pytest.UsageError(f"{elsewhere[0]} is marked gpu but its file does not see the "
                                f"GPU: move it to a tests/test_kernels*.py or test_bench_*.py file")
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _cuda_for_kernel_tests_only(request):
    """On a GPU machine, only the kernel and benchmark tests (test_kernels*.py and
    test_bench_*.py, which pick the GPU themselves; the `gpu` tests are among them) see it.
    The others (training, resume, CLI, data) were written for the CPU in fp32:
    `trainer.device=auto` would train them on the GPU in bf16, with atomics in index_add_,
    where they check exact numbers. Hidden in this process through torch.cuda (what `auto`
    and the scripts' defaults ask) and in the processes a test starts (run.py, torchrun,
    the scripts) through CUDA_VISIBLE_DEVICES. Module scope: autouse, so it comes before
    a module's own fixtures (a trained run shared by its tests)."""
    if not CUDA or request.path.name.startswith(SEE_THE_GPU):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: False)
        mp.setattr(torch.cuda, "device_count", lambda: 0)
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        yield


@pytest.fixture
def c4_dir(tmp_path):
    """Two C4-style train shards and one validation shard: (root, train docs, valid docs)."""
    from tests.data_helpers import write_shards

    train = write_shards(tmp_path / "c4", "en/c4-train.{:05d}-of-01024.json.gz", 2, 60, 3)
    valid = write_shards(tmp_path / "c4", "en/c4-validation.{:05d}-of-00008.json.gz", 1, 30, 4)
    return tmp_path / "c4", train, valid
