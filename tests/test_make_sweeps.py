"""scripts/make_sweeps.py on bad input: one `error:` line and exit 1, never a traceback, and
no sweep file written. The tests point it at a temporary experiment directory."""
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import make_sweeps

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def exp_dir(tmp_path, monkeypatch):
    """An experiment directory read instead of configs/exp, and a sweep directory written
    instead of configs/sweep."""
    monkeypatch.setattr(make_sweeps, "EXP_DIR", tmp_path / "exp")
    monkeypatch.setattr(make_sweeps, "SWEEP_DIR", tmp_path / "sweep")
    (tmp_path / "exp").mkdir()
    return tmp_path / "exp"


@pytest.mark.parametrize("text, why", [
    ("name: other\n", "name 'other' differs from the file name; make them the same"),
    ("paper:\n  entries:\n    - table: nope\n",
     "unknown paper table 'nope'; known: dense, moe, ablation, pkm, topk, c4_pes2o"),
    ("- a\n- b\n", "holds a YAML list, not a mapping of settings"),
    ("just words\n", "holds a YAML str, not a mapping of settings"),
    ("paper:\n  entries: moe\n", "paper.entries must be a list of mappings, each with a "
     "table: (configs/exp/README.md)"),
    ("paper: [moe]\n", "paper.entries must be a list of mappings, each with a table: "
     "(configs/exp/README.md)"),
    ("paper:\n  entries: [moe]\n", "paper.entries must be a list of mappings, each with a "
     "table: (configs/exp/README.md)"),
    ("a: [1\nb: 2\n", "not valid YAML: expected ',' or ']', but got ':' (line 2, column 2)"),
])
@pytest.mark.parametrize("argv", [["--check"], ["--list", "moe"], []])
def test_a_bad_experiment_file_is_one_line(exp_dir, text, why, argv):
    path = exp_dir / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        make_sweeps.main(argv)
    assert e.value.code == f"error: {path}: {why}"
    assert not (exp_dir.parent / "sweep").exists()


def test_a_table_no_experiment_names_is_one_line(exp_dir):
    with pytest.raises(SystemExit) as e:
        make_sweeps.main(["--check"])
    assert e.value.code == ("error: no experiment names table 'dense' in its paper block; add "
                            "an entry with table: dense to one (configs/exp/README.md)")


def test_a_sweep_file_that_cannot_be_written_is_one_line(exp_dir, monkeypatch):
    entries = "".join(f"    - table: {t}\n" for t in make_sweeps.TABLES)
    (exp_dir / "every.yaml").write_text(f"name: every\npaper:\n  entries:\n{entries}")
    assert make_sweeps.main(["--list", "moe", "pkm"]) == 0
    (exp_dir.parent / "file").write_text("")
    monkeypatch.setattr(make_sweeps, "SWEEP_DIR", exp_dir.parent / "file" / "sweep")
    with pytest.raises(SystemExit) as e:
        make_sweeps.main([])
    assert e.value.code == (f"error: cannot write {exp_dir.parent}/file/sweep/dense.yaml: "
                            "Not a directory")


def test_check_writes_nothing_and_fails_until_the_files_are_rewritten(exp_dir, monkeypatch,
                                                                       capsys):
    """--check is what CI runs: exit 1 while a sweep file is missing or stale, write nothing;
    an experiment in two cells of a table is one job per seed, and in --list once."""
    monkeypatch.setattr(make_sweeps, "ROOT", exp_dir.parent)  # files named relative to it
    entries = "".join(f"    - table: {t}\n" for t in make_sweeps.TABLES)
    (exp_dir / "every.yaml").write_text(f"name: every\npaper:\n  entries:\n{entries}")
    (exp_dir / "twice.yaml").write_text("name: twice\npaper:\n  entries:\n"
                                        "    - table: moe\n    - table: moe\n")
    assert make_sweeps.main(["--check"]) == 1
    assert capsys.readouterr().err.startswith("out of date: sweep/dense.yaml, sweep/moe.yaml")
    assert not (exp_dir.parent / "sweep").exists()
    assert make_sweeps.main([]) == 0 and len(list((exp_dir.parent / "sweep").iterdir())) == 6
    assert make_sweeps.main(["--check"]) == 0
    assert make_sweeps.table_experiments(exp_dir)["moe"] == ["every", "twice"]
    capsys.readouterr()
    assert make_sweeps.main(["--list", "moe", "pkm"]) == 0
    assert capsys.readouterr().out == "every,twice\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_output_to_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "scripts/make_sweeps.py", "--list", "dense"],
                             cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=60)
    assert (out.returncode, out.stderr) == (
        1, "error: cannot write the output: No space left on device\n")


def test_make_sweeps_check_and_list_exclude_each_other(capsys):
    """(scripts/make_sweeps.py writes the sweeps whose commands the tables print.)"""
    with pytest.raises(SystemExit) as e:  # --list alone would not check anything
        make_sweeps.main(["--check", "--list", "moe"])
    assert e.value.code == 2 and "not allowed with argument --check" in capsys.readouterr().err
