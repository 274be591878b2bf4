"""Routing / sparsity analysis of trained runs and its figures (issue 7; paper Fig. 1,
Figs. moe_counts_*, Fig. coocurence)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from scripts import analyze
from sigma_moe import kernels
from sigma_moe.framework.checkpoint import load_latest, save_checkpoint
from sigma_moe.models.ffn.base import RoutingStats
from sigma_moe.tasks import TASKS
from tests.helpers import TINY, TINY_MOE, compose_cfg

FAST = [o for o in TINY if not o.startswith("task.final_segments")]
COMMON = [*FAST, "trainer.steps=3", "task.final_segments=2", "trainer.val_every=1000"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    run = TASKS.get("lm")
    run(compose_cfg([*COMMON, *TINY_MOE, "name=tiny_moe"]), root / "moe")
    run(compose_cfg([*COMMON, "ffn.d_ff=64", "name=tiny_dense"], "mini_dense"), root / "dense")
    return root


def files(paths):
    return sorted(p.name for p in paths)


def test_active_channels_of_a_hand_built_dense_layer(runs, tmp_path):
    """W1 = 0 and a bias with m positive entries: u = relu(b) has exactly m active channels
    for every token, so the mean is m and the std 0 (layer 1: m=5, layer 2: m=12)."""
    run_dir = tmp_path / "dense"
    shutil.copytree(runs / "dense", run_dir)
    state = load_latest(run_dir)
    for layer, m in enumerate((5, 12)):
        state["model"][f"blocks.{layer}.ffn.w1.weight"].zero_()
        state["model"][f"blocks.{layer}.ffn.w1.bias"].copy_(
            torch.tensor([1.0] * m + [-1.0] * (64 - m)))
    save_checkpoint(run_dir, state["step"] + 1, state)
    out = tmp_path / "fig"
    paths = analyze.main([str(run_dir), "--out", str(out)])
    assert files(paths) == ["active_channels.pdf", "active_channels.png", "analysis.json"]
    [res] = json.loads((out / "analysis.json").read_text())["runs"]
    assert res["step"] == state["step"] and res["ffn"] == "dense"
    assert [la["active_mean"] for la in res["layers"]] == [5.0, 12.0]
    assert [la["active_std"] for la in res["layers"]] == [0.0, 0.0]
    assert [la["width"] for la in res["layers"]] == [64.0, 64.0]
    assert res["tokens"] == 2 * 2 * 32  # 2 segments of eval_batch_size 2 x context 32


def test_moe_analysis_matches_the_runs_own_statistics(runs, tmp_path):
    """Default --max-segments is the run's final_segments: the same pass as results.json."""
    out = tmp_path / "fig"
    paths = analyze.main([str(runs / "moe"), "--out", str(out)])
    assert files(paths) == sorted(
        ["analysis.json"] + [f"{stem}.{ext}" for ext in ("png", "pdf") for stem in
                             ("expert_usage", "cooccurrence_layer1", "cooccurrence_layer2")])
    assert all(p.stat().st_size > 1000 for p in paths)
    [res] = json.loads((out / "analysis.json").read_text())["runs"]
    ref = json.loads((runs / "moe" / "results.json").read_text())
    assert res["bpc"] == pytest.approx(ref["valid"]["bpc"], abs=1e-6)
    for la, want in zip(res["layers"], ref["valid_routing"], strict=True):
        np.testing.assert_allclose(la["expert_share"], want["expert_share"], atol=1e-9)
        np.testing.assert_allclose(la["cooccurrence"], want["cooccurrence"], atol=1e-9)
        assert la["expert_share_sorted"] == sorted(la["expert_share"], reverse=True)
        assert la["usage_entropy"] == pytest.approx(want["usage_entropy"])
    # one chosen layer; a checkpoint file instead of the run directory; the test split
    ckpt = sorted((runs / "moe").glob("checkpoint_*.pt"))[-1]
    paths = analyze.main([str(ckpt), "--out", str(tmp_path / "l2"), "--layer", "2",
                          "--split", "test", "--max-segments", "1"])
    assert "cooccurrence_layer2.png" in files(paths)
    assert "cooccurrence_layer1.png" not in files(paths)
    assert "expert_usage_layer2.pdf" in files(paths)
    [res] = json.loads((tmp_path / "l2" / "analysis.json").read_text())["runs"]
    assert res["split"] == "test" and res["tokens"] == 2 * 32


def test_bad_arguments_stop_before_the_evaluation(runs, monkeypatch, capsys):
    def evaluate(*args, **kwargs):
        raise AssertionError("evaluated before checking the arguments")

    monkeypatch.setattr(analyze, "analyze", evaluate)
    for argv, error in ((["--layer", "3"], "--layer 3: the runs have layers 1..2"),
                        (["--layer", "0"], "--layer 0: the runs have layers 1..2"),
                        (["--max-segments", "-1"],  # would read the whole split, silently
                         "--max-segments -1: must be >= 0 (0 = the whole split)")):
        with pytest.raises(SystemExit) as e:
            analyze.main([str(runs / "moe"), *argv])
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {error}")


def test_default_output_per_split(runs, tmp_path, capsys):
    """Each split has a folder of its own (valid+test when pooled): the second split's
    analysis must not overwrite the first's."""
    run_dir = tmp_path / "dense"
    shutil.copytree(runs / "dense", run_dir)
    for split in ("test", "valid"):
        analyze.main([str(run_dir), "--split", split, "--max-segments", "1"])
    for split in ("test", "valid"):
        [res] = json.loads((run_dir / "analysis" / split / "analysis.json").read_text())["runs"]
        assert res["split"] == split
    assert f"wrote 3 files to {run_dir / 'analysis' / 'valid'}" in capsys.readouterr().out


def test_hand_built_routing(tmp_path):
    """Expert shares, popularity order and co-occurrence of a known routing, computed by
    RoutingStats and drawn, against a direct count."""
    expert_TK = torch.tensor([[0, 1], [0, 2], [3, 0], [1, 2], [0, 1], [2, 3]])
    gate_TK = torch.tensor([[0.9, 0.1], [0.5, 0.4], [0.2, 0.8], [0.3, 0.3], [0.6, 0.6],
                            [0.7, 0.05]])
    stats = RoutingStats()
    stats.enabled = True
    stats.record_moe(expert_TK, gate_TK, n_experts=4)
    dense = RoutingStats()
    dense.enabled = True
    dense.record_active(torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]))
    layers = analyze.summarize_layers([stats.summary(), dense.summary()])
    run = {"label": "hand", "layers": layers}
    paths = analyze.write_figures([run], tmp_path, layer=1)
    assert files(paths) == sorted(
        ["analysis.json"] + [f"{stem}.{ext}" for ext in ("png", "pdf") for stem in
                             ("active_channels", "expert_usage", "expert_usage_layer1",
                              "cooccurrence_layer1")])
    saved = json.loads((tmp_path / "analysis.json").read_text())["runs"][0]["layers"]
    # direct computation
    weight = np.zeros(4)
    both = np.zeros((4, 4))
    for experts, gates in zip(expert_TK.tolist(), gate_TK.tolist()):
        for e, g in zip(experts, gates):
            weight[e] += g
        for e in experts:
            for f in experts:
                both[e, f] += 1
    share = weight / weight.sum()
    np.testing.assert_allclose(saved[0]["expert_share"], share)
    assert saved[0]["expert_order"] == [0, 2, 1, 3] == np.argsort(-weight).tolist()
    np.testing.assert_allclose(saved[0]["expert_share_sorted"], np.sort(share)[::-1])
    cond = both / np.diag(both)[:, None]  # P(f chosen | e chosen)
    np.testing.assert_allclose(saved[0]["cooccurrence"], cond)
    # the drawn rows: the distribution of each expert's partners (diagonal out, sum 1)
    partners = both - np.diag(np.diag(both))
    np.testing.assert_allclose(saved[0]["cooccurrence_distribution"],
                               partners / partners.sum(1, keepdims=True))
    assert saved[0]["cooccurrence_distribution"][0] == pytest.approx([0, 2 / 4, 1 / 4, 1 / 4])
    alone = analyze.cooccurrence_distribution([[3.0, 0.0], [0.0, 0.0]])  # K = 1, a dead one
    assert alone.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert saved[0]["dead_fraction"] == 0.0
    assert analyze.experts_per_token(saved[0]["cooccurrence"]) == 2
    assert analyze.experts_per_token([[1.0, 0.0], [0.0, 0.0]]) == 1  # K = 1, a dead one
    assert saved[1]["active_mean"] == 1.5 and saved[1]["active_std"] == 0.5  # counts 2 and 1


def test_splits_pool_their_routing_statistics(runs):
    """--split valid,test (paper Fig. 1 pools them): the routing sums of the pooled pass are
    those of the two splits added, the loss their token-weighted mean."""
    from sigma_moe.tasks.trained import load_trained

    run = load_trained(runs / "moe", "cpu")
    ffns = run.model.ffns()

    def sums(split, add=False):
        run.evaluate(split, 1, stats=True, add_stats=add)
        return [{k: v.clone() for k, v in f.stats.sums.items()} for f in ffns]

    valid, test = sums("valid"), sums("test")
    sums("valid")
    pooled = sums("test", add=True)
    for v, t, p in zip(valid, test, pooled, strict=True):
        assert set(p) == set(v) and all(torch.allclose(p[k], v[k] + t[k]) for k in p)
    res = analyze.analyze(load_trained(runs / "moe", "cpu"), "moe", torch.device("cpu"),
                          ("valid", "test"), max_segments=1)
    per = [res["per_split"][s] for s in ("valid", "test")]
    assert res["split"] == "valid+test" and res["tokens"] == sum(p["tokens"] for p in per) == 128
    bits = sum(p["bpc"] * p["tokens"] for p in per) / res["tokens"]
    assert res["bpc"] == pytest.approx(bits)


def test_figures_draw_the_numbers_they_are_said_to(runs, tmp_path, monkeypatch):
    """The usage panels: each run's sorted shares on a log axis, the panel of the layer
    asked for; the co-occurrence image: the saved distribution, experts from 1."""
    drawn = {}

    def keep(fig, out, stem):
        drawn[stem] = fig
        return []

    monkeypatch.setattr(analyze, "save", keep)
    analyze.main([str(runs / "moe"), "--out", str(tmp_path), "--layer", "2"])
    layers = json.loads((tmp_path / "analysis.json").read_text())["runs"][0]["layers"]
    panels = [ax for ax in drawn["expert_usage"].axes if ax.lines]
    for ax, la in zip(panels, layers, strict=True):
        assert ax.get_yscale() == "log" and ax.get_title() == f"Layer {la['layer']}"
        np.testing.assert_allclose(ax.lines[0].get_ydata(), la["expert_share_sorted"])
    [single] = drawn["expert_usage_layer2"].axes
    np.testing.assert_allclose(single.lines[0].get_ydata(), layers[1]["expert_share_sorted"])
    image = drawn["cooccurrence_layer2"].axes[0].images[0]
    np.testing.assert_allclose(image.get_array(), layers[1]["cooccurrence_distribution"])
    assert image.get_extent() == [0.5, 4.5, 4.5, 0.5]  # 4 experts, numbered 1..4


def copy_run(runs, tmp_path, edit=None, name="copy"):
    """A copy of the MoE run; `edit(cfg)` changes its config.yaml."""
    run_dir = tmp_path / name
    shutil.copytree(runs / "moe", run_dir)
    if edit is not None:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        edit(cfg)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run_dir


def truncated_checkpoint(runs, tmp_path):
    ckpt = sorted(copy_run(runs, tmp_path).glob("checkpoint_*.pt"))[-1]
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    return ckpt


def without_checkpoints(runs, tmp_path):
    run_dir = copy_run(runs, tmp_path)
    for p in run_dir.glob("checkpoint_*"):
        p.unlink()
    return run_dir


def broken_yaml(runs, tmp_path):
    run_dir = copy_run(runs, tmp_path)
    (run_dir / "config.yaml").write_text("task: [1\n")
    return run_dir


def a_file(tmp_path):
    (tmp_path / "file").write_text("")
    return tmp_path / "file"


# case -> (arguments after a good run, given tmp_path's copy of the runs; the error line)
BAD_INPUT = {
    "missing run": lambda runs, tmp: (
        [str(tmp / "nope")], f"{tmp / 'nope'} does not exist: pass a run directory"),
    "missing checkpoint": lambda runs, tmp: (
        [str(runs / "moe" / "checkpoint_99999999.pt")],
        f"{runs / 'moe' / 'checkpoint_99999999.pt'} does not exist"),
    "no config.yaml": lambda runs, tmp: (
        [str(tmp)], f"{tmp} has no config.yaml (not a run directory)"),
    "broken config.yaml": lambda runs, tmp: (
        [str(broken_yaml(runs, tmp))],
        f"{tmp / 'copy' / 'config.yaml'} cannot be read (ParserError: "),
    "config.yaml without task": lambda runs, tmp: (
        [str(copy_run(runs, tmp, lambda c: c.pop("task")))],
        f"{tmp / 'copy' / 'config.yaml'} has no task: not the config.yaml run.py writes"),
    "config.yaml without model.n_layers": lambda runs, tmp: (
        [str(copy_run(runs, tmp, lambda c: c["model"].pop("n_layers")))],
        f"{tmp / 'copy' / 'config.yaml'}: model: "),
    "unknown dataset": lambda runs, tmp: (
        [str(copy_run(runs, tmp, lambda c: c["dataset"].update(kind="nope")))],
        "unknown dataset 'nope'"),
    "device that does not exist": lambda runs, tmp: (
        ["--device", "bogus"], "--device bogus is not a device: use auto, cpu"),
    "device this machine lacks": lambda runs, tmp: (
        ["--device", "cuda:99"], "--device cuda:99 but "),
    "output folder that cannot be made": lambda runs, tmp: (
        ["--out", str(a_file(tmp) / "fig")], f"cannot write to {tmp / 'file' / 'fig'} ("),
    "checksum sidecar as checkpoint": lambda runs, tmp: (
        [str(sorted((runs / "moe").glob("*.pt.sha256"))[-1])], f"{runs / 'moe'}/checkpoint_"),
    "truncated checkpoint": lambda runs, tmp: (
        [str(truncated_checkpoint(runs, tmp))], f"{tmp / 'copy'}/checkpoint_"),
    "run without a checkpoint": lambda runs, tmp: (
        [str(without_checkpoints(runs, tmp))], f"no valid checkpoint in {tmp / 'copy'}; train"),
    "checkpoint of another model": lambda runs, tmp: (
        [str(copy_run(runs, tmp, lambda c: c["ffn"].update(n_experts=8)))],
        f"{tmp / 'copy'}: its weights do not fit the model"),
    "dataset not prepared": lambda runs, tmp: (  # the real loader: it fails at once
        [str(copy_run(runs, tmp, lambda c: c.update(
            dataset={"kind": "enwik8", "cache_dir": str(tmp / "empty_cache")})))],
        f"enwik8: no prepared cache under {tmp / 'empty_cache' / 'enwik8'}"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_before_any_evaluation(case, runs, tmp_path, monkeypatch, capsys):
    """Each bad argument (after a good one) stops with one `error:` line and exit code 1
    before the first evaluation, and writes no analysis."""
    def evaluate(*args, **kwargs):
        raise AssertionError("evaluated before checking every argument")

    monkeypatch.setattr(analyze, "analyze", evaluate)
    argv, error = BAD_INPUT[case](runs, tmp_path)
    with pytest.raises(SystemExit) as e:
        analyze.main(["--out", str(tmp_path / "fig"), str(runs / "dense"), *argv])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {error}") and err.count("\n") == 1, err
    assert not list(tmp_path.glob("**/analysis.json"))


def test_command_line_error_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "scripts/analyze.py", str(tmp_path / "nope")],
                       capture_output=True, text=True, cwd=Path(analyze.__file__).parent.parent)
    assert r.returncode == 1
    assert r.stderr == f"error: {tmp_path / 'nope'} does not exist: pass a run directory or a " \
                       f"checkpoint in one\n"


def test_backend_that_cannot_run_here_analyses_with_auto(runs, tmp_path, monkeypatch, capsys):
    """A run trained with ffn.backend=triton on a GPU, analysed where Triton cannot run:
    backend auto, a note, the numbers of the run's own backend."""
    run_dir = copy_run(runs, tmp_path, lambda c: c["ffn"].update(backend="triton"))
    monkeypatch.setattr(kernels, "backend_problem", lambda backend, *args: f"no {backend} here")
    analyze.main([str(run_dir), "--out", str(tmp_path / "fig")])
    assert capsys.readouterr().err == ("note: ffn.backend=triton cannot run on cpu (no triton "
                                       "here): evaluating with ffn.backend=auto (the same "
                                       "numbers up to float rounding)\n")
    [res] = json.loads((tmp_path / "fig" / "analysis.json").read_text())["runs"]
    ref = json.loads((runs / "moe" / "results.json").read_text())
    assert res["bpc"] == pytest.approx(ref["valid"]["bpc"], abs=1e-6)


def test_runs_of_one_experiment_are_labelled_by_their_overrides(tmp_path):
    """Two seeds or two settings of one experiment were `glu#0`, `glu#1`: which was which?"""
    for sub in ("glu/ffn.k=2,trainer.seed=0", "glu/ffn.k=4,trainer.seed=0", "elsewhere/glu",
                "elsewhere/glu-2"):
        (tmp_path / sub).mkdir(parents=True)
    dirs = [tmp_path / sub for sub in ("glu/ffn.k=2,trainer.seed=0",
                                        "glu/ffn.k=4,trainer.seed=0", "elsewhere/glu",
                                        "elsewhere/glu-2", "dense")]
    assert analyze.distinct_labels(["glu"] * 4 + ["dense"], dirs) == [
        "glu [ffn.k=2,trainer.seed=0]", "glu [ffn.k=4,trainer.seed=0]", "glu#2", "glu#3",
        "dense"]
    # only what differs: the seeds of one long command (its directories' names cut to a
    # hash, the overrides recorded uncut)
    from sigma_moe.framework.cli import OVERRIDES, dirname

    long = ",".join(f"model.k{i}=1" for i in range(15))
    dirs = []
    for seed in (0, 1):
        over = f"{long},trainer.seed={seed}"
        (tmp_path / "moe" / dirname(over)).mkdir(parents=True)
        (tmp_path / "moe" / dirname(over) / OVERRIDES).write_text(f"dirname: {over}\n")
        dirs.append(tmp_path / "moe" / dirname(over))
    assert analyze.distinct_labels(["moe", "moe"], dirs) == [
        "moe [trainer.seed=0]", "moe [trainer.seed=1]"]


def test_runs_are_labelled_before_the_first_evaluation(runs, tmp_path, monkeypatch):
    """The labels read each run's overrides.yaml: labelled after every evaluation, a record
    that is not UTF-8 lost hours of evaluation to a traceback. Checked (and told apart) first:
    the evaluation gets the final label."""
    from sigma_moe.framework.cli import OVERRIDES

    seeds = [copy_run(runs, tmp_path, name=f"tiny_moe/trainer.seed={s}") for s in (1, 2)]
    (seeds[1] / OVERRIDES).write_bytes(b'dirname: "\xff"\n')
    evaluated, evaluate = [], analyze.analyze

    def record(run, label, *args, **kwargs):
        evaluated.append(label)
        return evaluate(run, label, *args, **kwargs)

    monkeypatch.setattr(analyze, "analyze", record)
    analyze.main([*map(str, seeds), "--max-segments", "1", "--out", str(tmp_path / "fig")])
    assert evaluated == ["tiny_moe [trainer.seed=1]", "tiny_moe [trainer.seed=2]"]
    saved = json.loads((tmp_path / "fig" / "analysis.json").read_text())["runs"]
    assert [r["label"] for r in saved] == evaluated


def test_expert_figures_need_a_moe_run(runs, tmp_path, monkeypatch, capsys):
    """--layer asks for the expert usage and co-occurrence figures: a dense run alone has
    none (it wrote only active_channels, exit 0), so it stops before any evaluation; beside
    a MoE run it is left out of them, with a note."""
    def evaluate(*args, **kwargs):
        raise AssertionError("evaluated a run that cannot give the figures asked for")

    with monkeypatch.context() as m:
        m.setattr(analyze, "analyze", evaluate)
        with pytest.raises(SystemExit) as e:
            analyze.main([str(runs / "dense"), "--layer", "2", "--out", str(tmp_path / "d")])
    assert e.value.code == 1
    # every MoE variant registered (a user's own may be one: docs/extending.md's GLU is)
    from sigma_moe.models.ffn import FFNS
    moes = [k for k in FFNS.names() if analyze.has_experts(k)]
    assert {"sbase", "sigma_moe", "switch"} <= set(moes) and "dense" not in moes
    assert capsys.readouterr().err == (
        f"error: --layer 2: the expert usage and co-occurrence figures need a MoE run (ffn "
        f"{', '.join(moes)}), and no run given is one (ffn dense); without --layer: "
        "the active channels of Fig. 1\n")
    assert not (tmp_path / "d" / "analysis.json").exists()
    paths = analyze.main([str(runs / "dense"), str(runs / "moe"), "--layer", "2",
                          "--out", str(tmp_path / "both")])
    assert capsys.readouterr().err == (
        f"note: {runs / 'dense'} (ffn dense) has no experts: left out of the expert usage and "
        f"co-occurrence figures\n")
    assert files(paths) == sorted(
        ["analysis.json"] + [f"{stem}.{ext}" for ext in ("png", "pdf") for stem in
                             ("active_channels", "expert_usage", "expert_usage_layer2",
                              "cooccurrence_layer2_tiny_moe")])


def test_k1_run_has_no_cooccurrence_figure(runs, tmp_path, capsys):
    """A Switch run with K=1 chooses no expert with another: its co-occurrence image was all
    zeros. A note instead; the usage figure stays."""
    def to_switch(cfg):  # the same expert weights, routed by Switch's top-1
        for key in ("selection", "expert_dropout", "reg_gamma"):
            cfg["ffn"].pop(key)
        cfg["ffn"].update(kind="switch", k=1)

    run_dir = copy_run(runs, tmp_path, to_switch)
    paths = analyze.main([str(run_dir), "--out", str(tmp_path / "fig")])
    assert files(paths) == ["analysis.json", "expert_usage.pdf", "expert_usage.png"]
    assert capsys.readouterr().err == ("note: tiny_moe: K=1: no experts are used together; "
                                       "no co-occurrence figure\n")
    [res] = json.loads((tmp_path / "fig" / "analysis.json").read_text())["runs"]
    assert res["ffn"] == "switch"
    for la in res["layers"]:  # what the figure would have drawn
        assert not np.any(la["cooccurrence_distribution"])


def test_reused_output_folder_keeps_no_stale_figures(runs, tmp_path):
    """A second analysis into the same folder (here --layer 2 after every layer) removes the
    figures of the first that it does not redraw, which would pass for its own; any other
    file stays."""
    out = tmp_path / "fig"
    analyze.main([str(runs / "moe"), "--out", str(out)])
    assert (out / "cooccurrence_layer1.pdf").exists()
    others = ["notes.txt", "cooccurrence_layer1.svg", "expert_usage_by_hand.png",
              "active_channels.png.bak", "my_cooccurrence_layer1.png"]
    for name in others:
        (out / name).write_text("mine")
    paths = analyze.main([str(runs / "moe"), "--out", str(out), "--layer", "2"])
    assert sorted(p.name for p in out.iterdir()) == sorted(files(paths) + others)
    assert "cooccurrence_layer1.png" not in files(paths)
    assert all((out / name).read_text() == "mine" for name in others)
