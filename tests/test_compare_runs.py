"""scripts/compare_runs.py: any finished runs, grouped by experiment and overrides but the
seed, mean ± std over seeds; runs of one command with different configs kept apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scripts import compare_runs


def finished(run_dir: Path, name: str, seed: int, test: float, lr: float = 1e-3,
             mtime: float | None = None) -> None:
    """A run directory as run.py leaves it: config.yaml and results.json."""
    import os

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"name": name, "trainer": {"seed": seed, "lr": lr, "progress": True}}))
    (run_dir / "results.json").write_text(json.dumps(
        {"name": name, "seed": seed, "metric": "bpc", "valid": {"bpc": test + 0.1},
         "test": {"bpc": test}, "n_params": 2_000_000}))
    if mtime is not None:
        os.utime(run_dir / "results.json", (mtime, mtime))


def test_groups_by_overrides_but_the_seed_and_keeps_the_newest_rerun(tmp_path, capsys):
    runs = tmp_path / "runs"
    finished(runs / "glu" / "ffn.k=2,trainer.seed=0", "glu", 0, 1.0)
    finished(runs / "glu" / "ffn.k=2,trainer.seed=1", "glu", 1, 1.2, mtime=1_000)
    finished(runs / "glu" / "ffn.k=2,trainer.seed=1-2", "glu", 1, 1.4, mtime=2_000)  # fresh=true
    finished(runs / "glu" / "trainer.seed=0", "glu", 0, 2.0)
    finished(runs / "other", "other", 0, 3.0)
    (runs / "broken").mkdir()
    (runs / "broken" / "results.json").write_text("{")
    text = compare_runs.main(["--runs", str(runs)])
    assert text.splitlines() == [
        "| experiment | overrides | seeds | metric | valid | test | params |",
        "|---|---|---|---|---|---|---|",
        "| glu | — | 0 | bpc | 2.100 (n=1) | 2.000 (n=1) | 2.00M |",
        "| glu | ffn.k=2 | 0,1 | bpc | 1.300 ± 0.283 (n=2) | 1.200 ± 0.283 (n=2) | 2.00M |",
        "| other | — | 0 | bpc | 3.100 (n=1) | 3.000 (n=1) | 2.00M |",
    ]
    captured = capsys.readouterr()
    assert captured.out == text
    assert f"warning: {runs}/broken/results.json: unreadable results.json (not JSON" in \
        captured.err
    glu = runs / "glu"
    assert (f"note: {glu}/ffn.k=2,trainer.seed=1 left out: seed 1 also ran in "
            f"{glu}/ffn.k=2,trainer.seed=1-2, which counts (its results.json is newer)\n"
            ) in captured.err
    # a copy with the same mtime: the run found first counts, and the note says so
    (runs / "broken" / "results.json").unlink()
    finished(runs / "glu" / "ffn.k=2,trainer.seed=1-3", "glu", 1, 9.0, mtime=2_000)
    assert "| 1.300 ± 0.283 (n=2) |" in compare_runs.main(["--runs", str(runs)])
    assert (f"note: {glu}/ffn.k=2,trainer.seed=1-3 left out: seed 1 also ran in "
            f"{glu}/ffn.k=2,trainer.seed=1-2, which counts (found first)\n"
            ) in capsys.readouterr().err
    assert compare_runs.main(["--runs", str(runs), "--name", "oth*"]).count("\n") == 3


def test_seeds_of_long_overrides_group_by_what_the_runs_recorded(tmp_path):
    """Over 120 characters a directory's name is cut to a hash of all of it, the seed
    included: the seeds of one command were two rows of cut names. The runs record their
    overrides uncut (overrides.yaml); a run from before that keeps its cut name."""
    from sigma_moe.framework.cli import OVERRIDES, dirname

    runs, long = tmp_path / "runs", ",".join(f"model.k{i}=1" for i in range(15))
    for seed in (0, 1, 2):
        over = f"{long},trainer.seed={seed}"
        finished(runs / "glu" / dirname(over), "glu", seed, 1.0 + seed)
        if seed < 2:
            (runs / "glu" / dirname(over) / OVERRIDES).write_text(yaml.safe_dump(
                {"overrides": [f"+exp=glu,{over}"], "dirname": over}))
    # a fresh=true sibling whose first directory is gone; a record of another directory's
    # name (copied along with a run) is not read
    over = f"{long},trainer.seed=3"
    finished(runs / "glu" / f"{dirname(over)}-2", "glu", 3, 4.0)
    (runs / "glu" / f"{dirname(over)}-2" / OVERRIDES).write_text(f"dirname: {over}\n")
    (runs / "glu" / dirname(f"{long},trainer.seed=2") / OVERRIDES).write_text(
        f"dirname: {long},trainer.seed=9\n")
    rows = sorted(line.split(" | bpc |")[0] for line in
                  compare_runs.main(["--runs", str(runs)]).splitlines()[2:])
    assert rows == sorted([f"| glu | {long} | 0,1,3",
                           f"| glu | {dirname(long + ',trainer.seed=2')} | 2"])


def test_runs_of_one_command_with_other_configs_are_told_apart(tmp_path):
    """The experiment file changed between two seeds: averaging them would mix configs."""
    runs = tmp_path / "runs"
    finished(runs / "glu" / "trainer.seed=0", "glu", 0, 1.0, lr=1e-3)
    finished(runs / "glu" / "trainer.seed=1", "glu", 1, 1.2, lr=2e-3)
    lines = compare_runs.main(["--runs", str(runs)]).splitlines()
    assert lines[0] == ("| experiment | overrides | config | seeds | metric | valid | test "
                        "| params |")
    assert sorted(line.split(" | ")[3] for line in lines[2:4]) == ["0", "1"]
    assert len({line.split(" | ")[2] for line in lines[2:4]}) == 2
    assert lines[-1].startswith("Some commands trained different configs")
    # a volatile key (trainer.progress) or the seed alone do not split a group
    finished(runs / "dense" / "trainer.seed=0", "dense", 0, 1.0)
    finished(runs / "dense" / "trainer.seed=1", "dense", 1, 1.0)
    cfg = yaml.safe_load((runs / "dense" / "trainer.seed=1" / "config.yaml").read_text())
    cfg["trainer"]["progress"] = False
    (runs / "dense" / "trainer.seed=1" / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert "| dense | — | " in compare_runs.main(["--runs", str(runs), "--name", "dense"])
    assert "| 0,1 |" in compare_runs.main(["--runs", str(runs), "--name", "dense"])


def test_nothing_found_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        compare_runs.main(["--runs", str(tmp_path), "--name", "glu*"])
    assert e.value.code == f"error: no finished run (results.json) under {tmp_path} of an " \
                           f"experiment matching glu*"
    with pytest.raises(SystemExit) as e:
        compare_runs.main(["--runs", str(tmp_path / "nope")])
    assert e.value.code == f"error: --runs {tmp_path / 'nope'} is not a directory"


def test_runs_behind_a_directory_link_count_once(tmp_path):
    """Path.rglob does not follow directory links: `--runs runs` with runs/sweeps on a
    scratch disk found no run at all; a link back up the tree must not walk forever."""
    finished(tmp_path / "scratch" / "glu" / "trainer.seed=0", "glu", 0, 1.0)
    finished(tmp_path / "scratch" / "glu" / "trainer.seed=1", "glu", 1, 1.2)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "sweeps").symlink_to(tmp_path / "scratch", target_is_directory=True)
    (tmp_path / "scratch" / "up").symlink_to(tmp_path, target_is_directory=True)  # a loop
    text = compare_runs.main(["--runs", str(runs)])
    assert text.splitlines()[2] == \
        "| glu | — | 0,1 | bpc | 1.200 ± 0.141 (n=2) | 1.100 ± 0.141 (n=2) | 2.00M |"


def test_records_that_are_not_utf8_are_read_as_missing(tmp_path):
    """A UnicodeDecodeError is a ValueError, not an OSError or YAMLError: a traceback. The
    run counts as one whose config.yaml and overrides record are gone."""
    from sigma_moe.framework.cli import OVERRIDES

    runs = tmp_path / "runs"
    finished(runs / "glu" / "trainer.seed=0", "glu", 0, 1.0)
    finished(runs / "glu" / "trainer.seed=1", "glu", 1, 1.2)
    (runs / "glu" / "trainer.seed=1" / OVERRIDES).write_bytes(b'dirname: "\xff"\n')
    (runs / "glu" / "trainer.seed=1" / "config.yaml").write_bytes(b"name: glu\n# \xff\n")
    lines = compare_runs.main(["--runs", str(runs)]).splitlines()
    assert [line.split(" | ")[2:4] for line in lines[2:4]] == [["?", "1"], [
        compare_runs.config_without_seed(runs / "glu" / "trainer.seed=0"), "0"]]
