"""Which code trained a run: a fingerprint of the training code, and its git commit.

A run's `config_hash` (sigma_moe/framework/experiment.py) says which config it trained, not which
code: a run from before a change of the model or the kernels has the same hash as one after
it, and a table of both mixes two versions silently. So a run records the code too:

- `fingerprint`: sha256 (12 hex digits) over the source of the packages that decide what a
  training run computes (CODE, below), path and bytes of every file. Equal fingerprints,
  equal code: it needs no git (a copied or pip-installed tree), and script or doc commits
  leave it alone. Any edit of a listed file changes it, a comment too.
- `git`: `git describe`-like `<commit>` or `<commit>+dirty` (the listed packages differ
  from the commit) for a person to `git diff`; None outside a git checkout.

Checkpoints keep every fingerprint that trained a run (a resume with other code adds one);
results.json records them (sigma_moe/tasks/lm_run.py) and the tables list the runs that another
version of the code trained (scripts/run_versions.py `code_versions`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what a training run computes: the loop, data, models, kernels, tasks and the entry point
# (configs are the config hash's; scripts/, tests/ and docs/ train nothing)
CODE = ("sigma_moe", "run.py")
# a checkpoint written before runs recorded their code
UNRECORDED = "unrecorded"


def code_files(root: Path = ROOT) -> list[Path]:
    """The Python files of CODE under root, sorted (absent ones skipped: an installed tree
    has no run.py)."""
    files = []
    for name in CODE:
        path = root / name
        if path.is_dir():
            files += sorted(path.rglob("*.py"))
        elif path.is_file():
            files.append(path)
    return files


@functools.cache
def code_fingerprint(root: Path = ROOT) -> str:
    """12 hex digits of sha256 over (path, bytes) of every file of code_files(root)."""
    h = hashlib.sha256()
    for path in code_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@functools.cache
def git_commit(root: Path = ROOT) -> str | None:
    """`<short commit>` of root's checkout, `+dirty` when CODE differs from it; None
    without git or outside a checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        # only the listed packages: a stray notebook beside them does not make a run dirty
        dirty = git("status", "--porcelain", "--", *CODE)
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def code_version(trained_with: list[str] | None = None) -> dict[str, object]:
    """results.json's `code`: this process's fingerprint and commit, and every fingerprint
    that trained the run (from its checkpoints; only this one when none is given)."""
    now = code_fingerprint()
    return {"fingerprint": now, "git": git_commit(), "trained_with": trained_with or [now]}


LIBRARIES = ("torch", "triton", "numpy", "sentencepiece")  # what moves a run's numbers


def installed_version(name: str) -> str | None:
    """The installed distribution's version; None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """results.json's `libraries`: Python's version and those of LIBRARIES (None: not
    installed). The dependencies have open upper bounds: a run says what it ran with."""
    import torch

    # torch's own version names its build (2.13.0+cpu, 2.13.0+cu130); the metadata of PyPI's
    # CUDA wheel says 2.13.0 only
    return {"python": platform.python_version(),
            **{n: installed_version(n) for n in LIBRARIES}, "torch": torch.__version__}
