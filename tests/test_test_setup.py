"""tests/conftest.py on a GPU machine, with torch made to say it has one (tests/fake_cuda.py):
the framework's tests run on the CPU, the kernel tests see the GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_only_kernel_tests_see_a_gpu(tmp_path):
    log = tmp_path / "seen.jsonl"
    env = {**os.environ, "FAKE_CUDA_LOG": str(log)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    tests = [
        # its module fixture trains a run with trainer.device=auto first: with the GPU in
        # view that would be .to("cuda"), which this torch build cannot do
        "tests/test_trained.py::test_a_checkpoint_file_loads_its_step",
        "tests/test_kernels_triton_configs.py::test_tf32_is_read_from_either_torch_api",
    ]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.fake_cuda", *tests], cwd=ROOT, env=env, text=True,
                         capture_output=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen == [["test_trained.py::test_a_checkpoint_file_loads_its_step", False, ""],
                    ["test_kernels_triton_configs.py::test_tf32_is_read_from_either_torch_api",
                     True, None]]
