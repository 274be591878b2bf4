"""The optimizer (sigma_moe/framework/optim.py): the paper's Adam settings, no weight decay on MoE
layers (docs/REFERENCE.md), and checkpoints of the one-group layout before that split."""
import torch

from sigma_moe.framework.optim import build_optimizer, in_groups_of
from sigma_moe.models.ffn import FFNS
from sigma_moe.models.ffn.dense import DenseConfig
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig


def dense_moe_norm() -> torch.nn.ModuleDict:
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "dense": FFNS.get("dense")(DenseConfig(8, 2, 16)),
        "moe": FFNS.get("sigma_moe")(SigmaMoEConfig(8, 2, n_experts=4, expert_size=4, k=2)),
        "norm": torch.nn.LayerNorm(8)})


def test_optimizer_gets_the_settings_and_never_decays_moe_layers():
    model = dense_moe_norm()
    opt = build_optimizer(model, 1e-3, (0.9, 0.999), 1e-8, weight_decay=0.1)
    assert (opt.defaults["betas"], opt.defaults["eps"], opt.defaults["lr"]) == (
        (0.9, 0.999), 1e-8, 1e-3)
    plain = torch.optim.AdamW([torch.zeros(1)]).defaults  # the paper's Adam: no variant
    assert {k: opt.defaults[k] for k in ("amsgrad", "maximize")} == {
        k: plain[k] for k in ("amsgrad", "maximize")}
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(decay) == len(list(model.parameters()))
    assert all(decay[id(p)] == 0.0 for p in model["moe"].parameters())
    assert all(decay[id(p)] == 0.1 for p in [*model["dense"].parameters(),
                                                *model["norm"].parameters()])
    # weight decay 0 (every paper run): one group, as in checkpoints of earlier versions
    assert len(build_optimizer(model, 1e-3, (0.9, 0.999), 1e-8, 0.0).param_groups) == 1


def test_a_one_group_optimizer_state_resumes_in_two_groups():
    """A checkpoint of the code before MoE layers were kept out of weight decay (one group,
    nonzero decay) resumes: each parameter keeps its Adam moments, each group its decay."""
    model = dense_moe_norm()
    params = list(model.parameters())
    old = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)  # the earlier build_optimizer
    for p in params:
        p.grad = torch.randn_like(p)
    old.step()
    new = build_optimizer(model, 1e-2, (0.9, 0.999), 1e-8, weight_decay=0.1)
    new.load_state_dict(in_groups_of(old.state_dict(), new, params))
    assert [g["weight_decay"] for g in new.param_groups] == [0.1, 0.0]
    for p in params:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(new.state[p][key], old.state[p][key]), key
    saved = new.state_dict()
    assert in_groups_of(saved, new, params) is saved  # the current layout: unchanged
