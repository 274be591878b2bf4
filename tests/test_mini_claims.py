"""The laptop-scale claim check (issue 9; scripts/mini_claims.py, configs/sweep/mini.yaml):
the claim rules on hand-built numbers, the report from run directories, and every mini
experiment composes, shares one token budget and is parameter-matched to its dense twin.
"""
from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path

import pytest

from scripts import mini_claims
from scripts.mini_claims import Claim, Comparison, check_claims, compare, verdict
from scripts.run_results import OVERRIDDEN_HEADING
from scripts.run_versions import CODE_HEADING
from sigma_moe.framework.code_version import code_fingerprint, code_version
from sigma_moe.framework.experiment import run_hashes
from tests.helpers import EXPS, compose_cfg, compose_sweep, jobs, load, tables_of

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
MINI = sorted(n for n in EXPS if tables_of(n) == {"mini"})  # mini_moe / mini_dense: none
ENWIK, WIKI = mini_claims.DATASETS.values()


# -- the rules ----------------------------------------------------------------------------------
def test_compare_is_students_t_with_pooled_std():
    a, b = [1.00, 1.01, 0.99], [1.10, 1.11, 1.09]  # std 0.01 each, means differ by 0.1
    c = compare(a, b)
    assert c.diff == pytest.approx(-0.1) and c.rel == pytest.approx(-0.1 / 1.1)
    assert c.pooled == pytest.approx(0.01)
    assert c.t == pytest.approx(-0.1 / (0.01 * math.sqrt(2 / 3)))  # -12.25
    c = compare([1.0, 1.2], [2.0, 2.0, 2.0, 2.0])  # unequal n: only a contributes variance
    assert c.pooled == pytest.approx(math.sqrt(0.02 / 4))
    assert compare([1.0], [1.2]).pooled is None and compare([1.0], [1.2]).t is None


@pytest.mark.parametrize("a, b, beats, matches", [
    ([1.00, 1.01, 0.99], [1.10, 1.11, 1.09], "holds", "holds (better)"),  # t = -12.2
    ([1.10, 1.11, 1.09], [1.00, 1.01, 0.99], "fails", "fails"),
    ([1.00, 1.03, 0.97], [1.02, 1.05, 0.99], "not significant", "holds"),  # t = -0.82
    ([1.02, 1.05, 0.99], [1.00, 1.03, 0.97], "reversed, not significant", "holds"),
    ([100.0] * 3, [100.5] * 3, "holds", "holds"),  # no spread: the 1% rule matches
    ([102.0] * 3, [100.0] * 3, "fails", "fails"),  # 2% worse, no spread
    ([1.0], [1.005], "n/a (1 seed)", "holds"),  # one seed: only the 1% rule
    ([1.0], [1.2], "n/a (1 seed)", "holds (better)"),
])
def test_verdicts(a, b, beats, matches):
    c = compare(a, b)
    assert verdict("beats", c) == beats
    assert verdict("matches", c) == matches


def test_matches_within_two_pooled_std_but_not_beyond():
    b = [3.0, 3.1, 2.9]  # std 0.1, so pooled 0.1: tolerance 0.2 (6.7%, far above 1%)
    assert verdict("matches", compare([x + 0.19 for x in b], b)) == "holds"
    assert verdict("matches", compare([x + 0.21 for x in b], b)) == "fails"
    assert verdict("matches", compare([x - 0.21 for x in b], b)) == "holds (better)"
    with pytest.raises(ValueError, match="kind"):
        verdict("equals", compare(b, b))


def test_check_claims_per_dataset_and_missing_runs():
    base = [2.00, 2.02, 1.98]
    values = {(v, ENWIK): list(base) for v in mini_claims.VARIANTS}
    values[("switch", ENWIK)] = [x + 0.3 for x in base]  # far worse: sigma-MoE beats Switch
    values[("pkm_relu", ENWIK)] = [x + 0.3 for x in base]  # ReLU PKM worse: claim fails
    values[("topk", ENWIK)] = [x + 0.01 for x in base]  # within the spread: matches
    results = {(r.claim.b, r.claim.a, r.column): r for r in check_claims(values)}
    assert len(results) == 2 * len(mini_claims.CLAIMS)
    assert results[("switch", "moe", ENWIK)].verdict == "holds"
    assert results[("pkm_softmax", "pkm_relu", ENWIK)].verdict == "fails"
    assert results[("dense", "topk", ENWIK)].verdict == "holds"
    assert results[("dense", "moe", ENWIK)].verdict == "holds"  # identical numbers
    assert results[("sbase", "moe", ENWIK)].verdict == "reversed, not significant"  # t = 0
    assert all(r.verdict == "missing" and r.comparison is None
               for (_, _, col), r in results.items() if col == WIKI)
    every = {v for c in mini_claims.CLAIMS for v in (c.a, c.b)}
    assert every <= set(mini_claims.VARIANTS)
    custom = check_claims(values, columns=[ENWIK], claims=[Claim("x", "beats", "moe", "topk")],
                          t_min=0.5)
    assert [r.verdict for r in custom] == ["holds"]  # t = -0.61 clears a lower bar


# -- the report ---------------------------------------------------------------------------------
@functools.cache
def config_hash(name: str, seed: int) -> str:
    """As a run of `python run.py +exp=<name> trainer.seed=<seed>` records it."""
    return run_hashes(compose_cfg([f"trainer.seed={seed}"], name))[0]


def fake_run(root: Path, name: str, seed: int, bpc: float, tok_s: list[float],
             rss: float | None = None, overrides: str | None = None,
             other_config: bool = False, run: Path | None = None,
             code: dict | None = None) -> None:
    run = run or root / name / (overrides or f"trainer.seed={seed}")
    run.mkdir(parents=True)
    res = {"name": name, "metric": "bpc", "seed": seed, "n_params": 916_000, "steps": 200,
           "train_seconds": 30.0 + seed, "valid": {"bpc": bpc + 0.1}, "test": {"bpc": bpc},
           "config_hash": "0123456789ab" if other_config or overrides else
           config_hash(name, seed), "code": code or code_version()}
    if rss is not None:
        res["peak_rss_mb"] = rss
    (run / "results.json").write_text(json.dumps(res))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 10 * (i + 1), "train/loss": 2.0, "train/tokens_per_s": t}) + "\n"
        for i, t in enumerate(tok_s)) + json.dumps({"step": 200, "final_test/bpc": bpc}) + "\n")


def test_report_from_run_directories(tmp_path):
    root = tmp_path / "runs" / "sweeps" / "mini"
    for seed, bpc in enumerate([2.00, 2.01, 1.99]):
        fake_run(root, "mini_enwik_dense", seed, bpc, [900.0, 1000.0, 5000.0])
        fake_run(root, "mini_enwik_moe", seed, bpc - 0.5, [2000.0], rss=400.0 + seed)
    fake_run(root, "mini_enwik_moe", 0, 9.0, [1.0], overrides="ffn.k=2,trainer.seed=0")
    fake_run(root, "mini_enwik_switch", 0, 8.0, [1.0], other_config=True,
             run=tmp_path / "runs" / "smoke")  # +exp=... trainer.steps=10 hydra.run.dir=...
    text = mini_claims.main(["--runs", str(tmp_path / "runs")])
    lines = text.splitlines()
    assert "| Dense | 2.000 ± 0.010 (n=3) · 0.916M | — |" in lines
    assert "| σ-MoE (ours) | 1.500 ± 0.010 (n=3) · 0.916M | — |" in lines
    t = -0.5 / (0.01 * math.sqrt(2 / 3))
    assert (f"| σ-MoE matches parameter-equal dense (Tab. moe) | {ENWIK} | holds (better) | "
            f"-0.500 | -25.0% | 0.010 | {t:+.2f} |") in lines
    assert f"| σ-MoE beats Switch (Tab. ablation) | {ENWIK} | missing | | | | |" in lines
    # throughput: median tok/s, ratio to dense, mean train seconds, peak RSS when recorded
    assert "| Dense | 1,000 | 1.00 | 31.0 | — | — | — | — | — |" in lines
    assert "| σ-MoE (ours) | 2,000 | 2.00 | 31.0 | 401 |" in text
    fake_run(root, "mini_wiki_dense", 1, 5.0, [1000.0])  # 1 of 3 seeds: a partial cell
    text = mini_claims.main(["--runs", str(tmp_path / "runs")])
    assert "| Dense | 2.000 ± 0.010 (n=3) · 0.916M | 5.000 (n=1) · 0.916M |" in text
    missing = text.split("Missing runs:\n")[1].split("\n\n")[0].splitlines()
    assert missing[0].startswith("- `python run.py -m +sweep=mini +exp=mini_enwik_topk,")
    assert "mini_enwik_dense," not in missing[0] and "mini_wiki_dense," not in missing[0]
    assert missing[1:] == ["- `python run.py -m +sweep=mini +exp=mini_wiki_dense "
                           "trainer.seed=0,2`"]
    assert text.split("Not counted:\n")[1].split("\n\n")[0].splitlines() == [
        f"- {tmp_path / 'runs/smoke'}: config differs from "
        "configs/exp/mini_enwik_switch.yaml (stale, or made with other settings)",
        f"- {root / 'mini_enwik_moe/ffn.k=2,trainer.seed=0'}: mini_enwik_moe with overrides "
        "ffn.k=2 (--all-overrides counts it)"]
    assert "9.000" not in text and "8.000" not in text  # neither is counted
    assert CODE_HEADING not in text  # the current code trained every counted run
    fake_run(root, "mini_wiki_dense", 2, 5.0, [1000.0],
             code={"fingerprint": "0ld0ld0ld0ld", "git": None, "trained_with": ["0ld0ld0ld0ld"]})
    text = mini_claims.main(["--runs", str(tmp_path / "runs")])
    versions = text.split(CODE_HEADING + "\n")[1].split("\n\n")[0].splitlines()
    assert versions[0].startswith(f"- {code_fingerprint()} (")
    assert versions[0].endswith("the current code): 7 runs")
    assert versions[1:] == ["- 0ld0ld0ld0ld: mini_wiki_dense seed 2"]
    # a stale run where the sweep would train a missing seed: that seed gets fresh=true (the
    # sweep's job would stop there, asking for it), the others not (an unfinished run resumes)
    fake_run(root, "mini_wiki_moe", 1, 6.0, [1.0], other_config=True)
    text = mini_claims.main(["--runs", str(tmp_path / "runs")])
    missing = text.split("Missing runs:\n")[1].split("\n\n")[0].splitlines()
    assert missing[1:] == [
        "- `python run.py -m +sweep=mini +exp=mini_wiki_dense trainer.seed=0`",
        "- `python run.py -m +sweep=mini +exp=mini_wiki_moe trainer.seed=0,2`",
        "- `python run.py -m +sweep=mini +exp=mini_wiki_moe trainer.seed=1 fresh=true`"]
    # --all-overrides counts a run of other settings for a seed the experiment lacks: the
    # cell is marked and the run listed
    fake_run(root, "mini_wiki_dense", 0, 7.0, [1.0], overrides="ffn.d_ff=64,trainer.seed=0")
    assert "†" not in mini_claims.main(["--runs", str(tmp_path / "runs")])
    text = mini_claims.main(["--runs", str(tmp_path / "runs"), "--all-overrides"])
    assert "| Dense | 2.000 ± 0.010 (n=3) · 0.916M | 5.667 ± 1.155 (n=3)† · " in text
    assert text.split(OVERRIDDEN_HEADING + "\n")[1].split("\n\n")[0].splitlines() == [
        f"- {root / 'mini_wiki_dense/ffn.d_ff=64,trainer.seed=0'}: mini_wiki_dense seed 0 "
        "with ffn.d_ff=64"]


def test_an_unreadable_results_file_is_warned_about_and_labelled(tmp_path, capsys):
    root = tmp_path / "runs"
    fake_run(root, "mini_enwik_dense", 0, 2.0, [1000.0])
    run = root / "mini_enwik_dense" / "trainer.seed=0"
    res = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**res, "test": {"loss": 1.0}}))
    text = mini_claims.main(["--runs", str(root)])  # no KeyError traceback
    assert "| Dense | — | — |" in text
    why = f"{run / 'results.json'}: unreadable results.json (test has no number 'bpc')"
    assert text.split("Not counted:\n")[1].splitlines()[0] == f"- {why}"
    assert capsys.readouterr().err == f"warning: {why}\n"


@pytest.mark.parametrize("bad", ["not UTF-8", "a directory"])
def test_an_unreadable_metrics_file_leaves_out_only_its_throughput(bad, tmp_path, capsys):
    """metrics.jsonl only feeds the throughput table: one that cannot be read stopped the
    whole report with a traceback."""
    root = tmp_path / "runs"
    for seed, tok_s in enumerate((1000.0, 3000.0)):
        fake_run(root, "mini_enwik_dense", seed, 2.0 + seed / 100, [tok_s])
    path = root / "mini_enwik_dense" / "trainer.seed=1" / "metrics.jsonl"
    if bad == "a directory":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(b'{"train/tokens_per_s": 3000}\n\xff\xfe\n')
    text = mini_claims.main(["--runs", str(root)])
    assert "| Dense | 2.005 ± 0.007 (n=2) · 0.916M | — |" in text
    assert "| Dense | 1,000 | 1.00 | 30.5 |" in text  # seed 0's tok/s only; both train_s
    why = "Is a directory" if bad == "a directory" else "UnicodeDecodeError"
    assert capsys.readouterr().err == (f"warning: {path}: cannot be read ({why}); its run's "
                                       "tok/s is left out of the throughput table\n")


def test_a_seed_that_ran_twice_lists_the_run_left_out(tmp_path):
    """The newest run of a seed counts; the other vanished without a word."""
    import os

    root = tmp_path / "runs"
    fake_run(root, "mini_enwik_dense", 0, 2.0, [1000.0], run=root / "mini_enwik_dense")
    os.utime(root / "mini_enwik_dense" / "results.json", (1_000, 1_000))  # the older one
    fake_run(root, "mini_enwik_dense", 0, 2.5, [1000.0])
    text = mini_claims.main(["--runs", str(root)])
    assert "| Dense | 2.500 (n=1) · 0.916M | — |" in text
    assert text.split("Not counted:\n")[1].splitlines()[0] == (
        f"- {root / 'mini_enwik_dense'}: seed 0 also ran in "
        f"{root / 'mini_enwik_dense' / 'trainer.seed=0'}, which counts (its results.json is "
        "newer)")


@pytest.mark.parametrize("body, said", [
    ("name: [unclosed", "while parsing a flow sequence"),
    ("- just a list", "holds a list, not a mapping of config keys"),
    ("paper: [1, 2]", "paper must be a mapping {params_m, entries}"),
    ("paper: {entries: [mini]}", "paper.entries must be a list of {table, row, column, value}"),
])
def test_a_broken_mini_exp_file_is_one_line_naming_it(body, said, tmp_path):
    """As scripts/paper_tables.py says it, not a 52-line YAML traceback."""
    exp_dir = tmp_path / "exp"
    shutil.copytree(CONFIGS / "exp", exp_dir)
    (exp_dir / "mini_wiki_topk.yaml").write_text(body)
    with pytest.raises(SystemExit) as e:
        mini_claims.main(["--runs", str(tmp_path), "--exp-dir", str(exp_dir)])
    assert e.value.code == f"error: {exp_dir / 'mini_wiki_topk.yaml'}: {said}"


def test_runs_must_exist_unless_the_default(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:  # a typo: not every run listed as missing
        mini_claims.main(["--runs", str(tmp_path / "nope")])
    assert e.value.code == f"error: --runs {tmp_path / 'nope'} is not a directory"
    with pytest.raises(SystemExit) as e:  # as paper_tables: not every variant missing
        mini_claims.main(["--exp-dir", str(tmp_path / "nope")])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: --exp-dir {tmp_path / 'nope'} is not a "
                                            "directory\n")
    monkeypatch.chdir(tmp_path)  # the default runs/sweeps/mini need not exist yet
    assert "mini_enwik_dense" in mini_claims.main([]).split("Missing runs:")[1]
    assert capsys.readouterr().err == (f"note: no runs/sweeps/mini/ in {tmp_path}; if runs "
                                       "exist elsewhere, point --runs at their directory\n")


# -- the experiments and the sweep -------------------------------------------------------------
def test_every_variant_on_both_datasets():
    assert MINI == sorted(mini_claims.exp_name(d, v) for d in mini_claims.DATASETS
                          for v in mini_claims.VARIANTS)
    rows = mini_claims.mini_rows(CONFIGS / "exp")
    assert set(rows) == set(mini_claims.VARIANTS) and len(set(rows.values())) == len(rows)


@pytest.mark.parametrize("name", MINI)
def test_mini_experiment_is_parameter_matched_with_one_token_budget(name):
    _, data, variant = name.split("_", 2)
    cfg, _, count = load(name)
    dense_cfg, _, dense = load(mini_claims.exp_name(data, "dense"))
    assert cfg["name"] == name and cfg["dataset"]["kind"] == mini_claims.DATASETS[data]
    assert cfg["model"] == {"d_model": 128, "n_layers": 4, "n_heads": 4, "head_dim": 32,
                            "dropout": 0.1}  # configs/model/tiny.yaml
    assert abs(count - dense) <= 0.02 * dense, f"{name}: {count} vs dense {dense}"
    # the same training and evaluation for every variant: one token budget, one subset
    assert cfg["task"] == dense_cfg["task"] and cfg["trainer"] == dense_cfg["trainer"]
    assert cfg["trainer"]["steps"] * cfg["task"]["batch_size"] * cfg["task"]["context"] == 204_800
    assert cfg["task"]["final_segments"] > 0 and cfg["trainer"]["val_every"] >= \
        cfg["trainer"]["steps"]  # bounded evaluation, no periodic validation
    assert cfg["paper"] == {"params_m": None, "entries": [
        {"table": "mini", "row": mini_claims.mini_rows(CONFIGS / "exp")[variant],
         "column": mini_claims.DATASETS[data], "value": None}]}

    ffn, moe = cfg["ffn"], load(mini_claims.exp_name(data, "moe"))[0]["ffn"]
    if variant in ("dense", "topk"):
        assert ffn["d_ff"] == 518  # N_E * G + the selector, as the paper's 2053 for 2048
    if variant.startswith("moe"):  # an ablation changes only its own keys of sigma-MoE
        changed = {k for k in ffn if ffn[k] != moe[k]}
        assert changed == {"moe": set(), "moe_softmax": {"selection"},
                           "moe_softmax_renorm": {"selection"},
                           "moe_standard_init": {"init"},
                           "moe_no_reg": {"reg_gamma", "expert_dropout"} if moe["expert_dropout"]
                           else {"reg_gamma"}}[variant]
        assert ffn["n_experts"] * ffn["expert_size"] == 512 and ffn["k"] * 4 == ffn["n_experts"]
    if variant in ("switch", "sbase"):
        assert ffn["n_experts"] * ffn["expert_size"] == 512
    if variant.startswith("pkm"):  # the sub-key count whose FFN size is nearest the dense one
        d, per_layer = 128, lambda n: n * n * d + ffn["heads"] * n * d  # values + sub-keys
        dense_layer = 2 * d * 518 + 518 + d
        n = ffn["n_subkeys"]
        assert abs(per_layer(n) - dense_layer) < min(abs(per_layer(n + s) - dense_layer)
                                                     for s in (-1, 1))
        assert ffn["activation"] == variant.split("_")[1] and ffn["k"] >= n


def test_sweep_runs_every_mini_experiment_three_times_sequentially():
    cfg = compose_sweep("mini")
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")  # one after another, here
    assert cfg.sweep_name == "mini"
    got = sorted((j["+exp"], j["trainer.seed"]) for j in jobs(cfg))
    assert got == sorted((e, s) for e in MINI for s in "012")


def test_t_uses_both_sample_sizes():
    """Mutant `sqrt(1/n_a + 1/n_b)` -> `sqrt(2/n_a)` (right only for equal n)."""
    a, b = [1.0, 1.2], [2.0, 2.1, 1.9, 2.0]
    c = compare(a, b)
    pooled = math.sqrt((0.02 + 0.02) / 4)
    assert c.pooled == pytest.approx(pooled)
    assert c.t == pytest.approx(c.diff / (pooled * math.sqrt(1 / 2 + 1 / 4)))


def test_beats_boundaries_are_inclusive():
    """Mutants `t <= -t_min` -> `<` and `t >= t_min` -> `>` (docstring: holds if t <= -2,
    fails if t >= 2)."""
    assert verdict("beats", Comparison(-0.2, -0.1, 0.1, -2.0)) == "holds"
    assert verdict("beats", Comparison(0.2, 0.1, 0.1, 2.0)) == "fails"


def test_matches_boundary_of_the_one_percent_rule_is_inclusive():
    """Mutant `abs(c.rel) <= match_rel` -> `<` (docstring: |diff| <= 1% of mean_b)."""
    assert verdict("matches", Comparison(0.01, 0.01, None, None)) == "holds"
    assert verdict("matches", Comparison(0.0101, 0.0101, None, None)) == "fails"
