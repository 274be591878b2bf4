"""The paper's tables from run directories (issue 7); the FLOPs table:
tests/test_flops_table.py."""
import functools
import json
import runpy
import shutil
import statistics
import sys
import types
from pathlib import Path

import pytest

from scripts import paper_tables, run_results, run_versions
from sigma_moe.framework.code_version import code_fingerprint, code_version
from sigma_moe.framework.experiment import run_hashes
from tests.tables_helpers import cells, paper_grid, table_lines, write_exp

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def exp_config(exp_dir: Path, name: str) -> dict:
    return run_results.compose_experiments(exp_dir, [name])[name]


def fake_run(run_dir: Path, exp_dir: Path, seed: int, bpc: float, name: str = "tiny_dense",
             config_hash: str | None = "the experiment's", **more) -> dict:
    """A finished run's results.json (as sigma_moe/tasks/lm_run.py writes it), by default of the
    experiment's config as exp_dir/<name>.yaml composes now."""
    if config_hash == "the experiment's":
        cfg = exp_config(exp_dir, name)
        config_hash = run_hashes({**cfg, "trainer": {**cfg["trainer"], "seed": seed}})[0]
    res = {"name": name, "metric": "bpc", "seed": seed, "n_params": 51_234,
           "valid": {"bpc": bpc + 0.1}, "test": {"bpc": bpc}, "code": code_version(), **more}
    if config_hash is not None:
        res["config_hash"] = config_hash
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps(res))
    return res


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two seeds of a tiny dense experiment, in Hydra's directory layout."""
    root = tmp_path_factory.mktemp("tables")
    exps = root / "exp"
    write_exp(exps, "tiny_dense", "dense", {"d_ff": 64}, params_m=0.05, entries=[
        {"table": "moe", "row": "Dense", "column": "Mini", "value": 3.0},
        {"table": "dense", "row": "Dense", "column": "Mini", "value": 3.0}])
    write_exp(exps, "tiny_moe", "sigma_moe", {"n_experts": 4, "expert_size": 16, "k": 1},
              params_m=0.05, entries=[
                  {"table": "moe", "row": "σ-MoE", "column": "Mini", "value": 2.9},
                  {"table": "moe", "row": "σ-MoE", "column": "Mini-B", "value": None}])
    results = [fake_run(root / "runs" / sub, exps, seed, bpc) for seed, sub, bpc in
               ((0, "tiny_dense", 3.1), (1, "tiny_dense/trainer.seed=1", 3.3))]
    return root, results


def test_mean_std_over_two_seeds_and_missing_runs(tiny):
    root, results = tiny
    text = paper_tables.main(["--exp-dir", str(root / "exp"), "--runs", str(root / "runs"),
                              "--table", "moe"])
    test_bpc = [r["test"]["bpc"] for r in results]  # enwik: the test split, not valid
    assert results[0]["seed"] == 0 and results[1]["seed"] == 1 and test_bpc[0] != test_bpc[1]
    mean = (test_bpc[0] + test_bpc[1]) / 2
    std = abs(test_bpc[0] - test_bpc[1]) / 2**0.5  # sample std of two values
    lines = table_lines(text, "Tab. moe")
    header = next(line for line in lines if line.startswith("|  |"))
    assert header == "|  | Mini | Mini-B |"
    rows = [cells(line) for line in lines
            if line.startswith("| ") and not line.startswith("|  |")]
    assert [r[0] for r in rows] == ["Dense", "σ-MoE"]  # the paper's order
    params = f"{results[0]['n_params'] / 1e6:.3g}M"
    assert rows[0][1:] == [
        f"{mean:.3f} ± {std:.3f} (n=2) / 3.00 (Δ {mean - 3.0:+.3f}) · {params} · 100.0% FLOPs",
        ""]  # no experiment for (Dense, Mini-B)
    assert rows[1][1:] == ["— / 2.90 · 0.05M · 25.0% FLOPs", "— / n/a · 0.05M · 25.0% FLOPs"]
    missing = lines[lines.index(paper_tables.MISSING) + 1:]
    assert missing == ["- `python run.py -m +sweep=moe +exp=tiny_dense trainer.seed=2`",
                       "- `python run.py -m +sweep=moe +exp=tiny_moe`"]  # the sweep's seeds


def test_all_tables_latex_and_one_seed(tiny, tmp_path):
    root, results = tiny
    shutil.copytree(root / "runs" / "tiny_dense", tmp_path / "tiny_dense",
                    ignore=shutil.ignore_patterns("trainer.seed=1"))
    text = paper_tables.main(["--exp-dir", str(root / "exp"), "--runs", str(tmp_path),
                              "--format", "latex"])
    assert text.count("\\begin{tabular}") == 3  # dense, moe, flops (no other table entries)
    bpc = results[0]["test"]["bpc"]
    # one of the sweep's three seeds: no std, but the n shows, and the missing seeds
    assert f"Dense & {bpc:.3f} (n=1) / 3.00 ($\\Delta$ {bpc - 3.0:+.3f})" in text
    assert "$\\sigma$-MoE & --- / 2.90" in text and "25.0\\% FLOPs" in text
    assert "% missing: python run.py -m +sweep=dense +exp=tiny_dense trainer.seed=1,2" in text
    assert "% missing: python run.py -m +sweep=moe +exp=tiny_dense trainer.seed=1,2" in text
    assert "% missing: python run.py -m +sweep=moe +exp=tiny_moe\n" in text


def test_runs_of_other_code_are_named(tiny, tmp_path):
    root, _ = tiny
    runs = tmp_path / "runs"
    shutil.copytree(root / "runs", runs)
    args = ["--exp-dir", str(root / "exp"), "--runs", str(runs), "--table", "dense"]
    assert run_versions.CODE_HEADING not in paper_tables.main(args)  # all by this code
    old = {"fingerprint": "0ld0ld0ld0ld", "git": "1234567", "trained_with": ["0ld0ld0ld0ld"]}
    fake_run(runs / "tiny_dense" / "trainer.seed=2", root / "exp", 2, 3.2, code=old)
    text = paper_tables.main(args)
    lines = text.split(run_versions.CODE_HEADING + "\n")[1].splitlines()
    assert lines[0].startswith(f"- {code_fingerprint()} (") and lines[0].endswith(": 2 runs")
    assert lines[1:] == ["- 0ld0ld0ld0ld (git 1234567): tiny_dense seed 2"]
    latex = paper_tables.main([*args, "--format", "latex"])
    assert "% code: 0ld0ld0ld0ld (git 1234567): tiny_dense seed 2" in latex


def test_runs_that_read_other_tokens_are_named(tiny, tmp_path):
    """Perplexities of runs that read other tokens (another SentencePiece model, another
    cache) are not comparable: the table lists the data versions when they differ."""
    root, _ = tiny
    runs = tmp_path / "runs"
    shutil.copytree(root / "runs", runs)  # 2 runs that record no data (not listed)
    args = ["--exp-dir", str(root / "exp"), "--runs", str(runs), "--table", "dense"]

    def data(train_sha, entry):
        return {"name": "wt103", "tokens": {}, "cache_entry": entry,
                "sha256": {"train": train_sha, "valid": "v", "test": "t", "spm.model": "m"}}

    # seed 5: a cache prepared before checksums existed
    for seed, sha, entry in ((2, "a", "/c/one"), (3, "a", "/c/one"), (4, "b", "/c/two"),
                             (5, None, "/c/old")):
        fake_run(runs / "tiny_dense" / f"trainer.seed={seed}", root / "exp", seed, 3.2,
                 data=data(sha, entry))
    label = lambda sha: run_versions.data_label(data(sha, ""))
    assert len(label("a")) == 12 and label("a") != label("b") and label(None) is None
    text = paper_tables.main(args)
    lines = text.split(run_versions.DATA_HEADING + "\n")[1].splitlines()
    assert lines == [f"- wt103 {label('a')} (/c/one): 2 runs",
                     f"- wt103 {label('b')} (/c/two): tiny_dense seed 4",
                     "- wt103, sha256 not recorded: tiny_dense seed 5"]
    assert (f"% data: wt103 {label('b')} (/c/two): tiny_dense seed 4"
            in paper_tables.main([*args, "--format", "latex"]))
    for seed in (4, 5):
        shutil.rmtree(runs / "tiny_dense" / f"trainer.seed={seed}")
    # one version: nothing to say
    assert run_versions.DATA_HEADING not in paper_tables.main(args)


def test_which_runs_count(tiny, tmp_path, capsys):
    """Newest of a seed counts, the other is listed (it vanished without a word); other
    overrides only with --all-overrides and never over a run of the experiment's own config;
    a run of another config (stale, or made in a hand-chosen directory) never; one with no
    config_hash counts, with a warning."""
    root, results = tiny
    runs, exps = tmp_path / "runs", root / "exp"
    shutil.copytree(root / "runs", runs)
    dup = runs / "sweeps" / "s" / "tiny_dense" / "trainer.seed=1"  # a sweep rerun of seed 1
    fake_run(dup, exps, 1, 7.0)
    other = "0123456789ab"  # the config_hash of another config
    fake_run(runs / "tiny_dense" / "ffn.d_ff=32,trainer.seed=2", exps, 2, 100.0,
             config_hash=other)
    fake_run(runs / "tiny_dense" / "ffn.d_ff=32,trainer.seed=0", exps, 0, 200.0,
             config_hash=other)  # newer than seed 0 of the experiment itself
    fake_run(runs / "tiny_dense" / "trainer.seed=3", exps, 3, 300.0, config_hash=other)
    fake_run(runs / "smoke", exps, 0, 400.0, config_hash=other)  # hydra.run.dir=runs/smoke
    args = ["--exp-dir", str(exps), "--runs", str(runs), "--table", "dense"]
    text = paper_tables.main(args)
    mean = statistics.fmean([results[0]["test"]["bpc"], 7.0])  # newest seed-1 run counts
    assert f"| Dense | {mean:.3f} ± " in text and "(n=2)" in text
    stale = f"config differs from {exps / 'tiny_dense.yaml'} (stale, or made with other settings)"
    assert sorted(text.split("Not counted:\n")[1].strip().splitlines()) == [
        f"- {runs / 'smoke'}: {stale}",
        f"- {runs / 'tiny_dense/ffn.d_ff=32,trainer.seed=0'}: tiny_dense with overrides "
        "ffn.d_ff=32 (--all-overrides counts it)",
        f"- {runs / 'tiny_dense/ffn.d_ff=32,trainer.seed=2'}: tiny_dense with overrides "
        "ffn.d_ff=32 (--all-overrides counts it)",
        f"- {runs / 'tiny_dense/trainer.seed=1'}: seed 1 also ran in {dup}, which counts "
        "(its results.json is newer)",
        f"- {runs / 'tiny_dense/trainer.seed=3'}: {stale}"]
    assert "†" not in text
    text = paper_tables.main([*args, "--all-overrides"])  # seed 2 joins; seed 0 stays
    mean = statistics.fmean([results[0]["test"]["bpc"], 7.0, 100.0])
    assert f"| Dense | {mean:.3f} ± " in text and "(n=3)† /" in text  # the cell says so
    assert text.split(run_results.OVERRIDDEN_HEADING + "\n")[1].strip() == (
        f"- {runs / 'tiny_dense/ffn.d_ff=32,trainer.seed=2'}: tiny_dense seed 2 with "
        "ffn.d_ff=32")
    latex = paper_tables.main([*args, "--all-overrides", "--format", "latex"])
    assert "(n=3)$^\\dagger$ /" in latex and "% counted with --all-overrides" in latex
    assert text.count("--all-overrides counts it") == 0 and text.count(stale) == 2
    assert (f"- {runs / 'tiny_dense/ffn.d_ff=32,trainer.seed=0'}: seed 0 also ran in "
            f"{runs / 'tiny_dense'}, which counts (the experiment's own config)") in text
    assert capsys.readouterr().err == ""
    fake_run(runs / "tiny_dense" / "trainer.seed=4", exps, 4, 8.0, config_hash=None)
    text = paper_tables.main(args)  # made before results.json recorded a config_hash
    assert "(n=3)" in text
    assert capsys.readouterr().err == (
        f"warning: 1 counted run(s) record no config_hash, so their config is not checked "
        f"against {exps} (e.g. {runs / 'tiny_dense/trainer.seed=4/results.json'})\n")


def test_runs_in_no_paper_table_get_a_note(tiny, tmp_path, capsys):
    """A user's own experiment (no `paper:` block) or the mini table's: no table or list
    under one names its runs; a note points at compare_runs.py."""
    root, _ = tiny
    exps, runs = tmp_path / "exp", tmp_path / "runs"
    shutil.copytree(root / "exp", exps)
    write_exp(exps, "own", "dense", {"d_ff": 64}, entries=[])
    write_exp(exps, "laptop", "dense", {"d_ff": 64}, entries=[
        {"table": "mini", "row": "Dense", "column": "enwik_mini", "value": None}])
    fake_run(runs / "own" / "trainer.seed=0", exps, 0, 3.0, name="own")
    fake_run(runs / "own" / "ffn.d_ff=32,trainer.seed=0", exps, 0, 3.0, name="own")
    fake_run(runs / "laptop", exps, 0, 3.0, name="laptop")
    fake_run(runs / "tiny_dense", exps, 0, 3.0)
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(runs), "--table", "dense"])
    assert "own" not in text and "laptop" not in text
    assert capsys.readouterr().err == (
        "note: 3 run(s) of experiments in none of the paper's tables: laptop (1), own (2); "
        "scripts/compare_runs.py tabulates them (--mini: the mini report)\n")


def whole_floats_as_ints(node):
    """As wandb's JSON store hands a logged config back (1.0 as 1)."""
    if isinstance(node, dict):
        return {k: whole_floats_as_ints(v) for k, v in node.items()}
    return int(node) if isinstance(node, float) and node.is_integer() else node


def test_c4_uses_validation_and_wandb_runs(tmp_path, monkeypatch):
    exps = tmp_path / "exp"
    write_exp(exps, "c4_small_moe", "sigma_moe", {"n_experts": 16, "expert_size": 128, "k": 4},
              dataset="c4", params_m=47, model={"d_model": 412},
              entries=[{"table": "c4_pes2o", "row": "σ-MoE", "column": "C4-S", "value": 23.25}])
    write_exp(exps, "c4_small_dense", "dense", {"d_ff": 2053}, dataset="c4", params_m=47,
              entries=[{"table": "c4_pes2o", "row": "Dense", "column": "C4-S", "value": 23.76}])
    run = tmp_path / "runs" / "c4_small_moe"
    run.mkdir(parents=True)
    moe = {**exp_config(exps, "c4_small_moe")}
    moe["trainer"] = {**moe["trainer"], "seed": 0}
    (run / "results.json").write_text(json.dumps({
        "name": "c4_small_moe", "metric": "ppl", "seed": 0, "n_params": 47_300_000,
        "config_hash": run_hashes(moe)[0], "valid": {"ppl": 23.0}, "test": {"ppl": 99.0}}))
    dense = exp_config(exps, "c4_small_dense")
    logged = {**whole_floats_as_ints(dense), "trainer": {**dense["trainer"], "seed": 0},
              "run_dir": "/somewhere/runs/c4_small_dense"}  # as sigma_moe/tasks/lm_run.py logs it

    class FakeRun:
        id, state = "abc", "finished"
        config = logged
        summary = {"valid_ppl": 24.0, "test_ppl": 98.0}

    class Crashed(FakeRun):  # not finished: never counted
        id, state = "def", "crashed"
        config = {**logged, "trainer": {**logged["trainer"], "seed": 1}}
        summary = {"valid_ppl": 1.0, "test_ppl": 1.0}

    class OtherOverrides(FakeRun):  # another config, listed but not counted
        id = "ghi"
        config = {**logged, "trainer": {**logged["trainer"], "seed": 2},
                  "ffn": {**logged["ffn"], "d_ff": 1024},
                  "run_dir": "/somewhere/runs/c4_small_dense/ffn.d_ff=1024,trainer.seed=2"}
        summary = {"valid_ppl": 2.0, "test_ppl": 2.0}

    class Stale(FakeRun):  # trained before the exp file changed d_ff: listed, not counted
        id = "jkl"
        config = {**logged, "trainer": {**logged["trainer"], "seed": 3},
                  "ffn": {**logged["ffn"], "d_ff": 2048}}
        summary = {"valid_ppl": 3.0, "test_ppl": 3.0}

    fake = types.SimpleNamespace(Api=lambda: types.SimpleNamespace(
        runs=lambda p: [FakeRun, Crashed, OtherOverrides, Stale]))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "c4_pes2o", "--wandb", "me/proj"])
    rows = [line for line in text.splitlines() if line.startswith("| ") and "C4-S" not in line]
    assert rows == ["| Dense | 24.00 (n=1) / 23.76 (Δ +0.24) |",
                    "| σ-MoE | 23.00 (n=1) / 23.25 (Δ -0.25) · 47.3M |"]
    assert text.split("Not counted:\n")[1].splitlines()[:2] == [
        "- wandb:me/proj/ghi: c4_small_dense with overrides ffn.d_ff=1024 (--all-overrides "
        "counts it)",
        f"- wandb:me/proj/jkl: config differs from {exps / 'c4_small_dense.yaml'} (stale, or "
        f"made with other settings)"]


def test_wandb_without_a_login_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(SystemExit) as e:
        paper_tables.main(["--runs", str(tmp_path), "--wandb", "foo/bar"])
    said = e.value.code  # wandb's own reason ("No API key configured. Use `wandb login` ...")
    assert said.startswith("error: --wandb foo/bar: ") and "\n" not in said


def test_results_without_a_number_for_the_metric_are_skipped_with_a_warning(tmp_path, capsys):
    exps = tmp_path / "exp"
    write_exp(exps, "tiny_dense", "dense", {"d_ff": 64},
              entries=[{"table": "dense", "row": "Dense", "column": "Mini", "value": 3.0}])
    bad = {"no_number": {"valid": {"bpc": 1.0}, "test": {"loss": 1.0}},
           "no_valid": {"test": {"bpc": 1.0}}, "a_bool": {"valid": {"bpc": True},
                                                            "test": {"bpc": 1.0}}}
    for sub, splits in bad.items():
        run = tmp_path / "runs" / "tiny_dense" / sub
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(
            {"name": "tiny_dense", "metric": "bpc", "seed": 0, **splits}))
    (run.parent / "results.json").write_text("{")  # cut short while being copied
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs")])
    assert "| Dense | — / 3.00 |" in text  # a line each on stderr, no KeyError traceback
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 4 and all(w.startswith("warning: ") for w in warnings)
    assert any(w.endswith("no_number/results.json: unreadable results.json (test has no "
                          "number 'bpc')") for w in warnings)
    assert any("a_bool" in w and "valid has no finite number 'bpc' (it has True)" in w
               for w in warnings)
    assert any("tiny_dense/results.json: unreadable results.json (not JSON" in w
               for w in warnings)


def test_runs_must_exist_unless_the_default(tmp_path, monkeypatch, capsys):
    for mini in ([], ["--mini"]):
        with pytest.raises(SystemExit) as e:  # a typo: not every run listed as missing
            paper_tables.main(["--runs", str(tmp_path), str(tmp_path / "nope"), *mini])
        assert e.value.code == f"error: --runs {tmp_path / 'nope'} is not a directory"
    # the default runs/ need not exist yet: nothing has run, the tables say what to run; or
    # the script was started elsewhere: a note says where it looked
    paper_grid(tmp_path / "exp")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert "Tab. flops_detailed" in paper_tables.main(["--exp-dir", "exp", "--table", "flops"])
    assert capsys.readouterr().err == (f"note: no runs/ in {tmp_path}; if runs exist elsewhere, "
                                       "point --runs at their directory\n")
    (tmp_path / "runs").mkdir()
    paper_tables.main(["--exp-dir", "exp", "--table", "flops"])
    assert capsys.readouterr().err == ""
    # given, but without a finished run under it (a wrong directory looks like none run yet)
    paper_tables.main(["--exp-dir", "exp", "--table", "flops", "--runs", "runs"])
    assert capsys.readouterr().err == ("note: no finished run (results.json) under --runs "
                                       "runs: the tables below are empty for it\n")


@pytest.mark.parametrize("argv, error", [
    (["--mini", "--format", "latex", "--table", "moe", "--wandb", "x/y"],
     "--mini prints the mini report (Markdown, from local runs) and takes no --table, "
     "--format, --wandb"),
    (["--mini", "--flops-selector"], "takes no --flops-selector"),
    (["--exp-dir", "/nonexistent"], "--exp-dir /nonexistent is not a directory"),
])
def test_flags_that_would_be_ignored_are_refused(argv, error, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # not the Markdown mini report, silently
        paper_tables.main(["--runs", str(tmp_path), *argv])
    assert e.value.code == 2 and error in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("library, use", [
    ("flops_table", "scripts/paper_tables.py --table flops"),
    ("run_results", "scripts/paper_tables.py` or `python scripts/mini_claims.py"),
    ("run_files", "scripts/mini_claims.py` or `python scripts/compare_runs.py"),
    ("run_versions", "scripts/paper_tables.py` and `python scripts/mini_claims.py"),
    ("bench_common", "scripts/bench_moe.py` or `python scripts/bench_train.py"),
    ("bench_roofline", "scripts/bench_moe.py"),
    ("wandb_runs", "scripts/paper_tables.py --wandb"),
])
def test_running_a_library_module_names_the_script_to_use(library, use, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"{library}.py", "--help"])
    with pytest.raises(SystemExit) as e:  # not a silent exit 0, whatever the arguments
        runpy.run_path(str(ROOT / "scripts" / f"{library}.py"), run_name="__main__")
    assert f"scripts/{library}.py is a library" in e.value.code and use in e.value.code
    assert "\n" not in e.value.code


# -- from mutation testing: cells, rows and notes of one table ------------------
def _exp(name="x"):
    return paper_tables.Experiment(name, name, 40.0, [
        {"table": "moe", "row": "Dense", "column": "E8", "value": 1.0}],
        {"ffn": {"kind": "dense"}, "dataset": {"kind": "enwik8"}})


def run_record(seed, test, n_params, name="x"):
    """A counted run of `name` (seed, test bpc, parameter count) as find_runs returns it."""
    return run_results.Run(name, seed, "bpc", {"bpc": test + 0.1}, {"bpc": test}, n_params,
                           f"/r/{seed}")


def test_cell_params_are_the_mean_over_seeds():
    """Mutant `statistics.fmean(counts)` -> `max(counts)`."""
    t = paper_tables.build_table("moe", {"x": _exp()}, {
        "x": [run_record(0, 1.0, 40_000_000), run_record(1, 1.2, 42_000_000)]})
    cell = t.rows[0][2][0]
    assert cell.n_params == pytest.approx(41_000_000)
    assert "· 41M ·" in paper_tables.cell_text(cell)


def test_notes_list_only_the_tables_experiments():
    """Mutant: `out.notes = [str(s) for s in skipped]` (the filter on the table's experiments
    dropped: every table lists every other table's left-out runs)."""
    skipped = [run_results.Skipped(Path("/r/a"), "x", "stale"),
               run_results.Skipped(Path("/r/b"), "not_here", "stale"),
               run_results.Skipped(Path("/r/c"), None, "unreadable")]
    t = paper_tables.build_table("moe", {"x": _exp()}, {}, skipped)
    assert t.notes == ["/r/a: stale"]


def test_labels_not_in_the_papers_order_follow_the_listed_ones():
    """Mutant `len(pref) + i` -> `i`: unlisted labels interleave with the paper's rows."""
    assert paper_tables.ordered(["Z", "B", "A"], ("A", "B")) == ["A", "B", "Z"]
    assert paper_tables.ordered(["new", "Dense"], ("Dense",)) == ["Dense", "new"]


def test_the_cell_docs_reproducing_shows_is_one_the_script_prints():
    """docs/reproducing.md's example Tab. moe cell lacked the ` · 25.0% FLOPs` they print."""
    doc = (ROOT / "docs" / "reproducing.md").read_text()
    shown = doc.split("A cell (here Tab. moe's σ-MoE on WT-S) reads\n\n```\n")[1].split("\n")[0]
    cell = paper_tables.Cell(_exp(), [11.69, 11.74, 11.79], paper=11.71, n_params=47.3e6,
                             flops=0.25, metric="ppl")
    assert paper_tables.cell_text(cell) == shown
