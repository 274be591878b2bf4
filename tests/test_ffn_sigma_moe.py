"""sigma-MoE (paper Sec. 4) against its equations: output, regularizer, init, dropout."""
from __future__ import annotations

import math

import pytest
import torch

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn.base import entropy_regularizer
from sigma_moe.models.ffn.experts import ExpertsConfig
from sigma_moe.models.ffn.sigma_moe import SigmaMoE, SigmaMoEConfig

D, E, G, K, L = 10, 6, 8, 2, 4


def make(**kw) -> SigmaMoE:
    cfg = dict(d_model=D, n_layers=L, n_experts=E, expert_size=G, k=K, backend="reference")
    return SigmaMoE(SigmaMoEConfig(**{**cfg, **kw}))


def brute_moe(moe, x_D, experts, gates) -> torch.Tensor:
    """sum_k gate_k W2[e_k]^T relu(W1[e_k]^T x), one expert at a time (Eq. moe_out)."""
    y_D = torch.zeros(D)
    for e, g in zip(experts, gates):
        y_D = y_D + g * (torch.relu(x_D @ moe.w1_EDG[e]) @ moe.w2_EGD[e])
    return y_D


def brute_sigma(moe, x_D, selection) -> torch.Tensor:
    z_E = moe.w3_ED @ x_D
    if selection == "softmax_renorm":  # top-K on logits, softmax over the K
        top = sorted(range(E), key=lambda e: -z_E[e].item())[:K]
        return brute_moe(moe, x_D, top, torch.softmax(z_E[top], 0))
    s_E = torch.sigmoid(z_E) if selection == "sigmoid" else torch.softmax(z_E, 0)
    top = sorted(range(E), key=lambda e: -s_E[e].item())[:K]
    return brute_moe(moe, x_D, top, [s_E[e] for e in top])


@pytest.mark.parametrize("selection", ["sigmoid", "softmax", "softmax_renorm"])
def test_output_matches_per_token_loop(selection):
    torch.manual_seed(0)
    moe = make(selection=selection, expert_dropout=0.5, hidden_dropout=0.5).eval()
    x_BTD = torch.randn(2, 4, D)
    with torch.no_grad():
        y_TD = moe(x_BTD).reshape(-1, D)
        want = torch.stack([brute_sigma(moe, x, selection) for x in x_BTD.reshape(-1, D)])
    torch.testing.assert_close(y_TD, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("selection", ["sigmoid", "softmax", "softmax_renorm"])
@pytest.mark.parametrize("training", [False, True])
def test_gradients_match_per_token_loop(selection, training):
    """d/d(x, W1, W2, W3) of the output (the selector W3 learns through the gates) and, in
    training, of the entropy regularizer on the selection logits (Eq. our_reg)."""
    torch.manual_seed(1)
    moe = make(selection=selection, reg_gamma=0.3).train(training)  # no dropout: exact
    x_BTD = torch.randn(2, 4, D, requires_grad=True)
    r_TD = torch.randn(8, D)
    wrt = [x_BTD, moe.w1_EDG, moe.w2_EGD, moe.w3_ED]
    loss = (moe(x_BTD).reshape(-1, D) * r_TD).sum()
    got = torch.autograd.grad(loss + (moe.pop_loss() if training else 0), wrt)
    x_TD = x_BTD.reshape(-1, D)
    want = (torch.stack([brute_sigma(moe, x, selection) for x in x_TD]) * r_TD).sum()
    if training:
        want = want + 0.3 * entropy_regularizer(x_TD @ moe.w3_ED.T)
    for g, w in zip(got, torch.autograd.grad(want, wrt)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_entropy_regularizer_hand_built():
    # token 1: p = (1/4, 3/4); token 2: p = (1/2, 1/2) -> mean p = (3/8, 5/8)
    logits_TE = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    want = 3 / 8 * math.log(3 / 8) + 5 / 8 * math.log(5 / 8)
    assert entropy_regularizer(logits_TE).item() == pytest.approx(want, rel=1e-6)
    moe = make(n_experts=2, k=1, reg_gamma=0.5).train()
    moe.select(logits_TE)
    assert moe.pop_loss().item() == pytest.approx(0.5 * want, rel=1e-6)
    moe.eval()
    moe.select(logits_TE)
    assert moe.pop_loss() is None  # training only


def test_init_standard_deviations():
    torch.manual_seed(0)
    big = dict(d_model=96, n_layers=8, n_experts=16, expert_size=48, k=2)
    gain = math.sqrt(2 / 8)
    for init, fan2 in [("sigma_moe", 16 * 48), ("standard", 48)]:
        moe = make(**big, init=init)
        assert moe.w1_EDG.std().item() == pytest.approx(gain / math.sqrt(96), rel=0.03)
        assert moe.w2_EGD.std().item() == pytest.approx(gain / math.sqrt(fan2), rel=0.03)
        norms_E = moe.w3_ED.norm(dim=-1)
        torch.testing.assert_close(norms_E, norms_E[:1].expand(16), rtol=1e-5, atol=0)
        assert moe.w3_ED.std().item() == pytest.approx(gain / math.sqrt(96), rel=1e-5)


@pytest.mark.parametrize("selection", ["sigmoid", "softmax", "softmax_renorm"])
def test_expert_dropout_gives_dropped_experts_zero_weight(selection):
    torch.manual_seed(0)
    # delta 0.2, not 0.5: a mask that dropped with probability 1 - delta would pass at 0.5
    moe = make(n_experts=8, k=3, selection=selection, expert_dropout=0.2).train()
    logits_TE = torch.randn(200, 8)
    torch.manual_seed(123)
    expert_TK, gate_TK = moe.select(logits_TE)
    torch.manual_seed(123)  # the same draw as inside select (Eq. expert_drop)
    keep_TE = torch.rand_like(logits_TE) >= 0.2
    kept_TK = keep_TE.gather(-1, expert_TK)
    assert (gate_TK[~kept_TK] == 0).all() and (~kept_TK).any()
    # kept gates are the undropped scores, not rescaled by 1/(1-delta); softmax over all N_E
    # (before top-k) or over the K kept logits (after top-k, renormalised)
    if selection == "softmax_renorm":
        masked_TE = logits_TE.masked_fill(~keep_TE, torch.finfo(logits_TE.dtype).min)
        want_TK = torch.softmax(masked_TE.gather(-1, expert_TK), -1)
    else:
        act = torch.sigmoid if selection == "sigmoid" else lambda z: torch.softmax(z, -1)
        want_TK = act(logits_TE).gather(-1, expert_TK)
    torch.testing.assert_close(gate_TK[kept_TK], want_TK[kept_TK])
    # The kept experts are the best-scoring kept ones: nothing better was kept but skipped.
    masked_TE = logits_TE.masked_fill(~keep_TE, -math.inf)
    best_TK = masked_TE.topk(3, dim=-1).values
    n_kept_T = keep_TE.sum(-1)
    for t in range(200):
        m = min(3, int(n_kept_T[t]))
        got = sorted(logits_TE[t, expert_TK[t][kept_TK[t]]].tolist(), reverse=True)
        assert got == pytest.approx(best_TK[t, :m].tolist())


def test_softmax_renorm_gives_a_token_with_no_kept_expert_zero_gates():
    """Every expert of a token dropped (rare at delta 0.2: made common here): its K gates
    are 0, not a softmax over K masked logits (1/K each)."""
    moe = make(n_experts=4, k=2, selection="softmax_renorm", expert_dropout=0.9).train()
    logits_TE = torch.randn(500, 4)
    torch.manual_seed(1)
    _, gate_TK = moe.select(logits_TE)
    torch.manual_seed(1)  # the same draw as inside select
    none_kept_T = ~(torch.rand_like(logits_TE) >= 0.9).any(-1)
    assert none_kept_T.any() and (gate_TK[none_kept_T] == 0).all()


def test_expert_dropout_drops_a_delta_share_of_the_experts():
    torch.manual_seed(0)
    moe = make(n_experts=16, k=16, expert_dropout=0.1).train()  # k = N_E: every expert
    _, gate_TK = moe.select(torch.randn(4000, 16))
    assert (gate_TK == 0).double().mean().item() == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("dropout", [dict(expert_dropout=0.3), dict(hidden_dropout=0.3)])
def test_evaluation_is_deterministic_and_training_is_not(dropout):
    """Each dropout on its own (together, one that is never applied would go unseen)."""
    torch.manual_seed(0)
    moe = make(**dropout)
    x_BTD = torch.randn(2, 8, D)
    moe.eval()
    torch.testing.assert_close(moe(x_BTD), moe(x_BTD), rtol=0, atol=0)
    moe.train()
    assert not torch.equal(moe(x_BTD), moe(x_BTD))


def test_dead_fraction_counts_never_chosen_experts_only():
    from sigma_moe.models.ffn.base import RoutingStats

    stats = RoutingStats()
    stats.enabled = True
    expert_TK = torch.tensor([[0], [1], [1], [3], [3], [3]])  # counts 1, 2, 0, 3
    stats.record_moe(expert_TK, torch.ones(6, 1), 4)
    assert stats.summary()["dead_fraction"] == 0.25


def test_routing_stats_count_selections():
    torch.manual_seed(0)
    moe = make().eval()
    moe.stats.enabled = True
    x_TD = torch.randn(30, D)
    moe(x_TD)
    s = moe.stats.summary()
    top_TK = (x_TD @ moe.w3_ED.T).topk(K, dim=-1).indices
    count_E = torch.bincount(top_TK.flatten(), minlength=E).double()
    assert s["dead_fraction"] == pytest.approx(float((count_E == 0).double().mean()))
    usage_E = count_E / count_E.sum()
    ent = -(usage_E * usage_E.clamp_min(1e-30).log()).sum()
    assert s["usage_entropy"] == pytest.approx(float(ent))
    # each expert's share of the selection weight: its sigmoid gates summed over the tokens
    # that chose it
    gate_TK = torch.sigmoid((x_TD @ moe.w3_ED.T).gather(-1, top_TK))
    weight_E = torch.zeros(E).index_add_(0, top_TK.flatten(), gate_TK.flatten().detach())
    assert s["expert_share"] == pytest.approx((weight_E / weight_E.sum()).tolist(), rel=1e-5)


def test_k_above_n_experts_is_one_line_config_error():
    with pytest.raises(ConfigError, match=r"ffn.k=7 .* ffn.n_experts=6.*lower ffn.k") as e:
        ExpertsConfig(d_model=D, n_layers=L, n_experts=6, expert_size=G, k=7)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="expert_dropout"):
        SigmaMoEConfig(d_model=D, n_layers=L, n_experts=E, expert_size=G, k=K, expert_dropout=1.0)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_an_empty_batch_trains(backend):
    """No tokens (e.g. a rank's empty shard) in training: math.log(0) in the regularizer
    stopped it before."""
    moe = make(backend=backend, expert_dropout=0.5, reg_gamma=0.1).train()
    x_BTD = torch.randn(0, 5, D, requires_grad=True)
    y_BTD = moe(x_BTD)
    assert y_BTD.shape == (0, 5, D)
    loss = moe.pop_loss()
    assert loss.item() == 0.0
    (y_BTD.sum() + loss).backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in moe.parameters())


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float32),
                                           ("torch", torch.bfloat16)])
def test_experts_get_x_in_the_dtype_their_backend_computes_in(backend, dtype, monkeypatch):
    """Under autocast the reference computes in its inputs' own dtypes (fp32 here, as a
    check should), the other backends get x cast once, shared with the selector."""
    import sigma_moe.models.ffn.experts as experts

    seen, real = [], experts.moe_mlp
    monkeypatch.setattr(experts, "moe_mlp", lambda x, *a, **k: seen.append(x.dtype)
                        or real(x, *a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        make(backend=backend)(torch.randn(2, 5, D))
    assert seen == [dtype]


def test_selection_runs_in_fp32_under_bf16_autocast(monkeypatch):
    """bf16 sigmoids of distinct logits tie (the top-K then picks by expert id) and round
    to gates of 1 (no gradient): the experts and gates are those of fp32 sigmoids of the
    same (bf16) logits."""
    import sigma_moe.models.ffn.experts as experts

    torch.manual_seed(0)
    moe = make(n_experts=16, k=4)
    with torch.no_grad():
        moe.w3_ED.mul_(8)  # logits of several units, where bf16 sigmoids are coarsest
    seen, real_sel, real_mlp = {}, experts.selector_logits, experts.moe_mlp
    monkeypatch.setattr(experts, "selector_logits",
                        lambda *a: seen.setdefault("logits", real_sel(*a)))
    monkeypatch.setattr(experts, "moe_mlp", lambda x, e, g, *a, **k: seen.update(
        expert=e, gate=g) or real_mlp(x, e, g, *a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        moe(torch.randn(1000, D))
    logits_TE = seen["logits"][0]
    assert logits_TE.dtype == torch.bfloat16
    gate_TK, expert_TK = torch.sigmoid(logits_TE.float()).topk(4, dim=-1)
    order_TK, want_TK = seen["expert"].argsort(-1), expert_TK.argsort(-1)
    assert torch.equal(seen["expert"].gather(-1, order_TK), expert_TK.gather(-1, want_TK))
    assert seen["gate"].dtype == torch.float32
    torch.testing.assert_close(seen["gate"].gather(-1, order_TK), gate_TK.gather(-1, want_TK))
