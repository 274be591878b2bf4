"""Which code trained a run: fingerprint, git commit, kept over resumes, shown by the tables."""
import json
import shutil
import subprocess

import pytest
import torch

from scripts.run_results import Run
from scripts.run_versions import MIXED, code_label, code_versions
from sigma_moe.framework.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from sigma_moe.framework.code_version import UNRECORDED, code_fingerprint, git_commit
from sigma_moe.tasks import TASKS
from tests.helpers import TINY, TINY_MOE, compose_cfg, interrupt_after_first_checkpoint

RUN = TASKS.get("lm")


def tree(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def fingerprint(root):
    return code_fingerprint.__wrapped__(root)  # uncached: the tree changes under it


def test_fingerprint_covers_the_training_code_only(tmp_path):
    root = tree(tmp_path, {"sigma_moe/framework/a.py": "x = 1\n",
                           "sigma_moe/models/ffn/b.py": "y = 2\n", "run.py": "main()\n",
                           "scripts/s.py": "", "docs/d.md": ""})
    first = fingerprint(root)
    assert len(first) == 12 and first == fingerprint(root)
    (root / "scripts/s.py").write_text("print('a report')\n")  # scripts and docs train nothing
    (root / "docs/d.md").write_text("more words\n")
    (root / "sigma_moe/framework/a.pyc").write_text("compiled")
    assert fingerprint(root) == first
    (root / "sigma_moe/models/ffn/b.py").write_text("y = 3\n")  # an edit, deep in a package
    second = fingerprint(root)
    assert second != first
    tree(root, {"sigma_moe/kernels/new.py": ""})  # a new file, even an empty one
    assert fingerprint(root) != second
    (root / "sigma_moe/kernels/new.py").unlink()
    assert fingerprint(root) == second
    (root / "run.py").unlink()  # an installed tree has no entry point: still a fingerprint
    assert fingerprint(root) != second
    # a file moved to another package is other code, with the same bytes
    moved = tree(tmp_path / "moved", {"sigma_moe/framework/c.py": "x = 1\n"})
    kept = tree(tmp_path / "kept", {"sigma_moe/models/c.py": "x = 1\n"})
    assert fingerprint(moved) != fingerprint(kept)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_and_dirty_code(tmp_path):
    root = tree(tmp_path / "repo", {"sigma_moe/framework/a.py": "x = 1\n", "notes.txt": ""})
    assert git_commit.__wrapped__(root) is None  # not a checkout (yet)

    def git(*args):
        return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    head = git("rev-parse", "--short=12", "HEAD")
    assert git_commit.__wrapped__(root) == head
    (root / "notes.txt").write_text("not code\n")
    assert git_commit.__wrapped__(root) == head
    (root / "sigma_moe/framework/a.py").write_text("x = 2\n")
    assert git_commit.__wrapped__(root) == head + "+dirty"


def use_code(monkeypatch, fingerprint: str) -> None:
    monkeypatch.setattr("sigma_moe.framework.trainer.code_fingerprint", lambda: fingerprint)
    monkeypatch.setattr("sigma_moe.framework.code_version.code_fingerprint", lambda: fingerprint)


def test_a_resume_with_other_code_keeps_both_versions(tmp_path, monkeypatch, capsys):
    cfg = compose_cfg([*TINY, *TINY_MOE, "trainer.steps=4", "trainer.ckpt_every=2",
                       "task.final_segments=1", "task.val_segments=1"])
    use_code(monkeypatch, "aaaaaaaaaaaa")
    interrupt_after_first_checkpoint(monkeypatch, cfg, tmp_path / "run")  # at step 2
    use_code(monkeypatch, "bbbbbbbbbbbb")  # `git pull` before the rerun
    capsys.readouterr()
    RUN(cfg, tmp_path / "run")
    assert ("note: steps up to 2 were trained by other code (code fingerprint aaaaaaaaaaaa, "
            "this code's is bbbbbbbbbbbb); results.json will list both") in capsys.readouterr().out
    code = json.loads((tmp_path / "run" / "results.json").read_text())["code"]
    assert code["fingerprint"] == "bbbbbbbbbbbb"
    assert code["trained_with"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert code_label(code) == MIXED
    last = load_checkpoint(list_checkpoints(tmp_path / "run")[-1])
    assert last["code_fingerprints"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]

    # an evaluation records its own code, and the versions that trained the run
    use_code(monkeypatch, "cccccccccccc")
    RUN({**cfg, "mode": "eval"}, tmp_path / "run")
    evaluated = json.loads((tmp_path / "run" / "eval_results.json").read_text())["code"]
    assert evaluated["fingerprint"] == "cccccccccccc"
    assert evaluated["trained_with"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]

    # a checkpoint from before runs recorded their code: unknown, then this code; no note
    state = load_checkpoint(list_checkpoints(tmp_path / "run")[0])
    del state["code_fingerprints"]
    (tmp_path / "old").mkdir()
    save_checkpoint(tmp_path / "old", 2, state)
    RUN(cfg, tmp_path / "old")
    assert "other code" not in capsys.readouterr().out
    old = json.loads((tmp_path / "old" / "results.json").read_text())["code"]
    assert old["trained_with"] == [UNRECORDED, "cccccccccccc"]


def run(name: str, seed: int, code: dict | None) -> Run:
    return Run(name, seed, "bpc", {}, {}, None, "", code=code)


def made_by(*fingerprints: str, git: str | None = "0123abc") -> dict:
    return {"fingerprint": fingerprints[-1], "git": git, "trained_with": list(fingerprints)}


def test_code_versions_name_the_runs_of_other_code():
    now = "aaaaaaaaaaaa"
    assert code_versions([run("a", s, made_by(now)) for s in range(3)], now) == []
    assert code_versions([], now) == []
    runs = [*(run("a", s, made_by(now)) for s in range(3)),
            run("b", 0, made_by("bbbbbbbbbbbb", git="0ld0ld+dirty")),
            run("b", 1, made_by("bbbbbbbbbbbb", git="0ld0ld+dirty")),
            run("c", 2, None), run("c", 0, made_by("bbbbbbbbbbbb", now))]
    assert code_versions(runs, now) == [
        "aaaaaaaaaaaa (git 0123abc; the current code): 3 runs",
        "bbbbbbbbbbbb (git 0ld0ld+dirty): b seeds 0, 1",
        "not recorded (trained before runs recorded their code): c seed 2",
        "several (resumed with other code; results.json `code.trained_with`): c seed 0"]
    # all by one older version: counted, not listed one by one
    assert code_versions([run("a", s, None) for s in range(66)], now) == [
        "not recorded (trained before runs recorded their code): 66 runs"]
    assert code_versions([run("a", 0, made_by("bbbbbbbbbbbb", git=None))], now) == [
        "bbbbbbbbbbbb: 1 run"]


# -- from mutation testing (round 4) ---------------------------------------------------
def test_the_real_tree_fingerprints_every_package_and_run_py():
    """The checkout's own CODE: the loop, data, models, kernels and the LM task (an edit of
    its loss or batching must change the fingerprint), the entry point; no script or test."""
    from sigma_moe.framework.code_version import ROOT, code_files

    names = {p.relative_to(ROOT).as_posix() for p in code_files()}
    for expected in ("run.py", "sigma_moe/framework/trainer.py",
                     "sigma_moe/models/ffn/sigma_moe.py", "sigma_moe/kernels/triton_cvmm.py",
                     "sigma_moe/tasks/lm.py"):
        assert expected in names
    assert not any(n.startswith(("scripts/", "tests/", "hydra_plugins/")) for n in names)


def test_code_version_without_checkpoints_lists_this_code():
    """Mutant `trained_with or [now]` -> `or []`: a run trained from scratch listed no code."""
    from sigma_moe.framework.code_version import code_version

    now = code_fingerprint()
    assert code_version()["trained_with"] == [now] == code_version([])["trained_with"]
    assert code_version(["a", now])["trained_with"] == ["a", now]


def test_library_versions_name_python_and_what_moves_numbers(monkeypatch):
    import platform

    from sigma_moe.framework import code_version as cv

    got = cv.library_versions()
    assert got["python"] == platform.python_version() and got["torch"] == torch.__version__
    assert set(got) == {"python", *cv.LIBRARIES}
    # the build, which PyPI's CUDA wheel's metadata leaves out (it says 2.13.0 only)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    assert cv.library_versions()["torch"] == "2.13.0+cu130"
    monkeypatch.setattr(cv, "LIBRARIES", ("no-such-distribution",))
    assert cv.library_versions()["no-such-distribution"] is None
