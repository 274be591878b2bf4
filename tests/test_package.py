"""The package's import boundaries: one `sigma_moe` package that PyPI's packages named
`kernels` or `tasks` cannot shadow, and the GPU machine's subset (kernels and benchmark
scripts with torch + triton only: that machine has no Hydra, wandb or datasets)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what the GPU machine lacks (docs/DESIGN.md: "`sigma_moe/kernels/` and `scripts/bench_*.py`")
ABSENT_ON_GPU_MACHINE = ("hydra", "omegaconf", "wandb", "datasets", "sentencepiece")


def run_python(code: str, cwd: Path, path: list[Path]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


def test_same_named_pypi_packages_come_first_and_the_code_still_imports(tmp_path):
    """PyPI's `kernels` (Hugging Face) and `tasks` first on sys.path, as site-packages is
    before an editable install's path: the model, the task and the kernels still import
    (with top-level packages of those names, `from kernels import BACKENDS` hit theirs)."""
    impostors = tmp_path / "site"
    for name in ("kernels", "tasks", "models", "framework"):
        (impostors / name).mkdir(parents=True)
        (impostors / name / "__init__.py").write_text(f"raise ImportError('PyPI {name}')\n")
    code = ("import sigma_moe.kernels, sigma_moe.models.ffn, sigma_moe.tasks\n"
            "from sigma_moe.tasks import TASKS\n"
            "print(sorted(TASKS.names()), sigma_moe.kernels.__file__)\n")
    out = run_python(code, cwd=tmp_path, path=[impostors, ROOT])
    assert out.returncode == 0, out.stderr
    assert "'lm'" in out.stdout and str(ROOT / "sigma_moe" / "kernels") in out.stdout


BLOCK = "import sys\nfor m in {mods!r}: sys.modules[m] = None\n"


def test_the_kernels_and_models_import_without_hydra_wandb_or_datasets(tmp_path):
    code = BLOCK.format(mods=ABSENT_ON_GPU_MACHINE) + (
        "import sigma_moe.kernels, sigma_moe.models.transformer_xl, sigma_moe.models.ffn\n"
        "assert sigma_moe.kernels.BACKENDS\n")
    out = run_python(code, cwd=tmp_path, path=[ROOT])
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("script", ["bench_moe", "bench_train", "bench_products", "profile_moe",
                                    "bench_relshift", "ncu_table", "autotune_table"])
def test_gpu_check_scripts_start_without_hydra_wandb_or_datasets(tmp_path, script):
    """scripts/gpu_check.sh's steps: each parses its arguments with those missing (the
    imports at the top of a script are what a missing package breaks)."""
    path = ROOT / "scripts" / f"{script}.py"
    code = BLOCK.format(mods=ABSENT_ON_GPU_MACHINE) + (
        f"import runpy\nsys.argv = [{str(path)!r}, '--help']\n"
        f"runpy.run_path({str(path)!r}, run_name='__main__')\n")
    out = run_python(code, cwd=tmp_path, path=[ROOT])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")
