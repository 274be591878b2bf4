"""configs/ffn/*.yaml: each composes into its variant's Config, and the WT-S / WT-B sizes
match the dense baseline's parameter count (docs/REFERENCE.md: within 1%)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from sigma_moe.framework.config import ConfigError, from_dict
from sigma_moe.models.ffn import FFNS

FFN_DIR = Path(__file__).resolve().parents[1] / "configs" / "ffn"
WT_S = dict(d_model=412, n_layers=16, dropout=0.1)
WT_B = dict(d_model=1024, n_layers=18, dropout=0.2)


def build(name: str, model: dict, **overrides):
    """Resolve configs/ffn/<name>.yaml against a model group, like Hydra would; the module
    lives on the meta device (shapes only: counting parameters needs no init)."""
    root = OmegaConf.create({"model": model, "ffn": OmegaConf.load(FFN_DIR / f"{name}.yaml")})
    data = OmegaConf.to_container(root.ffn, resolve=True)
    kind = data.pop("kind")
    assert kind == name  # the registry name is the file name
    cls = FFNS.get(kind)
    with torch.device("meta"):
        return cls(from_dict(cls.Config, {**data, **overrides}, "ffn"))


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_registered_variant_has_a_yaml_and_back():
    assert sorted(p.stem for p in FFN_DIR.glob("*.yaml")) == FFNS.names()


# Config fields a yaml may leave out: derived from the others when not set
DERIVED = {"d_ff"}  # ExpertsConfig: 0 = N_E * G


@pytest.mark.parametrize("name", FFNS.names())
def test_each_yaml_lists_every_field_of_its_config(name):
    """docs/extending.md: a variant's yaml holds every field of its Config (one place to read
    and sweep them all); a field left out would run at a default no file shows."""
    keys = set(OmegaConf.load(FFN_DIR / f"{name}.yaml")) - {"kind"}
    fields = {f.name for f in dataclasses.fields(FFNS.get(name).Config) if f.init}
    assert keys <= fields  # (from_dict refuses the rest anyway)
    assert not fields - keys - DERIVED, f"configs/ffn/{name}.yaml lacks {fields - keys - DERIVED}"


@pytest.mark.parametrize("model, overrides", [
    (WT_S, {"topk": {}, "pkm": {}, "sigma_moe": {}, "switch": {}, "sbase": {}}),
    (WT_B, {"dense": {"d_ff": 4110}, "topk": {"d_ff": 4110}, "pkm": {"n_subkeys": 89},
            "sigma_moe": {"n_experts": 32}, "switch": {"n_experts": 8},
            "sbase": {"n_experts": 32}}),
])
def test_yaml_defaults_build_and_match_dense_parameter_count(model, overrides):
    dense = n_params(build("dense", model, **overrides.get("dense", {})))
    for name in FFNS.names():
        if name == "dense":
            continue
        count = n_params(build(name, model, **overrides.get(name, {})))
        assert abs(count / dense - 1) < 0.01, (
            f"{name} at d_model {model['d_model']}: {count:,} FFN parameters, the dense MLP "
            f"{dense:,}; give it parameter-matched sizes in this test's overrides "
            f"({name!r}: {{...}}, as sigma_moe's n_experts at WT-B)")


def test_yaml_comments_document_the_paper_rows():
    s = build("switch", WT_S).cfg
    got = (s.n_experts, s.expert_size, s.k, s.balance_coef, s.hidden_dropout)
    assert got == (4, 512, 1, 0.01, 0.1)
    b = build("sbase", WT_S).cfg
    assert (b.n_experts, b.expert_size, b.k, b.sinkhorn_iters, b.reg_gamma) == (16, 128, 4, 3, 1e-3)
    p = build("pkm", WT_S).cfg
    assert (p.n_subkeys, p.heads, p.k, p.activation, p.dense) == (62, 4, 128, "relu", False)


def test_a_variant_without_its_own_config_is_refused():
    """It would read its parent's keys and get its parent's FLOPs formula, silently."""
    from sigma_moe.framework.registry import RegistryError
    from sigma_moe.models.ffn.sigma_moe import SigmaMoE

    class Forgot(SigmaMoE):
        pass

    with pytest.raises(RegistryError, match=r"'forgot': set `Config = <its frozen dataclass>` "
                                            r"in class Forgot \(it would use SigmaMoE's\)"):
        FFNS.register("forgot")(Forgot)
    assert "forgot" not in FFNS


def test_unknown_key_is_refused_with_a_hint():
    hint = r"unknown config key 'ffn.sinkhorn_iter'.*did you mean 'sinkhorn_iters'"
    with pytest.raises(ConfigError, match=hint):
        build("sbase", WT_S, sinkhorn_iter=2)


def test_parameter_counts_are_exactly_the_papers_formulas():
    """Per FFN block, exact (a 1% tolerance cannot see the selector W3: 0.2-0.4% of a model):
    dense/top-k 2 D d_ff + d_ff + D (biases); MoEs N_E (2 D G + D) (experts and W3, no
    biases); PKM 4 heads x n sub-keys x D (two halves of D/2) + n^2 D values."""
    D, E, G, F, n = 412, 16, 128, 2053, 62
    count = {name: n_params(build(name, WT_S)) for name in FFNS.names()}
    assert count["dense"] == count["topk"] == 2 * D * F + F + D
    for moe in ("sigma_moe", "sbase"):
        assert count[moe] == E * (2 * D * G + D)
    assert count["switch"] == 4 * (2 * D * 512 + D)  # N_E 4, G 512: parameter-matched K=1
    assert count["pkm"] == 4 * n * D + n * n * D


def test_an_expert_layer_precompiles_at_its_own_shapes(monkeypatch):
    """ExpertsConfig.precompile (LMTask.precompile and bench_train.py use it):
    kernels.precompile_moe at the layer config's shapes, dropout, backend and token chunks
    and the step's token count."""
    import torch

    from sigma_moe import kernels
    from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig

    calls = []
    monkeypatch.setattr(kernels, "precompile_moe",
                        lambda *args, **kw: calls.append((args, kw)) or "said")
    cfg = SigmaMoEConfig(24, 2, 6, 16, 2, hidden_dropout=0.1, n_chunks=3)
    assert cfg.precompile(40, "cuda", torch.bfloat16) == "said"
    assert calls == [((40, 24, 6, 16, 2, 0.1, "auto"),
                      {"device": "cuda", "dtype": torch.bfloat16, "n_chunks": 3})]


def test_expert_layers_take_token_chunks(monkeypatch):
    """ffn.n_chunks reaches kernels.moe_mlp (the torch path here: the same result in other
    chunks); below 1 is a config error naming the key."""
    import pytest
    import torch

    from sigma_moe.framework.config import ConfigError
    from sigma_moe.models.ffn import experts
    from sigma_moe.models.ffn.sigma_moe import SigmaMoE, SigmaMoEConfig

    asked, real = [], experts.moe_mlp
    monkeypatch.setattr(experts, "moe_mlp",
                        lambda *a, **kw: asked.append(kw["n_chunks"]) or real(*a, **kw))
    x = torch.randn(2, 9, 24)
    ys = []
    for n_chunks in (None, 1, 4):
        torch.manual_seed(0)
        layer = SigmaMoE(SigmaMoEConfig(24, 2, 6, 16, 2, n_chunks=n_chunks, backend="torch"))
        ys.append(layer.eval()(x))
    assert asked == [None, 1, 4]
    torch.testing.assert_close(ys[1], ys[0])
    torch.testing.assert_close(ys[2], ys[0])
    with pytest.raises(ConfigError, match="ffn.n_chunks=0 must be at least 1"):
        SigmaMoEConfig(24, 2, 6, 16, 2, n_chunks=0)
