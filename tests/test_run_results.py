"""Bad or unusual input to the table scripts (scripts/run_results.py, paper_tables.py,
mini_claims.py), from an audit: hand-edited results, broken exp files, LaTeX labels, a full
disk. Each is a number the tables get right or one line on stderr, never a traceback."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import paper_tables, run_results, run_versions, wandb_runs
from tests.test_paper_tables import _exp, fake_run, run_record, write_exp

ROOT = Path(__file__).resolve().parent.parent
MOE_ENTRY = {"table": "moe", "row": "σ-MoE", "column": "Mini", "value": 2.9}


@pytest.fixture
def exps(tmp_path):
    exp_dir = tmp_path / "exp"
    write_exp(exp_dir, "tiny_moe", "sigma_moe", {"n_experts": 4, "expert_size": 16, "k": 1},
              params_m=0.05, entries=[MOE_ENTRY])
    return exp_dir


def moe_cell(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| σ-MoE |"))


def test_a_seed_written_as_text_is_that_seed_and_odd_fields_do_not_reach_a_mean(
        exps, tmp_path, capsys):
    """"seed": "0" counted as a third seed next to 0 and 1 (n=3 with seed 2 missing); a
    NaN metric failed inside statistics; "n_params": "41M" failed the mean."""
    runs = tmp_path / "runs" / "tiny_moe"
    fake_run(runs / "trainer.seed=0", exps, 0, 3.0, name="tiny_moe")
    fake_run(runs / "trainer.seed=1", exps, 1, 3.2, name="tiny_moe", n_params="41M")
    legacy = fake_run(runs / "trainer.seed=0-2", exps, 0, 3.1, name="tiny_moe",
                      config_hash=None)  # a fresh=true rerun of seed 0, before hashes
    (runs / "trainer.seed=0-2" / "results.json").write_text(json.dumps({**legacy, "seed": "0"}))
    for sub, bad in (("nan", math.nan), ("inf", math.inf)):
        fake_run(runs / f"trainer.seed={sub}", exps, 2, bad, name="tiny_moe")
    odd = fake_run(runs / "trainer.seed=x", exps, 3, 3.0, name="tiny_moe")
    (runs / "trainer.seed=x" / "results.json").write_text(json.dumps({**odd, "seed": "x"}))
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "moe"])
    # seeds 0 (the newer, 3.1) and 1 (3.2); only seed 0's run has a usable n_params
    assert "| 3.150 ± 0.071 (n=2) / 2.90 (Δ +0.250) · 0.0512M" in moe_cell(text)
    assert "trainer.seed=2" in text.split("Missing runs")[1]
    err = capsys.readouterr().err
    assert "trainer.seed=nan/results.json: unreadable results.json (valid has no finite " \
           "number 'bpc' (it has nan))" in err and "(it has inf))" in err
    assert "trainer.seed=x/results.json: unreadable results.json (seed 'x' is not an " \
           "integer)" in err


def test_override_directories_and_fresh_siblings(tmp_path):
    """`-N` is a fresh=true sibling only beside the directory it copies: an override value
    ending in -3 (trainer.lr=1e-3) is that value."""
    runs = tmp_path / "tiny_moe"
    for sub in ("trainer.seed=1", "trainer.seed=1-2", "trainer.lr=1e-3"):
        (runs / sub).mkdir(parents=True)
    assert run_results.run_overrides(runs / "trainer.seed=1-2", "tiny_moe") == "trainer.seed=1"
    assert run_results.run_overrides(runs / "trainer.lr=1e-3", "tiny_moe") == "trainer.lr=1e-3"
    assert run_results.run_overrides(tmp_path / "tiny_moe-2", "tiny_moe") == ""


def test_runs_of_unknown_experiments_get_one_warning(exps, tmp_path, capsys):
    """They are in no table, so no table's notes named them: they vanished without a word."""
    runs = tmp_path / "runs"
    for i in range(7):
        fake_run(runs / f"gone_{i}", exps, 0, 3.0, name=f"gone_{i}", config_hash=None)
    fake_run(runs / "gone_0-2", exps, 1, 3.0, name="gone_0", config_hash=None)
    found, _ = run_results.find_runs([runs], exps)
    assert found == [] and capsys.readouterr().err == (
        f"warning: 8 run(s) of experiments with no file in {exps} are in no table: "
        "gone_0 (2), gone_1 (1), gone_2 (1), gone_3 (1), gone_4 (1) and 2 more\n")


@pytest.mark.parametrize("body,said", [
    ("name: [unclosed", "while parsing a flow sequence"),
    ("- just a list", "holds a list, not a mapping of config keys"),
    ("paper: [1, 2]", "paper must be a mapping {params_m, entries}"),
    (json.dumps({"name": "x", "paper": {"params_m": None, "entries": [{**MOE_ENTRY,
                                                                         "value": "23,25"}]}}),
     "paper.entries value '23,25' (moe, σ-MoE, Mini) is not a number"),
])
def test_a_broken_exp_file_is_one_line_naming_it(exps, body, said, capsys):
    (exps / "broken.yaml").write_text(body)
    with pytest.raises(SystemExit) as e:
        paper_tables.main(["--exp-dir", str(exps), "--runs", str(exps)])
    assert e.value.code.startswith(f"error: {exps / 'broken.yaml'}: ") and said in e.value.code


def test_no_table_entries_is_an_error(tmp_path, exps):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        paper_tables.main(["--exp-dir", str(tmp_path / "empty"), "--runs", str(tmp_path)])
    assert e.value.code == f"error: no exp file in {tmp_path / 'empty'} has paper.entries"
    with pytest.raises(SystemExit) as e:
        paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path), "--table", "pkm"])
    assert e.value.code.endswith("has paper.entries for table pkm")


def test_the_selector_flag_reaches_the_moe_tables_flops_column(exps, tmp_path):
    """--flops-selector changed the FLOPs table only: Tab. moe's column kept the paper's."""
    args = ["--exp-dir", str(exps), "--runs", str(tmp_path), "--table", "moe"]
    assert "· 25.0% FLOPs" in moe_cell(paper_tables.main(args))  # K/N_E = 1/4
    # + the selector's N_E * d_model of the experts' 2 * d_model * N_E * G (G = 16)
    assert "· 28.1% FLOPs" in moe_cell(paper_tables.main([*args, "--flops-selector"]))


@pytest.mark.parametrize("label,latex", [
    ("σ-MoE, no reg (γ=0,δ=0)", "$\\sigma$-MoE, no reg ($\\gamma$=0,$\\delta$=0)"),
    ("$\\sigma$-MoE (K=4 & G=128, 25%)", "$\\sigma$-MoE (K=4 \\& G=128, 25\\%)"),
    ("E8_α — N_E", "E8\\_$\\alpha$ --- N\\_E"),
    ("\\textbf{Dense} & co", "\\textbf{Dense} \\& co"),  # a LaTeX command keeps its braces
    ("Δ{x}", "$\\Delta$\\{x\\}"),
    ("R\\&D, 50\\% sparse, λ", "R\\&D, 50\\% sparse, $\\lambda$"),  # escaped already: kept
])
def test_labels_become_latex_text(label, latex):
    """A raw & added a column and a raw % commented out the rest of the row whenever a
    label held any $; other Greek letters stayed Unicode, which pdflatex rejects."""
    assert paper_tables.latex_escape(label) == latex


def test_mini_report_lists_only_the_sweeps_runs(tmp_path):
    """README's `+exp=mini_moe ffn.k=2 trainer.seed=3` was listed as not counted
    "(--all-overrides counts it)", though mini_moe is no variant of the mini sweep."""
    from scripts import mini_claims
    from tests.test_mini_claims import fake_run as mini_run

    root = tmp_path / "runs"
    mini_run(root, "mini_moe", 3, 2.0, [1.0], overrides="ffn.k=2,trainer.seed=3")
    mini_run(root, "mini_enwik_moe", 0, 2.0, [1.0], overrides="ffn.k=2,trainer.seed=0")
    text = mini_claims.main(["--runs", str(root)])
    noted = text.split("Not counted:\n")[1].split("\n\n")[0]
    assert "mini_enwik_moe with overrides ffn.k=2" in noted and "mini_moe/" not in noted


def test_a_full_disk_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "scripts/paper_tables.py", "--table", "flops",
                              "--runs", str(tmp_path)],
                             cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True)
    assert out.returncode == 1  # (the note: tmp_path holds no finished run)
    assert out.stderr.splitlines()[-1] == "error: cannot write the output: No space left on device"


def test_wandb_summaries_become_plain_dicts():
    """wandb hands nested summary values back as SummarySubDict (a mapping, not a dict):
    dict() converted the top level only, so no wandb run ever had a data version."""
    class Sub:
        def __init__(self, d):
            self.d = d

        def items(self):
            return self.d.items()

    data = Sub({"name": "c4", "sha256": Sub({"train": "a", "valid": "b"}), "l": (Sub({}),)})
    got = wandb_runs.plain(data)
    assert got == {"name": "c4", "sha256": {"train": "a", "valid": "b"}, "l": [{}]}
    assert run_versions.data_label(got) is not None


def test_stale_runs_of_a_sweep_are_found_from_relative_paths_too(tmp_path, monkeypatch):
    """`--runs .` inside runs/sweeps/mini gives paths without the sweep's directory name."""
    sweep = tmp_path / "runs" / "sweeps" / "mini"
    (sweep / "mini_wiki_moe" / "trainer.seed=1").mkdir(parents=True)
    stale = f"{run_results.STALE} configs/exp/mini_wiki_moe.yaml (stale, ...)"
    skipped = [run_results.Skipped(Path("mini_wiki_moe/trainer.seed=1"), "mini_wiki_moe", stale),
               run_results.Skipped(Path("mini_wiki_moe/ffn.k=2,trainer.seed=0"), "mini_wiki_moe",
                                   stale),  # another config on purpose: no sweep job of it
               run_results.Skipped(Path("other/trainer.seed=2"), "other", "unreadable")]
    monkeypatch.chdir(sweep)
    assert run_results.fresh_in_sweep("mini", skipped) == {("mini_wiki_moe", 1)}
    monkeypatch.chdir(tmp_path)  # the same paths, seen from elsewhere: not the sweep's
    assert run_results.fresh_in_sweep("mini", skipped) == set()


# -- from mutation testing: runs judged without a config hash, data versions --------
def test_an_unhashed_run_with_other_overrides_counts_only_with_all_overrides():
    """Mutant `same = not extra` -> `same = True`: a pre-hash run of `ffn.d_ff=32` counted
    as the experiment's own seed."""
    cfgs = {"tiny": {"trainer": {"seed": 0}}}
    other = Path("/r/tiny/ffn.d_ff=32,trainer.seed=0")
    why, overrides = run_results.Judge(Path("/x"), cfgs)("tiny", 0, other, run_hash=None)
    assert overrides == "ffn.d_ff=32" and "with overrides ffn.d_ff=32" in why
    with_all = run_results.Judge(Path("/x"), cfgs, all_overrides=True)
    assert with_all("tiny", 0, other, run_hash=None) == (None, "ffn.d_ff=32")
    assert run_results.Judge(Path("/x"), cfgs)("tiny", 0, Path("/r/tiny/trainer.seed=0"),
                                   run_hash=None) == (None, "")


def test_one_recorded_data_version_beside_unrecorded_runs_is_no_difference():
    """Mutant `len(set(groups) - {None}) < 2` -> `len(set(groups)) < 2`: runs from before
    the sha256s were recorded would make a single version look like two."""
    old = run_record(0, 1.0, None)
    old.data = {"name": "enwik8"}  # no sha256 recorded
    new = run_record(1, 1.0, None)
    new.data = {"name": "enwik8", "sha256": {"train": "ab" * 32}}
    assert run_versions.data_versions([old, new]) == []
    other = run_record(2, 1.0, None)
    other.data = {"name": "enwik8", "sha256": {"train": "cd" * 32}}
    assert len(run_versions.data_versions([old, new, other])) == 3


def test_precisions_are_listed_when_the_counted_runs_differ():
    """trainer.precision=auto: bf16 on a GPU, fp32 on a CPU, one config; a resume on
    another device trains in both. Runs from before runs recorded it only beside others."""
    def run(seed, *legs):
        r = run_record(seed, 1.0, None)
        r.results = {"precision": list(legs)} if legs else {}
        return r

    assert run_versions.precision_versions([run(0, "bf16"), run(1, "bf16"), run(2)]) == []
    assert run_versions.precision_versions([run(0, "bf16"), run(1, "bf16"),
                                            run(2, "fp32")]) == [
        "bf16: 2 runs", "fp32: x seed 2"]
    mixed = run_versions.precision_versions([run(0, "bf16", "fp32"), run(1)])
    assert mixed == ["bf16 then fp32: 1 run", "not recorded: x seed 1"]
    # and under the table
    t = paper_tables.build_table("moe", {"x": _exp()}, {"x": [run(0, "bf16"), run(1, "fp32")]})
    assert t.precision == ["bf16: 1 run", "fp32: x seed 1"]
    assert ("Precisions (results.json `precision`" in paper_tables.render_markdown(t)
            and "% precision: fp32: x seed 1" in paper_tables.render_latex(t))


def test_runs_behind_a_directory_link_are_found_once(exps, tmp_path, capsys):
    """Path.rglob does not follow directory links: runs/sweeps -> a scratch disk held no run.
    Overlapping roots (`--runs runs runs/plain`) listed each note and warning twice; a link
    back up the tree must not walk forever."""
    scratch = tmp_path / "scratch" / "tiny_moe"
    fake_run(scratch / "trainer.seed=0", exps, 0, 3.0, name="tiny_moe")
    fake_run(scratch / "trainer.seed=2", exps, 2, 3.1, name="tiny_moe", config_hash=None)
    runs = tmp_path / "runs"
    fake_run(runs / "plain" / "tiny_moe" / "trainer.seed=1", exps, 1, 3.2, name="tiny_moe",
             config_hash="deadbeef")
    (runs / "sweeps").symlink_to(tmp_path / "scratch", target_is_directory=True)
    (scratch / "loop").symlink_to(runs, target_is_directory=True)
    found, skipped = run_results.find_runs([runs, runs / "plain"], exps)
    assert [(r.seed, r.source) for r in found] == [
        (0, str(runs / "sweeps" / "tiny_moe" / "trainer.seed=0")),
        (2, str(runs / "sweeps" / "tiny_moe" / "trainer.seed=2"))]
    assert [s.path for s in skipped] == [runs / "plain" / "tiny_moe" / "trainer.seed=1"]
    assert capsys.readouterr().err.count("record no config_hash") == 1
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(runs), str(runs / "plain"),
                              "--table", "moe"])
    assert "| 3.050 ± 0.071 (n=2) / 2.90" in moe_cell(text)
    assert text.count("trainer.seed=1: config differs") == 1


def test_an_overrides_record_that_is_not_utf8_falls_back_to_the_directory_name(exps, tmp_path):
    """A UnicodeDecodeError is a ValueError, not an OSError or YAMLError: a traceback."""
    from sigma_moe.framework.cli import OVERRIDES

    runs = tmp_path / "runs" / "tiny_moe"
    for seed in (0, 1):
        fake_run(runs / f"trainer.seed={seed}", exps, seed, 3.0 + seed / 10, name="tiny_moe")
    (runs / "trainer.seed=1" / OVERRIDES).write_bytes(b'dirname: "trainer.seed=1\xff"\n')
    assert run_results.run_overrides(runs / "trainer.seed=1", "tiny_moe") == "trainer.seed=1"
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "moe"])
    assert "| 3.050 ± 0.071 (n=2) / 2.90" in moe_cell(text)


def test_a_seed_that_ran_twice_names_the_run_left_out():
    """by_experiment keeps one run per seed; the others vanished without a word."""
    def run(source, seed=0, mtime=1.0, overrides=""):
        r = run_record(seed, 1.0, None)
        r.source, r.mtime, r.overrides = source, mtime, overrides
        return r

    own, newer, other = run("/r/a", mtime=1.0), run("/r/b", mtime=2.0), run("/r/c", mtime=3.0,
                                                                             overrides="ffn.k=2")
    wandb, first, again = run("wandb:p/1", mtime=0.0), run("/r/d", 1), run("/r/e", 1)
    runs = [own, newer, other, wandb, first, again]
    assert run_results.by_experiment(runs) == {"x": [newer, first]}
    assert [str(s) for s in run_results.superseded(runs)] == [
        "/r/a: seed 0 also ran in /r/b, which counts (its results.json is newer)",
        "/r/c: seed 0 also ran in /r/b, which counts (the experiment's own config)",
        "wandb:p/1: seed 0 also ran in /r/b, which counts (a local run)",
        "/r/e: seed 1 also ran in /r/d, which counts (found first)"]


def test_an_unreadable_results_file_is_listed_under_its_table_and_relaunched_fresh(
        exps, tmp_path, capsys):
    """It was on stderr only, and the table asked for its seed with a command run.py answers
    "this run already finished" (its config_hash matches): fresh=true trains beside it."""
    sweep = tmp_path / "runs" / "sweeps" / "moe" / "tiny_moe"
    fake_run(sweep / "trainer.seed=0", exps, 0, 3.0, name="tiny_moe")
    res = fake_run(sweep / "trainer.seed=1", exps, 1, 3.1, name="tiny_moe")
    (sweep / "trainer.seed=1" / "results.json").write_text(json.dumps({**res, "test": {}}))
    (tmp_path / "runs" / "tiny_moe-2").mkdir()  # a fresh=true sibling of a plain run
    (tmp_path / "runs" / "tiny_moe-2" / "results.json").write_text("{")
    (tmp_path / "runs" / "other").mkdir()  # no experiment of this table
    (tmp_path / "runs" / "other" / "results.json").write_text("{")
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "moe"])
    assert text.split("Not counted:\n")[1].splitlines() == [
        f"- {sweep / 'trainer.seed=1' / 'results.json'}: unreadable results.json (test has "
        "no number 'bpc')",
        f"- {tmp_path / 'runs' / 'tiny_moe-2' / 'results.json'}: unreadable results.json (not "
        "JSON (JSONDecodeError))"]
    assert text.split(paper_tables.MISSING + "\n")[1].split("\n\n")[0].splitlines() == [
        "- `python run.py -m +sweep=moe +exp=tiny_moe trainer.seed=2`",
        "- `python run.py -m +sweep=moe +exp=tiny_moe trainer.seed=1 fresh=true`"]
    assert capsys.readouterr().err.count("warning: ") == 3  # on stderr as before


def test_a_results_file_that_is_not_json_is_relaunched_without_fresh(exps, tmp_path):
    """run.py reads it as unfinished and resumes from the run's checkpoints (re-evaluating):
    fresh=true would retrain beside them from step 0."""
    sweep = tmp_path / "runs" / "sweeps" / "moe" / "tiny_moe"
    fake_run(sweep / "trainer.seed=0", exps, 0, 3.0, name="tiny_moe")
    fake_run(sweep / "trainer.seed=1", exps, 1, 3.1, name="tiny_moe")
    (sweep / "trainer.seed=1" / "results.json").write_bytes(b"\xff{")  # not UTF-8 either
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "moe"])
    assert text.split(paper_tables.MISSING + "\n")[1].split("\n\n")[0].splitlines() == [
        "- `python run.py -m +sweep=moe +exp=tiny_moe trainer.seed=1,2`"]


def test_a_run_that_records_no_seed_says_so(exps, tmp_path, capsys):
    """Judged as seed None, it read as "config differs (stale)": the reason was not that."""
    run = tmp_path / "runs" / "tiny_moe" / "trainer.seed=0"
    res = fake_run(run, exps, 0, 3.0, name="tiny_moe")
    (run / "results.json").write_text(json.dumps({k: v for k, v in res.items() if k != "seed"}))
    text = paper_tables.main(["--exp-dir", str(exps), "--runs", str(tmp_path / "runs"),
                              "--table", "moe"])
    why = f"{run / 'results.json'}: unreadable results.json (no 'seed')"
    assert text.split("Not counted:\n")[1].splitlines() == [f"- {why}"]
    assert capsys.readouterr().err == f"warning: {why}\n"
    judge = run_results.Judge(exps, run_results.compose_experiments(exps, ["tiny_moe"]))
    assert judge("tiny_moe", None, None, logged={}) == (  # a wandb run that logged none
        "no seed recorded (trainer.seed): which seed it trained cannot be told", "")


def test_wandb_runs_left_out_before_judging_get_one_note(exps, monkeypatch, capsys):
    """Unfinished runs, finished ones with no `name` or no summary numbers were dropped
    without a word: a finished run lacking test_bpc looked like a seed never run."""
    import types

    from tests.test_paper_tables import exp_config

    cfg = exp_config(exps, "tiny_moe")

    def run(id_, state="finished", seed=0, summary=None, **config):
        logged = {**cfg, "trainer": {**cfg["trainer"], "seed": seed}, **config}
        return types.SimpleNamespace(id=id_, state=state, config=logged,
                                     summary={"valid_bpc": 3.1, "test_bpc": 3.0}
                                     if summary is None else summary)

    runs = [run("ok"), run("c1", "crashed"), run("c2", "crashed"), run("r", "running"),
            run("anon", name=None), run("partial", seed=1, summary={"valid_bpc": 3.1}),
            run("nan", seed=2, summary={"valid_bpc": 3.1, "test_bpc": math.nan})]
    fake = types.SimpleNamespace(Api=lambda: types.SimpleNamespace(runs=lambda p: runs))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    found, skipped = wandb_runs.wandb_runs("me/proj", exps)
    assert [r.source for r in found] == ["wandb:me/proj/ok"] and skipped == []
    assert capsys.readouterr().err == (
        "note: --wandb me/proj: 6 run(s) left out: 3 not finished (crashed (2), running (1)); "
        "1 finished with no config `name` (wandb:me/proj/anon); 2 finished with no finite "
        "valid_/test_<ppl|bpc> in its summary (wandb:me/proj/partial, wandb:me/proj/nan)\n")


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_name_the_output_cannot_encode_is_escaped(encoding, monkeypatch):
    """A directory name that is not UTF-8 (\\xff, kept as the surrogate \\udcff) in a "Not
    counted" line: a strict stdout raised UnicodeEncodeError, and no report was written."""
    import io

    out = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    run_results.print_out("- runs/old\udcff: σ-MoE\n")
    written = out.buffer.getvalue().decode(encoding)
    assert written == ("- runs/old\\udcff: σ-MoE\n" if encoding == "utf-8" else
                       "- runs/old\\udcff: \\u03c3-MoE\n")
