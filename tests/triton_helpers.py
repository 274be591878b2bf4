"""Shared by the Triton kernel tests: where they run (CUDA, else the interpreter that
tests/conftest.py switches on) and the ahead-of-time compile helpers. torch and triton only:
the GPU machines have no Hydra."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sigma_moe import kernels

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# e.g. Triton 3.6 (torch 2.11's) with numpy 2.4: say so instead of 20 interpreter errors
BROKEN_INTERPRETER = (kernels.HAS_TRITON and not CUDA and kernels.interpreter_problem()) or None
TRITON_MARKS = [
    pytest.mark.skipif(
        not kernels.HAS_TRITON or not (CUDA or kernels.TRITON_INTERPRET),
        reason="needs Triton and a GPU, or TRITON_INTERPRET=1 before kernels is imported"),
    pytest.mark.skipif(BROKEN_INTERPRETER is not None, reason=str(BROKEN_INTERPRETER)),
]


def outside_interpreter(*args: str) -> str:
    """stdout of `python *args` in a process without TRITON_INTERPRET (real Triton)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, *args], env=env, text=True, capture_output=True,
                         cwd=Path(kernels.__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# the head of a script for `outside_interpreter`: real Triton with a stand-in CUDA driver
# that targets sm_90 (compiles go through ptxas) and has nothing to launch with
STAND_IN_DRIVER = """
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

class StandIn:
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)

driver.set_active(StandIn())
"""


def need_hopper_toolchain() -> None:
    """Skip without ptxas or with a Triton older than the compile API of
    sigma_moe/kernels/triton_aot.py."""
    import triton

    from sigma_moe.kernels.triton_aot import aot_problem

    backend = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if importlib.util.find_spec("triton.backends.nvidia") is None or not backend.exists():
        pytest.skip("this Triton has no NVIDIA backend / ptxas")
    if problem := aot_problem():
        pytest.skip(problem)


def checks_of_a_failing_run(main, argv, path, match: str, capsys) -> list[str]:
    """A benchmark script's run that must stop with `match` after writing its JSON anew
    (scripts/bench_products.py): -> the `check` lines it printed."""
    path.unlink()
    with pytest.raises(SystemExit, match=match):
        main(argv)
    assert path.is_file()
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("check")]
