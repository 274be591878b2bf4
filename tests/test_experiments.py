"""Every run of the paper is an experiment (issue 6): each configs/exp/*.yaml composes,
validates, builds (on the meta device: nothing allocated), has the paper's parameter count
and relative FFN FLOPs (Tab. flops_detailed), follows the naming scheme of
configs/exp/README.md, and together they cover every cell of the paper's result tables.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest
from omegaconf import OmegaConf

from sigma_moe.framework.cli import check_experiment
from sigma_moe.framework.config import check_top_level
from sigma_moe.framework.data.base import train_tokens_for
from sigma_moe.models.ffn.dense import DenseConfig
from sigma_moe.models.ffn.experts import ExpertsConfig
from sigma_moe.models.ffn.pkm import PKMConfig
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig
from sigma_moe.models.ffn.topk import TopKConfig
from sigma_moe.models.flops import dense_counterpart, ffn_flops, relative_ffn_flops
from tests.helpers import EXP_DIR, EXPS, compose_cfg, load, tables_of

# a run of the paper claims a cell of one of its tables; the others are the laptop's (the
# `mini` table) or a user's own (no `paper:` block), held to every check but the paper's
PAPER_EXPS = [e for e in EXPS if tables_of(e) - {"mini"}]

# name prefix -> dataset kind, d_model, n_layers, column label in the paper's tables
# setting -> dataset, d_model, layers, column; then heads x head size and dropout
# (docs/REFERENCE.md's table of paper rows: the parameter count sees only their product)
SETTINGS = {
    "wt103_small": ("wt103", 412, 16, "WT-S"),
    "wt103_star": ("wt103", 412, 16, "WT-S*"),
    "wt103_big": ("wt103", 1024, 18, "WT-B"),
    "e8": ("enwik8", 512, 12, "E8"),
    "c4_small": ("c4", 412, 16, "C4-S"),
    "c4_big": ("c4", 1024, 18, "C4-B"),
    "pes2o_small": ("pes2o", 412, 16, "peS2o-S"),
    "pes2o_big": ("pes2o", 1024, 18, "peS2o-B"),
}
HEADS_DROPOUT = {412: (10, 41, 0.1), 1024: (16, 64, 0.2), 512: (8, 64, 0.1)}  # by d_model

NAME_RE = re.compile(
    r"^(?P<setting>wt103_(?:small|star|big)|c4_(?:small|big)|pes2o_(?:small|big)|e8)_"
    r"(?P<variant>dense|moe|topk\d+|pkm_(?:relu|softmax)_(?:valuecount|matched)(?:_init)?"
    r"|switch|sbase)"
    r"(?P<ablation>(?:_standard_dropout|_softmax_renorm|_softmax|_standard_init|_no_reg"
    r"|_k\d+_g\d+)?(?:_nodrop)?)$"
)
ABLATIONS_OF = {  # which ablation suffixes each variant may carry
    "moe": re.compile(r"^(_standard_dropout|_softmax_renorm|_softmax|_standard_init|_no_reg"
                      r"|_k\d+_g\d+)?$"),
    "switch": re.compile(r"^(_k\d+_g\d+)?(_nodrop)?$"),
    "sbase": re.compile(r"^(_k\d+_g\d+)?$"),
}

# table id -> the column labels it has (configs/exp/README.md)
TABLES = {
    "dense": {"WT-S", "WT-S*", "WT-B", "E8"},
    "moe": {"WT-S", "WT-B", "E8", "C4-S", "C4-B", "peS2o-S", "peS2o-B"},
    "ablation": {"WT-S", "WT-S*", "WT-B", "E8"},
    "pkm": {"WT-S", "WT-B", "E8"},
    "topk": {"WT-S", "WT-B", "E8"},
    "c4_pes2o": {"C4-S", "C4-B", "peS2o-S", "peS2o-B"},
    "mini": {"enwik_mini", "wikitext_mini"},
}
# number of cells with a number in each paper table (Tab. dense_hyper: 4 runs; moe: 7 x 2;
# ablation_detailed: 9 + 2 + 2 rows x 4 and 4 + 3 rows x 3 (no WT-B); pkm_details: 6 x 3;
# topk: 4 + 5 + 4; new_results: 4 x 4)
CELLS = {"dense": 4, "moe": 14, "ablation": 73, "pkm": 18, "topk": 13, "c4_pes2o": 16}

# docs/REFERENCE.md's finer parameter counts behind the paper's rounded ones (millions)
FINE_PARAMS_M = {47: 47.3, 41: 41.2, 262: 262.5, 237: 237.5, 238: 237.5}

# MoE-specific hyperparameters of the main rows (docs/REFERENCE.md "Hyperparameters per paper row"):
# N_E, G, K, delta, gamma. WT-B's delta is the authors' 0.1 (Tab. moe_hyper: 0.2).
MOE_HYPER = {
    "wt103_small": (16, 128, 4, 0.0, 1e-3), "wt103_star": (128, 128, 4, 0.05, 1e-3),
    "wt103_big": (32, 128, 4, 0.1, 1e-3), "e8": (16, 128, 4, 0.05, 1e-4),
    "c4_small": (16, 128, 4, 0.0, 0.0), "pes2o_small": (16, 128, 4, 0.0, 0.0),
    "c4_big": (32, 128, 4, 0.1, 1e-3), "pes2o_big": (32, 128, 4, 0.1, 1e-3),
}
# S-BASE on small C4/peS2o: the authors' gamma (their c4_sbase / pes2o_sbase sweeps); the
# row's 0 is their sigma-MoE sweep's and would switch S-BASE's regularizer off
SBASE_GAMMA = {"c4_small": 1e-4, "pes2o_small": 1e-4}
DENSE_D_FF = {"wt103_small": 2053, "wt103_star": 16480, "wt103_big": 4110, "e8": 2053,
              "c4_small": 2053, "pes2o_small": 2053, "c4_big": 4110, "pes2o_big": 4110}
PKM_SUBKEYS = {("valuecount", 412): 46, ("valuecount", 512): 46, ("valuecount", 1024): 64,
               ("matched", 412): 62, ("matched", 512): 62, ("matched", 1024): 89}

# Tab. flops_detailed, transcribed: ablation row -> % FLOPs for WT-S, WT-S*, WT-B, E8
# (the paper's "S-BASE" row is our "S-BASE, K=4, G=128", as in Tab. ablation_detailed)
_Q = (25.0, 3.1, 12.5, 25.0)
FLOPS_TABLE = {
    "σ-MoE (ours)": _Q,
    "σ-MoE (ours), standard dropout": _Q,
    "σ-MoE (ours), softmax (after top-k)": _Q,
    "σ-MoE (ours), softmax (before top-k)": _Q,
    "σ-MoE (ours), standard init": _Q,
    "σ-MoE (ours), no reg (γ=0,δ=0)": _Q,
    "σ-MoE (ours), K=8, G=64": _Q,
    "σ-MoE (ours), K=2, G=256": _Q,
    "σ-MoE (ours), K=1, G=512": _Q,
    "σ-MoE (ours), N_E' = 2N_E, G=64": (12.5, 1.6, None, 12.5),
    "σ-MoE (ours), K=1": (6.2, 0.8, None, 6.2),
    "σ-MoE (ours), K=2": (12.5, 1.6, None, 12.5),
    "σ-MoE (ours), K=8": (50.0, 6.2, None, 50.0),
    "Switch, K=1, G=512": _Q,
    "Switch, K=1, G=512, no dropout": _Q,
    "Switch, K=4, G=128": (25.0, 3.1, None, 25.0),
    "Switch, K=1, G=128": (6.2, 0.8, None, 6.2),
    "Switch, K=1, G=128, no dropout": (6.2, 0.8, None, 6.2),
    "S-BASE, K=4, G=128": _Q,
    "S-BASE, K=1, G=512": _Q,
}
FLOPS_COLUMNS = ("WT-S", "WT-S*", "WT-B", "E8")
# Tab. moe, column "% FLOPs" of the sigma-MoE rows (the dense rows are 100%)
MOE_TABLE_FLOPS = {"WT-S": 25.0, "WT-B": 12.5, "E8": 25.0, "C4-S": 25.0, "C4-B": 12.5,
                   "peS2o-S": 25.0, "peS2o-B": 12.5}


def parse(name: str) -> re.Match:
    m = NAME_RE.match(name)
    assert m, f"{name}: does not follow configs/exp/README.md's naming scheme"
    return m


def paper_pct(x: float) -> float:
    return 100 * x


def params_by_formula(m) -> int:
    """The model's parameter count written out (docs/REFERENCE.md "Model"), independent of the
    modules: embedding, per layer attention (Q, K, V, positions, output; u, v; the scale)
    + 2 LayerNorms + the FFN block, the final LayerNorm and the output layer with bias."""
    D, inner, f = m.d_model, m.n_heads * m.head_dim, m.ffn
    experts = lambda: f.n_experts * (2 * D * f.expert_size + D)  # noqa: E731
    formulas = {"dense": lambda: 2 * D * f.d_ff + f.d_ff + D,
                "topk": lambda: 2 * D * f.d_ff + f.d_ff + D,
                "pkm": lambda: f.heads * f.n_subkeys * D + f.n_values * D,
                "sigma_moe": experts, "switch": experts, "sbase": experts}
    if m.ffn_kind not in formulas:
        pytest.fail(f"no parameter formula for ffn={m.ffn_kind}: write its count out in "
                    f"params_by_formula (tests/test_experiments.py)")
    ffn = formulas[m.ffn_kind]()
    layer = 5 * inner * D + 2 * inner + 1 + 4 * D + ffn
    return m.vocab_size * D + m.n_layers * layer + 2 * D + D * m.vocab_size + m.vocab_size


@pytest.mark.parametrize("name", EXPS)
def test_experiment_composes_builds_and_is_well_formed(name):
    """Every experiment: what run.py checks (header, name, the groups whose keys it sets),
    its exact parameter count, a well-formed `paper:` block if it has one (docs/extending.md:
    your own experiment has none); a paper run also everything its table row fixes."""
    check_experiment(name)  # what run.py checks first: header, name, YAML
    cfg, model_cfg, count = load(name)
    assert cfg["name"] == name
    check_top_level(cfg)
    assert count == params_by_formula(model_cfg)  # exact: the 1% checks below cannot see W3
    paper = cfg.get("paper") or {"params_m": None, "entries": []}
    assert set(paper) == {"params_m", "entries"}
    for e in paper["entries"]:
        assert set(e) == {"table", "row", "column", "value"}, e
        assert e["table"] in TABLES, f"{name}: unknown table {e['table']!r}"
        assert e["column"] in TABLES[e["table"]], f"{name}: {e['table']} has no {e['column']!r}"
        assert isinstance(e["row"], str) and "\\" not in e["row"] and "$" not in e["row"]
        assert e["value"] is None or isinstance(e["value"], float)
    if name not in PAPER_EXPS:
        assert paper["params_m"] is None and all(e["table"] == "mini" for e in paper["entries"])
        return

    raw = OmegaConf.to_container(OmegaConf.load(EXP_DIR / f"{name}.yaml"))
    missing = {"dataset", "model", "ffn"} - {k.removeprefix("override /") for d in
                                              raw["defaults"] for k in d}
    assert not missing, (f"{name}: a paper run names its dataset, model and ffn; add "
                         f"'- override /<group>: ...' for {sorted(missing)}")
    m = parse(name)
    setting, variant, ablation = m["setting"], m["variant"], m["ablation"]
    kind, d_model, n_layers, column = SETTINGS[setting]
    assert cfg["dataset"]["kind"] == kind
    assert (cfg["model"]["d_model"], cfg["model"]["n_layers"]) == (d_model, n_layers)
    model = cfg["model"]
    assert (model["n_heads"], model["head_dim"], model["dropout"]) == HEADS_DROPOUT[d_model]
    assert paper["entries"], f"{name}: a paper run must produce at least one table cell"
    assert all(e["column"] == column for e in paper["entries"]), name

    task, trainer = cfg["task"], cfg["trainer"]
    assert (task["eval_batch_size"], task["eval_mem_segments"]) == (4, 4)
    assert (task["batch_size"], task["context"]) == ((32, 512) if setting == "e8" else
                                                     (64, 512) if d_model == 1024 else (64, 256))
    assert trainer["steps"] == 100_000 and trainer["grad_clip"] == 0.25
    assert trainer["lr"] == 2.5e-4 and trainer["schedule"] == "cosine"
    assert trainer["warmup_steps"] == (4000 if d_model == 1024 else 0)
    # Adam as docs/REFERENCE.md: betas (0.9, 0.999), eps 1e-8, no weight decay
    assert (trainer["betas"], trainer["eps"], trainer["weight_decay"]) == ([0.9, 0.999],
                                                                            1e-8, 0.0)
    if kind in ("c4", "pes2o"):
        assert cfg["dataset"]["train_tokens"] == train_tokens_for(
            trainer["steps"], task["batch_size"], task["context"])  # one pass, no wrap

    ffn = model_cfg.ffn
    dropout = cfg["model"]["dropout"]
    n_e, g, k, delta, gamma = MOE_HYPER[setting]
    if variant == "dense":
        assert type(ffn) is DenseConfig and ffn.d_ff == DENSE_D_FF[setting]
    elif variant.startswith("topk"):
        assert isinstance(ffn, TopKConfig) and ffn.d_ff == DENSE_D_FF[setting]
        assert ffn.k == int(variant[4:])
    elif variant.startswith("pkm"):
        _, act, matched, *init = variant.split("_")
        assert isinstance(ffn, PKMConfig) and (ffn.heads, ffn.k) == (4, 128)
        assert ffn.activation == act and ffn.n_subkeys == PKM_SUBKEYS[(matched, d_model)]
        assert ffn.value_init == ("dense" if init else "default")
    else:  # MoEs: always parameter-matched to N_E x G of the main row
        assert ABLATIONS_OF[variant].match(ablation), f"{name}: {variant} has no {ablation}"
        assert isinstance(ffn, ExpertsConfig) and ffn.d_ff == n_e * g
        kg = re.search(r"_k(\d+)_g(\d+)", ablation)
        want_k, want_g = ((int(kg[1]), int(kg[2])) if kg else
                          (1, 512) if variant == "switch" else (k, g))
        assert (ffn.k, ffn.expert_size) == (want_k, want_g)
        if variant == "moe":
            assert isinstance(ffn, SigmaMoEConfig)
            want = {"selection": "sigmoid", "expert_dropout": delta, "hidden_dropout": 0.0,
                    "reg_gamma": gamma, "init": "sigma_moe"}
            want.update({"_standard_dropout": {"expert_dropout": 0.0, "hidden_dropout": dropout},
                         "_softmax": {"selection": "softmax"},
                         "_softmax_renorm": {"selection": "softmax_renorm"},
                         "_standard_init": {"init": "standard"},
                         "_no_reg": {"expert_dropout": 0.0, "reg_gamma": 0.0}}.get(ablation, {}))
            assert {key: getattr(ffn, key) for key in want} == want
        elif variant == "switch":
            assert ffn.hidden_dropout == (0.0 if ablation.endswith("_nodrop") else dropout)
            assert (ffn.balance_coef, ffn.capacity_factor, ffn.init, ffn.init_scale,
                    ffn.selector_init) == (0.01, 0.0, "standard", 0.1, "normal")
        else:  # S-BASE: regularizer and expert dropout as the row's sigma-MoE (docs/REFERENCE.md;
            # gamma: SBASE_GAMMA's exception, configs/exp/README.md)
            assert (ffn.expert_dropout, ffn.reg_gamma, ffn.sinkhorn_iters) == (
                delta, SBASE_GAMMA.get(setting, gamma), 3)

    if paper["params_m"] is not None:
        target = paper["params_m"]
        assert abs(count / 1e6 - target) <= 0.01 * target, f"{name}: {count / 1e6:.2f}M"
        fine = FINE_PARAMS_M[target]
        assert abs(count / 1e6 - fine) <= 0.01 * fine, f"{name}: {count / 1e6:.2f}M vs {fine}"
    else:  # only the value-count matched PKMs have no count in the paper
        assert variant.endswith("_valuecount"), f"{name}: paper.params_m missing"


def test_exp_names_are_unique_per_run_and_cells_cover_every_paper_table():
    cells = [(e["table"], e["row"], e["column"]) for name in PAPER_EXPS
             for e in load(name)[0]["paper"]["entries"]]
    dup = [c for c, n in Counter(cells).items() if n > 1]
    assert not dup, f"table cells claimed by more than one run: {dup}"
    assert Counter(t for t, _, _ in cells) == CELLS
    assert len(PAPER_EXPS) == 118  # runs of the paper, grouped in configs/exp/README.md


def test_ffn_flops_formulas():
    D = 412
    assert ffn_flops(DenseConfig(D, 16, 2053)) == 2 * 2 * D * 2053
    assert ffn_flops(TopKConfig(D, 16, 2053, k=128)) == 2 * (D * 2053 + 128 * D)
    moe = SigmaMoEConfig(D, 16, n_experts=16, expert_size=128, k=4)
    assert ffn_flops(moe) == 2 * 2 * D * 4 * 128
    assert ffn_flops(moe, include_selection=True) == 2 * (2 * D * 4 * 128 + D * 16)
    assert ffn_flops(PKMConfig(D, 16, n_subkeys=62)) == 2 * 4 * (62 * D + 128 * D)
    # k >= n_subkeys with dense_when_k_covers: every one of the 62^2 values is weighted
    dense_pkm = PKMConfig(D, 16, n_subkeys=62, dense_when_k_covers=True)
    assert ffn_flops(dense_pkm) == 2 * (4 * 62 * D + 62**2 * D)
    assert dense_counterpart(moe).d_ff == 16 * 128
    assert relative_ffn_flops(moe) == 4 / 16
    # against the real baseline (d_ff 2053, not 2048) the ratio is 24.9%, not the table's 25.0
    assert round(paper_pct(relative_ffn_flops(moe, DenseConfig(D, 16, 2053))), 1) == 24.9


def test_a_new_variant_needs_its_own_flops_formula(monkeypatch, capsys):
    """A variant built on a known Config (a GLU expert: three matrices) got its parent's
    formula and printed wrong FLOPs; mode=params now says there is none."""
    from dataclasses import dataclass

    from sigma_moe.models.ffn import FFNS
    from sigma_moe.models.ffn.sigma_moe import SigmaMoE
    from sigma_moe.tasks.lm_run import print_params

    @dataclass(frozen=True)
    class GLUConfig(SigmaMoEConfig):
        pass

    class GLU(SigmaMoE):
        Config = GLUConfig

    with pytest.raises(TypeError, match="no FLOPs formula for GLUConfig: add one to "
                                        "sigma_moe/models/flops.py"):
        ffn_flops(GLUConfig(412, 16, n_experts=16, expert_size=128, k=4))
    monkeypatch.setitem(FFNS._items, "glu", GLU)
    out = print_params(compose_cfg(["ffn.kind=glu"]))
    line = capsys.readouterr().out
    assert line.startswith("mini_moe: 3.53M parameters (FFN glu: ")
    assert line.endswith(
        ", FFN FLOPs unknown (no formula for GLUConfig in sigma_moe/models/flops.py)\n")
    assert "ffn_flops_per_token" not in out
    print_params(compose_cfg([]))
    assert "(FFN sigma_moe: " in capsys.readouterr().out


def test_relative_flops_match_the_paper():
    """Tab. flops_detailed and Tab. moe's "% FLOPs": K / N_E against the parameter-equal
    dense counterpart (d_ff = N_E * G), rounded to 0.1% as the paper prints it."""
    seen = set()
    for name in PAPER_EXPS:
        cfg, model_cfg, _ = load(name)
        ffn = model_cfg.ffn
        if not isinstance(ffn, ExpertsConfig):
            continue
        rel = relative_ffn_flops(ffn)
        assert rel == pytest.approx(ffn.k / ffn.n_experts, rel=1e-12), name
        # the actual dense baseline of the row is within 1% of that (d_ff 2053 vs 2048 ...)
        setting = parse(name)["setting"]
        dense = load(f"{setting}_dense")[1].ffn
        assert relative_ffn_flops(ffn, dense) == pytest.approx(rel, rel=0.01), name
        for e in cfg["paper"]["entries"]:
            if e["table"] == "ablation":
                pct = FLOPS_TABLE[e["row"]][FLOPS_COLUMNS.index(e["column"])]
                seen.add((e["row"], e["column"]))
            elif e["table"] == "moe":
                pct = MOE_TABLE_FLOPS[e["column"]]
            else:
                continue
            assert abs(paper_pct(rel) - pct) <= 0.05 + 1e-9, f"{name}: {paper_pct(rel):.2f}%"
    every = {(row, col) for row, pcts in FLOPS_TABLE.items()
             for col, pct in zip(FLOPS_COLUMNS, pcts) if pct is not None}
    assert seen == every, f"Tab. flops_detailed cells without a run: {every - seen}"
