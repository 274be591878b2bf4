"""`pytest -p tests.fake_cuda`: torch says one CUDA device is here (this machine has none),
and each test records what it saw into the file $FAKE_CUDA_LOG (a JSON line per test:
node id, torch.cuda.is_available(), CUDA_VISIBLE_DEVICES). For tests/test_test_setup.py,
which checks that tests/conftest.py keeps the framework's tests off a GPU. Loaded by -p, so
before the conftest asks torch."""
import json
import os

import torch

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1


def pytest_runtest_call(item):
    if "FAKE_CUDA_LOG" not in os.environ:
        return
    with open(os.environ["FAKE_CUDA_LOG"], "a") as f:
        f.write(json.dumps([item.nodeid.split("/")[-1], torch.cuda.is_available(),
                            os.environ.get("CUDA_VISIBLE_DEVICES")]) + "\n")
