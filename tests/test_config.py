"""Configs and the command line: strict validation, clear one-line errors (issue 2, 8)."""
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sigma_moe.framework.config import ConfigError, from_dict
from sigma_moe.framework.registry import Registry, RegistryError
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig
from sigma_moe.tasks.lm import build_model_config
from tests.helpers import TINY, TINY_MOE, compose_cfg

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=ROOT, timeout=120, **env_vars):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_vars}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_registry_refuses_duplicates_and_suggests():
    reg: Registry = Registry("thing")
    reg.register("sigma_moe")(object)
    with pytest.raises(RegistryError, match="twice"):
        reg.register("sigma_moe")(object)
    with pytest.raises(RegistryError, match="Did you mean 'sigma_moe'"):
        reg.get("sigma_mo")
    # a new variant's yaml alone registers nothing: the message says what does (a name no
    # variant will have: users add docs/extending.md's sigma_moe_glu, and others)
    with pytest.raises(RegistryError) as e:
        FFNS.get("sigma_moe_mine")
    hint, rest = str(e.value).split("? Known: ")
    assert re.fullmatch(r"unknown ffn variant 'sigma_moe_mine'\. Did you mean 'sigma_moe'"
                        r"(, '\w+'){0,2}", hint)  # (or a user's sigma_moe_glu)
    assert rest == (
        f"{', '.join(FFNS.names())}. A new one: decorate its class with "
        "@FFNS.register('sigma_moe_mine') and import its module in "
        "sigma_moe/models/ffn/__init__.py; a typo: correct the `kind:` of its yaml in "
        "configs/ffn/.")
    assert {"dense", "sigma_moe", "switch"} <= set(FFNS.names())


def test_a_path_in_an_override_stays_one_directory_level(tmp_path):
    """`dataset.source=/data/wt103` made runs/<name>/dataset.source=/data/wt103: nested
    directories that the tables took for ones chosen by hand."""
    from scripts.run_results import run_overrides
    from sigma_moe.framework.cli import dirname, undirname

    over = "dataset.source=/data/wt 103/,trainer.lr=5%2F"
    name = dirname(over)
    assert name == "dataset.source=%2Fdata%2Fwt 103%2F,trainer.lr=5%252F"
    assert undirname(name) == over
    (tmp_path / "x" / name).mkdir(parents=True)
    assert run_overrides(tmp_path / "x" / name, "x") == over
    long = dirname("dataset.source=" + "/abc" * 100)
    assert "/" not in long and len(long) == 120
    # what Windows refuses in a file name, and its path separator
    windows = 'dataset.source=C:\\data\\e8.zip,x="<a|b>?*",y=%3A'
    name = dirname(windows)
    assert name == "dataset.source=C%3A%5Cdata%5Ce8.zip,x=%22%3Ca%7Cb%3E%3F%2A%22,y=%253A"
    assert undirname(name) == windows


def test_registry_lists_what_exists_for_an_unknown_name():
    reg: Registry = Registry("thing")
    for name in ("sigma_moe", "dense"):
        reg.register(name)(object)
    with pytest.raises(RegistryError) as e:
        reg.get("pkm")
    assert str(e.value) == "unknown thing 'pkm'. Known: dense, sigma_moe."


def test_from_dict_is_strict():
    base = dict(d_model=8, n_layers=2, n_experts=4, expert_size=4, k=2)
    with pytest.raises(ConfigError, match=r"unknown config key 'ffn.n_expert' .*'n_experts'"):
        from_dict(SigmaMoEConfig, {**base, "n_expert": 3}, "ffn")
    with pytest.raises(ConfigError, match="ffn.k: expected int"):
        from_dict(SigmaMoEConfig, {**base, "k": "four"}, "ffn")
    with pytest.raises(ConfigError, match="not one of"):
        from_dict(SigmaMoEConfig, {**base, "selection": "relu"}, "ffn")
    with pytest.raises(ConfigError, match="ffn.backend='trion' is not one of auto, triton"):
        from_dict(SigmaMoEConfig, {**base, "backend": "trion"}, "ffn")
    assert from_dict(SigmaMoEConfig, {**base, "reg_gamma": 0}, "ffn").reg_gamma == 0.0


def test_k_larger_than_n_experts_is_refused():
    cfg = compose_cfg(["ffn.k=20"])
    with pytest.raises(ConfigError, match="ffn.k=20 must be between 1 and ffn.n_experts=16"):
        build_model_config(cfg, 201)


@pytest.mark.parametrize("exp,override", [
    ("mini_moe", "model.dropout=1.0"), ("mini_moe", "ffn.hidden_dropout=1"),
    ("mini_moe", "ffn.expert_dropout=-0.1"), ("mini_dense", "ffn.dropout=1.5"),
    ("mini_enwik_sbase", "ffn.expert_dropout=1")])
def test_dropout_outside_0_1_is_refused(exp, override):
    """p = 1 divided by zero in the torch path's hidden dropout (or gave NaN)."""
    cfg = compose_cfg([override], exp)
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"^{key}={float(value)} must be in \[0, 1\)"):
        build_model_config(cfg, 201)


@pytest.mark.parametrize("override,error", [
    ("model.d_model=0", "model.d_model must be >= 1, got 0"),
    ("model.n_heads=-1", "model.n_heads must be >= 1, got -1"),
    ("trainer.lr=-1", "trainer.lr must be >= 0, got -1.0"),
    ("trainer.eps=0", "trainer.eps must be > 0, got 0.0"),
    ("trainer.warmup_steps=-5", "trainer.warmup_steps must be >= 0, got -5"),
    ("trainer.grad_clip=-1", "trainer.grad_clip must be >= 0, got -1.0"),
    ("trainer.betas=[0.9,1.0]", "trainer.betas must be two numbers in [0, 1), got [0.9, 1.0]"),
    ("trainer.preempt_signals=[SIGUSR1,SIGFOO]", "trainer.preempt_signals: no signal SIGFOO "
                                                 "here (known: e.g. SIGUSR1, SIGUSR2, SIGTERM)"),
    ("task.eval_mem_segments=-1", "task.eval_mem_segments must be >= 0, got -1"),
    ("task.final_segments=-1", "task.final_segments must be >= 0, got -1"),
])
def test_values_that_would_fail_later_are_refused_first(override, error):
    """What the model or the optimizer would refuse with a traceback (a negative dimension,
    AdamW's 'Invalid learning rate'), or use silently (a negative warmup)."""
    from sigma_moe.framework.trainer_config import TrainerConfig

    cfg = compose_cfg([override])
    with pytest.raises(ConfigError) as e:
        build_model_config(cfg, 201)
        from_dict(TrainerConfig, cfg["trainer"], "trainer")
    assert str(e.value) == error


def test_every_default_group_composes_and_validates():
    for exp in ("mini_moe", "mini_dense"):
        model_cfg = build_model_config(compose_cfg([], exp), 201)
        assert model_cfg.mem_len == 128 and model_cfg.eval_mem_len == 4 * 128


def test_memory_lengths_follow_the_task_segments():
    """Not only at the defaults (1 and 4 segments): the model's memory follows both."""
    cfg = compose_cfg([*TINY, *TINY_MOE, "task.train_mem_segments=2",
                       "task.eval_mem_segments=3"])
    model_cfg = build_model_config(cfg, 50)
    context = cfg["task"]["context"]
    assert (model_cfg.mem_len, model_cfg.eval_mem_len) == (2 * context, 3 * context)


def test_cli_errors_are_one_line(tmp_path):
    out = run_cli("+exp=mini_moee", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        out.stderr.strip()], out.stderr  # exactly one line
    assert "unknown experiment 'mini_moee'" in out.stderr and "mini_moe" in out.stderr

    out = run_cli("+ffn.n_expert=3", f"hydra.run.dir={tmp_path}/r1", cwd=tmp_path)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "unknown config key 'ffn.n_expert'" in out.stderr
    assert not (tmp_path / "r1").exists()  # no run directory that looks like a run

    out = run_cli("ffn.n_expert=3", f"hydra.run.dir={tmp_path}/r3", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: unknown config key 'ffn.n_expert' (did you mean 'ffn.n_experts'?)")
    assert not (tmp_path / "r3").exists()

    out = run_cli("ffn.k=17", f"hydra.run.dir={tmp_path}/r2", cwd=tmp_path)
    assert out.returncode == 1 and "ffn.k=17 must be between 1 and ffn.n_experts=16" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "r2").exists()

    out = run_cli("exp=mini_moe", "mode=params", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: write +exp=NAME, with a '+' (the config has no default exp to override)")

    # a sweep: its plain overrides are checked against each of its experiments
    out = run_cli("-m", "+exp=mini_moe,mini_dense", "ffn.k=2", "trainer.seed=range(2)",
                  "mode=params", f"hydra.sweep.dir={tmp_path}/s1", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: unknown config key 'ffn.k' (ffn=dense has no such key) (in the sweep's jobs "
        "of +exp=mini_dense)")
    assert not (tmp_path / "s1").exists()

    # several values without -m: Hydra's answer says what to do in its later lines
    out = run_cli("trainer.seed=0,1", "mode=params", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: Ambiguous value for argument 'trainer.seed=0,1': to run each of the values, "
        "add -m (a sweep); to set a list, write key=[a,b]")

    # a backend this machine cannot run (no CUDA; or, under TRITON_INTERPRET, no dropout in
    # the fused kernels) stops before the run starts, not in the first forward
    out = run_cli("ffn.backend=triton", "ffn.hidden_dropout=0.1", f"hydra.run.dir={tmp_path}/r4",
                  cwd=tmp_path)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "error: ffn.backend=triton cannot run the training on cpu (torch.float32): " in \
        out.stderr
    assert "ffn.backend=auto picks one that can" in out.stderr and not (tmp_path / "r4").exists()


def test_a_failed_start_leaves_no_directories(tmp_path):
    """Missing data: one line, and neither the run dir nor the runs/NAME/ above it stays."""
    out = run_cli("+exp=e8_moe", "trainer.steps=3", cwd=tmp_path,
                  SIGMA_MOE_CACHE=str(tmp_path / "cache"))
    assert out.returncode == 1 and "prepare_data.py enwik8" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()
    # a bad model value is said before the data is missed (or loaded: minutes for C4)
    out = run_cli("+exp=e8_moe", "ffn.n_experts=2", cwd=tmp_path,
                  SIGMA_MOE_CACHE=str(tmp_path / "cache"))
    assert out.returncode == 1 and out.stderr.startswith("error: ffn.k=4 must be between 1 "
                                                         "and ffn.n_experts=2"), out.stderr
    # a train split shorter than one segment per stream (it trained on wrapped scraps)
    out = run_cli("+exp=mini_enwik_dense", "dataset.fractions=[0.00005,0.5,0.49995]",
                  cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip().startswith(
        "error: dataset 'enwik_mini': its train split has 304 tokens, fewer than "
        "task.batch_size=16 streams"), out.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_params_mode_prints_count(tmp_path):
    out = run_cli("mode=params", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "mini_moe: 3.53M parameters" in out.stdout


def test_keys_outside_the_run_identity_are_outside_the_run_directory_name():
    """A key that does not change the config hash must not change the directory either, or
    rerunning with it would start over elsewhere instead of resuming."""
    from omegaconf import OmegaConf

    from sigma_moe.framework.experiment import VOLATILE, VOLATILE_TRAINER

    cfg = OmegaConf.load(ROOT / "configs" / "config.yaml")
    excluded = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    assert {f"trainer.{k}" for k in VOLATILE_TRAINER} <= excluded
    assert {"logger", "mode", "fresh", "sweep_name"} <= excluded & set(VOLATILE)


def test_override_check_two_bad_keys_and_options_left_to_hydra(capsys):
    from sigma_moe.framework.cli import prepare_argv

    with pytest.raises(SystemExit):  # one line, no traceback, for two mistyped keys
        prepare_argv(["run.py", "ffn.n_expert=3", "ffn.kk=2"])
    assert capsys.readouterr().err.strip() == "error: unknown config key 'ffn.n_expert'"
    for extra in (["--config-name", "config"], ["-sc", "install=bash"],
                  ["hydra.searchpath=[file:///elsewhere]"]):
        prepare_argv(["run.py", *extra, "mode=params"])  # where configs come from: Hydra's


def test_an_eval_sweep_of_evaluation_settings_is_refused(capsys):
    """Each value would evaluate the one run trained without them, into its one
    eval_results.json (at once, under the local or Slurm launcher)."""
    from sigma_moe.framework.cli import prepare_argv

    with pytest.raises(SystemExit):
        prepare_argv(["run.py", "-m", "+sweep=mini", "+exp=mini_enwik_moe", "mode=eval",
                      "task.final_segments=0,2"])
    assert capsys.readouterr().err == (
        "error: mode=eval sweeps task.final_segments: every value would evaluate the same "
        "trained run into its one eval_results.json; run one value per command\n")
    prepare_argv(["run.py", "-m", "+sweep=mini", "+exp=mini_enwik_moe", "mode=eval",
                  "trainer.seed=0,1", "task.final_segments=0"])  # seeds: runs of their own


def test_a_key_given_twice_counts_once(capsys):
    """Hydra takes the last; left in argv, both would name the run directory (sorted), so
    `steps=30 steps=2` and `steps=2 steps=30` would share one with different configs. The
    tests themselves add to a base list of overrides this way."""
    from sigma_moe.framework.cli import prepare_argv

    argv = ["run.py", "+exp=mini_moe", "trainer.steps=30", "-m", "trainer.steps=2,3",
            "+trainer.x=1", "trainer.x=2", "mode=params", "mode=params"]
    prepare_argv(argv)
    assert argv == ["run.py", "+exp=mini_moe", "-m", "trainer.steps=2,3", "+trainer.x=1",
                    "trainer.x=2", "mode=params"]
    with pytest.raises(SystemExit):  # additions: Hydra's to refuse, not ours to pick one
        prepare_argv(["run.py", "+exp=mini_moe", "+exp=mini_dense", "mode=params"])
    assert capsys.readouterr().err.startswith("error: Multiple values for exp.")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("folder,text,error", [
    ("exp", b"# @package _global_\nname: x\nffn:\n k: 2\n  n_experts: 3\n",
     "exp/x.yaml:5:12: not valid YAML: mapping values are not allowed here"),
    ("exp", b"name: x\nffn:\n  k: [1,\n", "exp/x.yaml:4:1: not valid YAML: while parsing "
     "a flow node: expected the node content, but found '<stream end>'"),
    ("exp", b"name: caf\xe9\n",
     "exp/x.yaml is not UTF-8 text (byte 9: b'\\xe9'): save it as UTF-8"),
    # a group's file, found by Hydra's composition (the decoder names no file: it is found)
    ("model", b"d_model: 3\n  x: [\n", "model/x.yaml:2:4: not valid YAML: mapping values"),
    ("model", b"d_model: \xff3\n", "model/x.yaml is not UTF-8 text (byte 9: b'\\xff')"),
])
def test_a_config_file_that_is_not_yaml_is_one_line(tmp_path, monkeypatch, capsys, folder,
                                                    text, error):
    """A researcher's new experiment file with a YAML slip: file:line:column, not the
    parser's traceback (with --cfg too, which skips the override check)."""
    import shutil

    from sigma_moe.framework import cli

    configs = tmp_path / "configs"
    shutil.copytree(cli.CONFIGS, configs)
    (configs / folder / "x.yaml").write_bytes(text)
    monkeypatch.setattr(cli, "CONFIGS", configs)
    argvs = ([["run.py", "+exp=x", "mode=params"], ["run.py", "+exp=x", "--cfg", "job"]]
             if folder == "exp" else [["run.py", "model=x", "mode=params"]])
    for argv in argvs:
        with pytest.raises(SystemExit) as e:
            cli.prepare_argv(argv)
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.startswith(f"error: {configs}/{error}")
        assert err.count("\n") == 1, err


@pytest.mark.parametrize("text,error", [
    ("name: x\nffn:\n  k: 2\n", "x.yaml must start with the line '# @package _global_'"),
    ("# the x run\n# @package _global_\nname: x\n", "x.yaml must start with the line"),
    ("# @package _global_\nname: mini_moe\n",  # a copy that kept its original's name
     "x.yaml sets name: mini_moe; an experiment's name is its file's (its runs go to "
     "runs/<name>/): write name: x"),
    ("# @package _global_\nffn:\n  k: 2\n", "x.yaml sets name: None;"),
    ("# @package _global_\nname: x\ntrainr:\n  steps: 2\n",
     "x.yaml: unknown top-level key 'trainr' (did you mean 'trainer'?)"),
    # keys of a variant without choosing it: they went onto the default ffn (sigma_moe)
    ("# @package _global_\ndefaults:\n  - override /model: mini\nname: x\nffn:\n  k: 2\n",
     "x.yaml sets ffn.* keys but does not choose its ffn: add '- override /ffn: <kind>' to "
     "its defaults (else its keys go onto the default ffn of configs/config.yaml)"),
    ("# @package _global_\nname: x\ndataset:\n  fractions: [0.8, 0.1, 0.1]\n",
     "x.yaml sets dataset.* keys but does not choose its dataset"),
])
def test_a_new_experiment_file_gets_header_and_name_checked(tmp_path, monkeypatch, capsys,
                                                            text, error):
    """Without the header Hydra puts the file's keys under `exp:` (ignored: the run uses the
    defaults); with another experiment's name it runs in that one's runs/<name>/."""
    from sigma_moe.framework import cli

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "x.yaml").write_text(text)
    monkeypatch.setattr(cli, "CONFIGS", tmp_path)
    with pytest.raises(ConfigError) as e:
        cli.check_experiment("x")
    assert str(e.value).startswith(f"{tmp_path}/exp/{error}")
    (tmp_path / "exp" / "x.yaml").write_text("\n# @package _global_\n# the x run\nname: x\n")
    cli.check_experiment("x")
    # in a sweep's list too (make_sweeps puts a new experiment there), unless +exp= replaces it
    (tmp_path / "exp" / "x.yaml").write_text(text)
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "s.yaml").write_text("hydra:\n  sweeper:\n    params:\n"
                                               "      +exp: x\n")
    with pytest.raises(SystemExit):
        cli.prepare_argv(["run.py", "-m", "+sweep=s", "hydra/launcher=basic", "mode=params"])
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}/exp/{error}")


def test_an_unknown_top_level_key_is_one_line(tmp_path):
    """Hydra lets a config file (or a `+key=`) add any key: a misspelt group is refused, not
    ignored, and the run leaves no directory."""
    from sigma_moe.framework.config import check_top_level

    out = run_cli("+trainr.steps=2", f"hydra.run.dir={tmp_path}/r", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: unknown config key 'trainr' at the top level (did you mean 'trainer'?)")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="experiment 'x' ended up under 'exp': an "
                       "experiment file must start with the line '# @package _global_'"):
        check_top_level({"name": "run", "exp": {"name": "x", "ffn": {"k": 2}}})
    check_top_level(compose_cfg([], "wt103_small_moe"))  # `paper:` is an experiment's


def test_a_backend_that_cannot_run_the_evaluation_stops_before_training(monkeypatch):
    """Evaluation runs in float32 (no autocast): grouped_mm on CUDA (bf16 only) trained,
    then failed at its first validation. Driven here with grouped_mm's CUDA rule."""
    import torch

    from sigma_moe import kernels
    from sigma_moe.tasks.lm_run import check_backend

    def cuda_rule(backend, x_TD, w1_EDG, dropout=False):
        return None if x_TD.dtype == torch.bfloat16 else f"dtype {x_TD.dtype} on CUDA"

    monkeypatch.setattr(kernels, "backend_problem", cuda_rule)
    ffn = SigmaMoEConfig(d_model=16, n_layers=1, n_experts=4, expert_size=8, k=2,
                         backend="grouped_mm")
    cfg = types.SimpleNamespace(ffn=ffn)  # check_backend reads the FFN's config only
    with pytest.raises(ConfigError, match=r"^ffn.backend=grouped_mm cannot run the evaluation "
                                          r"on cpu \(torch.float32\): dtype torch.float32 on"):
        check_backend(cfg, torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ConfigError, match="cannot run the training"):
        check_backend(cfg, torch.device("cpu"), torch.float32)


def test_help_says_what_runs_without_an_experiment():
    """--help showed Hydra's banner and the base config (100k steps, batch 64), not what a
    plain `python run.py` trains."""
    out = run_cli("--help")
    assert out.returncode == 0 and "Hydra" not in out.stdout.splitlines()[0]
    assert "Without +exp the main job runs: +exp=mini_moe" in out.stdout
    exps = next(line for line in out.stdout.splitlines() if line.startswith("exp: "))
    assert "wt103_small_moe" in exps.split(", ") and "--cfg job" in out.stdout


def test_a_long_run_directory_name_is_cut_and_hashed():
    """File names have a 255-byte limit; two long override lists that differ only past the
    cut must still get two directories (each run resumes its own)."""
    from sigma_moe.framework.cli import dirname

    assert dirname("x" * 120) == "x" * 120  # up to the limit: the overrides themselves
    a, b = "a" * 150 + ",seed=1", "a" * 150 + ",seed=2"
    assert len(dirname(a)) == 120 and dirname(a).startswith("a" * 107 + "..")
    assert dirname(a) != dirname(b)


def test_a_sweep_is_a_sweep_with_or_without_m(monkeypatch, capsys):
    """`+sweep=` alone implies -m; `--multirun` is -m; a sweep's own experiments are checked
    and replaced by no default experiment; its plain overrides are checked against them."""
    from sigma_moe.framework import cli

    argv = ["run.py", "+sweep=moe", "--cfg", "hydra"]  # shows the sweep's config
    cli.prepare_argv(argv)
    assert argv == ["run.py", "+sweep=moe", "--cfg", "hydra"]  # no +exp=mini_moe added
    argv = ["run.py", "+sweep=dense", "+exp=e8_dense,e8_moe", "hydra/launcher=basic",
            "trainer.seed=0"]
    cli.prepare_argv(argv)
    assert argv[1] == "--multirun"
    cli.prepare_argv(["run.py", "--multirun", "+exp=mini_moe,mini_dense", "mode=params"])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)  # no srun here
    with pytest.raises(SystemExit) as e:  # the sweep's launcher is Slurm's, even without -m
        cli.prepare_argv(["run.py", "+sweep=dense", "+exp=e8_dense", "trainer.seed=0"])
    assert e.value.code == 1 and "srun is not on this machine" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a typo, checked against the sweep file's experiments
        cli.prepare_argv(["run.py", "-m", "+sweep=moe", "hydra/launcher=basic",
                          "ffn.n_expert=3"])
    err = capsys.readouterr().err
    assert err.startswith("error: unknown config key 'ffn.n_expert'") and err.count("\n") == 1
    assert err.endswith(f"(in the sweep's jobs of +exp={cli.sweep_experiments('moe')[0]})\n")


def test_an_unknown_option_or_a_group_without_plus_is_one_line():
    from sigma_moe.framework.cli import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides(["+exp=mini_moe", "ffn=sigma"])
    assert "(available: " in str(e.value) and "sigma_moe" in str(e.value)
    with pytest.raises(ConfigError, match=r"^write \+sweep=NAME, with a '\+'"):
        check_overrides(["sweep=moe", "+exp=mini_moe"])


def test_from_dict_refuses_booleans_for_numbers_and_missing_keys():
    """YAML's `true` is no number (bool is an int in Python); a missing required key is a
    ConfigError naming the component, not a TypeError traceback."""
    base = dict(d_model=8, n_layers=2, n_experts=4, expert_size=4, k=2)
    with pytest.raises(ConfigError, match="^ffn.k: expected int, got True$"):
        from_dict(SigmaMoEConfig, {**base, "k": True}, "ffn")
    with pytest.raises(ConfigError, match="^ffn.reg_gamma: "):
        from_dict(SigmaMoEConfig, {**base, "reg_gamma": True}, "ffn")
    with pytest.raises(ConfigError) as e:
        from_dict(SigmaMoEConfig, {k: v for k, v in base.items() if k not in ("k", "d_model")},
                  "ffn")
    assert str(e.value) == ("ffn: SigmaMoEConfig needs ffn.d_model, ffn.k: set them in the "
                            "yaml that configures it or on the command line")


def test_an_experiment_named_by_its_dataset_gets_suggestions():
    """`+exp=wt103` (a setting, not a run): the closest experiments, not just the listing."""
    from sigma_moe.framework.cli import check_experiment

    with pytest.raises(ConfigError, match=r"^unknown experiment 'wt103'. Did you mean wt103_"):
        check_experiment("wt103")
