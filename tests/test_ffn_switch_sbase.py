"""Switch and S-BASE (paper Sec. 5) against their equations, token by token."""
from __future__ import annotations

import math

import pytest
import torch

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn.sbase import SBaseConfig, SBaseMoE
from sigma_moe.models.ffn.switch import SwitchConfig, SwitchMoE

D, E, G, K, L = 10, 6, 8, 2, 4
BASE = dict(d_model=D, n_layers=L, n_experts=E, expert_size=G, k=K, backend="reference")


def brute_moe(moe, x_D, experts, gates) -> torch.Tensor:
    """sum_k gate_k W2[e_k]^T relu(W1[e_k]^T x), one expert at a time (Eq. moe_out)."""
    y_D = torch.zeros(D)
    for e, g in zip(experts, gates):
        y_D = y_D + g * (torch.relu(x_D @ moe.w1_EDG[e]) @ moe.w2_EGD[e])
    return y_D


def top(scores, k) -> list[int]:
    return sorted(range(len(scores)), key=lambda e: -float(scores[e]))[:k]


# --- Switch -------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3])
def test_switch_output_matches_per_token_loop(k):
    torch.manual_seed(0)
    moe = SwitchMoE(SwitchConfig(**{**BASE, "k": k}, hidden_dropout=0.4)).eval()
    x_TD = torch.randn(9, D)
    with torch.no_grad():
        want = []
        for x_D in x_TD:
            p_E = torch.softmax(moe.w3_ED @ x_D, 0)  # gate = softmax prob, not renormalised
            chosen = top(p_E, k)
            want.append(brute_moe(moe, x_D, chosen, [p_E[e] for e in chosen]))
        torch.testing.assert_close(moe(x_TD), torch.stack(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 3])
def test_switch_gradients_match_per_token_loop(k):
    """The selector learns through the softmax gate (no balancing loss in eval)."""
    torch.manual_seed(2)
    moe = SwitchMoE(SwitchConfig(**{**BASE, "k": k})).eval()
    x_TD, r_TD = torch.randn(9, D, requires_grad=True), torch.randn(9, D)
    wrt = [x_TD, moe.w1_EDG, moe.w2_EGD, moe.w3_ED]
    got = torch.autograd.grad((moe(x_TD) * r_TD).sum(), wrt)
    want = []
    for x_D in x_TD:
        p_E = torch.softmax(moe.w3_ED @ x_D, 0)
        chosen = top(p_E.detach(), k)
        want.append(brute_moe(moe, x_D, chosen, [p_E[e] for e in chosen]))
    for g, w in zip(got, torch.autograd.grad((torch.stack(want) * r_TD).sum(), wrt)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_switch_hidden_dropout_is_applied_in_training_and_unbiased():
    """The "with dropout" rows: inverted dropout on the expert hidden units (h / (1 - p))."""
    torch.manual_seed(0)
    moe = SwitchMoE(SwitchConfig(**{**BASE, "k": 1}, hidden_dropout=0.5))
    x_TD = torch.randn(9, D)
    with torch.no_grad():
        want_TD = moe.eval()(x_TD)
        moe.train()
        draws_NTD = torch.stack([moe(x_TD) for _ in range(2000)])
    assert not torch.allclose(draws_NTD[0], want_TD)
    scale = want_TD.abs().max().item()  # one draw's spread is about the output's size
    torch.testing.assert_close(draws_NTD.mean(0), want_TD, rtol=0, atol=0.1 * scale)


# p = (3/4, 1/4) for tokens 0, 1, 3 (-> expert 0) and (1/4, 3/4) for token 2 (-> expert 1)
LN3 = math.log(3.0)
HAND_LOGITS = torch.tensor([[LN3, 0.0], [LN3, 0.0], [0.0, LN3], [LN3, 0.0]])


def test_switch_balancing_loss_hand_built():
    moe = SwitchMoE(SwitchConfig(**{**BASE, "n_experts": 2, "k": 1}, balance_coef=0.5)).train()
    expert_TK, gate_TK = moe.select(HAND_LOGITS)
    assert expert_TK.flatten().tolist() == [0, 0, 1, 0]
    f, P = [3 / 4, 1 / 4], [(3 * 0.75 + 0.25) / 4, (3 * 0.25 + 0.75) / 4]
    want = 2 * (f[0] * P[0] + f[1] * P[1])  # N_E * f . P = 1.125
    assert moe.pop_loss().item() == pytest.approx(0.5 * want, rel=1e-6)
    # Only P carries gradient: d loss / d logits = 0.5 * N_E * f . dP/dlogits.
    logits = HAND_LOGITS.clone().requires_grad_()
    moe.select(logits)
    moe.pop_loss().backward()
    p = torch.softmax(HAND_LOGITS, -1)
    g_P = 0.5 * 2 * torch.tensor(f) / 4
    want_grad = p * (g_P - (p * g_P).sum(-1, keepdim=True))
    torch.testing.assert_close(logits.grad, want_grad)


def test_switch_capacity_drops_overflow_in_token_order():
    cfg = SwitchConfig(**{**BASE, "n_experts": 2, "k": 1}, capacity_factor=0.5)  # cap = 1
    moe = SwitchMoE(cfg).train()
    _, gate_TK = moe.select(HAND_LOGITS)
    assert gate_TK.flatten().tolist() == pytest.approx([0.75, 0, 0.75, 0])
    moe.eval()  # evaluation routes every token
    assert moe.select(HAND_LOGITS)[1].flatten().tolist() == pytest.approx([0.75] * 4)


@pytest.mark.parametrize("factor,dropped", [(1.0, 0), (0.75, 1)])
def test_switch_capacity_is_ceil_of_factor_times_rows_per_expert(factor, dropped):
    """capacity = ceil(factor * T * K / E): T 2, K 2, E 3 gives ceil(1.33) = 2 (nothing
    dropped) at factor 1 and 1 at 0.75 (expert 1, chosen by both tokens, drops one)."""
    logits_TE = torch.log(torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]]))
    moe = SwitchMoE(SwitchConfig(**{**BASE, "n_experts": 3, "k": 2},
                                 capacity_factor=factor)).train()
    _, gate_TK = moe.select(logits_TE)
    assert int((gate_TK == 0).sum()) == dropped


def test_switch_k2_balancing_loss_and_capacity_hand_built():
    """K=2: f counts both slots (sum_e f = K); the capacity queue is by token, then slot."""
    logits = torch.log(torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]]))  # p = logits / 6
    moe = SwitchMoE(SwitchConfig(**{**BASE, "n_experts": 3, "k": 2}, balance_coef=0.5,
                                 capacity_factor=0.75)).train()  # capacity ceil(0.75*4/3) = 1
    expert_TK, gate_TK = moe.select(logits)
    assert expert_TK.tolist() == [[0, 1], [2, 1]]
    # f = (1/2, 2/2, 1/2), P = (1/3, 1/3, 1/3): N_E f.P = 3 * 2/3 = 2
    assert moe.pop_loss().item() == pytest.approx(0.5 * 2.0, rel=1e-6)
    # expert 1's queue: token 0 (slot 1) first, token 1's slot 1 overflows
    assert gate_TK.flatten().tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 2, 0.0])


def test_switch_init_standard_deviations():
    torch.manual_seed(0)
    cfg = SwitchConfig(d_model=96, n_layers=8, n_experts=4, expert_size=192, k=1)
    moe = SwitchMoE(cfg)
    gain = math.sqrt(0.1 * 2 / 8)
    assert moe.w1_EDG.std().item() == pytest.approx(gain / math.sqrt(96), rel=0.03)
    assert moe.w2_EGD.std().item() == pytest.approx(gain / math.sqrt(192), rel=0.03)
    assert moe.w3_ED.std().item() == pytest.approx(gain / math.sqrt(96), rel=0.05)
    norms_E = moe.w3_ED.norm(dim=-1)
    assert norms_E.std() / norms_E.mean() > 0.01  # plain normal rows: norms differ

    # the authors' C4-B/peS2o-B sweeps: init_scale 1, sigma-MoE's equal-norm selector rows
    moe = SwitchMoE(SwitchConfig(d_model=96, n_layers=8, n_experts=4, expert_size=192, k=1,
                                 init_scale=1.0, selector_init="equal_norm"))
    gain = math.sqrt(2 / 8)
    assert moe.w2_EGD.std().item() == pytest.approx(gain / math.sqrt(192), rel=0.03)
    norms_E = moe.w3_ED.norm(dim=-1)
    torch.testing.assert_close(norms_E, norms_E[:1].expand(4), rtol=1e-5, atol=0)
    assert moe.w3_ED.std().item() == pytest.approx(gain / math.sqrt(96), rel=1e-5)


# --- S-BASE -------------------------------------------------------------------------------

def brute_sinkhorn(logits_TE: torch.Tensor, n_iters: int) -> torch.Tensor:
    """Probability-space Sinkhorn: alternately normalise rows (tokens), then columns."""
    P = (logits_TE - logits_TE.max()).double().exp()
    for _ in range(n_iters):
        P = P / P.sum(1, keepdim=True)
        P = P / P.sum(0, keepdim=True)
    return P


def make_sbase(**kw) -> SBaseMoE:
    return SBaseMoE(SBaseConfig(**{**BASE, "reg_gamma": 0.0, **kw}))


@pytest.mark.parametrize("training", [True, False])
def test_sbase_output_matches_per_sequence_brute_force(training):
    torch.manual_seed(0)
    moe = make_sbase(sinkhorn_iters=2).train(training)
    x_BTD = torch.randn(3, 7, D)
    with torch.no_grad():
        y_BTD = moe(x_BTD)
        for b in range(3):
            logits_TE = x_BTD[b] @ moe.w3_ED.T
            rank_TE = brute_sinkhorn(logits_TE, 2) if training else logits_TE
            for t in range(7):
                chosen = top(rank_TE[t], K)
                gates = [torch.sigmoid(logits_TE[t, e]) for e in chosen]
                want = brute_moe(moe, x_BTD[b, t], chosen, gates)
                torch.testing.assert_close(y_BTD[b, t], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("training", [True, False])
def test_sbase_gradients_match_per_sequence_brute_force(training):
    """Sinkhorn only ranks (no gradient); the selector learns through sigmoid(raw logit)."""
    torch.manual_seed(3)
    moe = make_sbase(sinkhorn_iters=2).train(training)
    x_BTD, r_BTD = torch.randn(2, 5, D, requires_grad=True), torch.randn(2, 5, D)
    wrt = [x_BTD, moe.w1_EDG, moe.w2_EGD, moe.w3_ED]
    got = torch.autograd.grad((moe(x_BTD) * r_BTD).sum(), wrt)
    want = 0
    for b in range(2):
        logits_TE = x_BTD[b] @ moe.w3_ED.T
        rank_TE = brute_sinkhorn(logits_TE.detach(), 2) if training else logits_TE.detach()
        for t in range(5):
            chosen = top(rank_TE[t], K)
            gates = [torch.sigmoid(logits_TE[t, e]) for e in chosen]
            want = want + (brute_moe(moe, x_BTD[b, t], chosen, gates) * r_BTD[b, t]).sum()
    for g, w in zip(got, torch.autograd.grad(want, wrt)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def skewed_sbase() -> tuple[SBaseMoE, torch.Tensor]:
    """Logits strongly favouring experts 0 and 1: a shared input direction they align with."""
    torch.manual_seed(0)
    moe = make_sbase(n_experts=8, k=2, sinkhorn_iters=3)
    u_D = torch.nn.functional.normalize(torch.randn(D), dim=0)
    with torch.no_grad():
        pull_E = torch.tensor([3.0, 2.5, 0, 0, 0, 0, 0, 0])
        moe.w3_ED.copy_(0.3 * torch.randn(8, D) + pull_E[:, None] * u_D)
    return moe, torch.randn(4, 64, D) + 2 * u_D


def test_sbase_sinkhorn_spreads_skewed_routing_evenly():
    moe, x_BTD = skewed_sbase()
    entropy = {}
    for training in (True, False):
        moe.train(training)
        moe.stats.reset()
        moe.stats.enabled = True
        with torch.no_grad():
            moe(x_BTD)
        entropy[training] = moe.stats.summary()["usage_entropy_norm"]
    assert entropy[True] > 0.95 and entropy[True] > entropy[False] + 0.2, entropy


def test_sbase_evaluation_is_plain_topk_and_deterministic():
    moe, x_BTD = skewed_sbase()
    moe.eval()
    logits_TE = x_BTD.reshape(-1, D) @ moe.w3_ED.T
    expert_TK, gate_TK = moe.select(logits_TE)
    want_gate_TK, want_TK = torch.sigmoid(logits_TE).topk(2, dim=-1)
    assert torch.equal(expert_TK, want_TK)
    torch.testing.assert_close(gate_TK, want_gate_TK)
    torch.testing.assert_close(moe(x_BTD), moe(x_BTD), rtol=0, atol=0)


def test_sbase_expert_dropout_gives_dropped_experts_zero_weight():
    torch.manual_seed(0)
    moe = make_sbase(n_experts=4, k=3, expert_dropout=0.5).train()
    logits_TE = torch.randn(50, 4)  # one sequence of 50 tokens
    torch.manual_seed(7)
    expert_TK, gate_TK = moe.select(logits_TE)
    torch.manual_seed(7)  # the same draw as inside select
    keep_TE = torch.rand_like(logits_TE) >= 0.5
    kept_TK = keep_TE.gather(-1, expert_TK)
    assert (~kept_TK).any() and (gate_TK[~kept_TK] == 0).all()
    sigmoid_TK = torch.sigmoid(logits_TE.gather(-1, expert_TK))
    torch.testing.assert_close(gate_TK[kept_TK], sigmoid_TK[kept_TK])


def test_sbase_adds_the_entropy_regularizer_in_training_only():
    moe = make_sbase(n_experts=2, k=1, reg_gamma=0.5)
    logits_TE = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    moe.train().select(logits_TE)
    want = 3 / 8 * math.log(3 / 8) + 5 / 8 * math.log(5 / 8)
    assert moe.pop_loss().item() == pytest.approx(0.5 * want, rel=1e-6)
    moe.eval().select(logits_TE)
    assert moe.pop_loss() is None


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="sinkhorn_iters.*sigma_moe"):
        SBaseConfig(**BASE, sinkhorn_iters=0)
    with pytest.raises(ConfigError, match=r"ffn.k=7 .* ffn.n_experts=6") as e:
        SwitchConfig(**{**BASE, "k": 7})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="capacity_factor"):
        SwitchConfig(**BASE, capacity_factor=-1.0)
