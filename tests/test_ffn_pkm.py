"""Product-key memory against the full n^2 score table, token by token (paper Sec. 3.2)."""
from __future__ import annotations

import math

import pytest
import torch

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn.pkm import PKM, PKMConfig

D, N, H, L = 8, 7, 3, 4


def make(**kw) -> PKM:
    return PKM(PKMConfig(**{**dict(d_model=D, n_layers=L, n_subkeys=N, heads=H), **kw}))


def full_table(pkm: PKM, x_D: torch.Tensor, h: int) -> torch.Tensor:
    """u^h[i * n + j] = K_a^h[i] . x_a + K_b^h[j] . x_b for every one of the n^2 values."""
    n, half = pkm.cfg.n_subkeys, D // 2
    keys = pkm.subkeys_H2NC[h]
    return torch.stack([
        keys[0, v // n] @ x_D[:half] + keys[1, v % n] @ x_D[half:] for v in range(n * n)
    ])


def brute_pkm(pkm: PKM, x_D: torch.Tensor, k_out: int) -> torch.Tensor:
    """Top-k_out of each head's full table, act over all heads' picks jointly, sum of values."""
    ids, scores = [], []
    for h in range(pkm.cfg.heads):
        u_V = full_table(pkm, x_D, h)
        top = sorted(range(len(u_V)), key=lambda v: -u_V[v].item())[:k_out]
        ids += top
        scores += [u_V[v] for v in top]
    s = torch.stack(scores)
    a = torch.relu(s) if pkm.cfg.activation == "relu" else torch.softmax(s, 0)
    return sum(a[m] * pkm.values_VD[v] for m, v in enumerate(ids))


def brute_dense_pkm(pkm: PKM, x_D: torch.Tensor) -> torch.Tensor:
    """The authors' k >= n path: one score per value, summed over heads, act over all n^2."""
    u_V = sum(full_table(pkm, x_D, h) for h in range(pkm.cfg.heads))
    a_V = torch.relu(u_V) if pkm.cfg.activation == "relu" else torch.softmax(u_V, 0)
    return a_V @ pkm.values_VD


def test_selected_values_are_the_topk_of_the_full_table():
    torch.manual_seed(0)
    pkm = make(k=5)
    x_TD = torch.randn(6, D)
    value_TM, score_TM = pkm.select(*pkm.subkey_scores(x_TD))
    for t in range(6):
        for h in range(H):
            u_V = full_table(pkm, x_TD[t], h).detach()
            want = set(u_V.topk(5).indices.tolist())
            got = value_TM[t, h * 5:(h + 1) * 5]
            assert set(got.tolist()) == want
            torch.testing.assert_close(score_TM[t, h * 5:(h + 1) * 5], u_V[got])


@pytest.mark.parametrize("activation", ["relu", "softmax"])
@pytest.mark.parametrize("k, dense_when_covers, k_out", [
    (4, True, 4),  # the top-k path proper
    (9, False, 9),  # k > n: top-k of each half clamped to n, then top 9 of the 49 sums
    (60, False, 49),  # k > n^2: every value of every head
])
def test_sparse_output_and_key_gradient_match_brute_force(activation, k, dense_when_covers, k_out):
    torch.manual_seed(0)
    pkm = make(k=k, activation=activation, dense_when_k_covers=dense_when_covers)
    assert not pkm.cfg.dense
    x_BTD = torch.randn(2, 3, D)
    y_TD = pkm(x_BTD).reshape(-1, D)
    want_TD = torch.stack([brute_pkm(pkm, x, k_out) for x in x_BTD.reshape(-1, D)])
    torch.testing.assert_close(y_TD, want_TD, rtol=1e-5, atol=1e-6)
    # Keys learn through the recomputed scores, values through the bag: same grads as brute.
    got = torch.autograd.grad(y_TD.square().sum(), [pkm.subkeys_H2NC, pkm.values_VD])
    want = torch.autograd.grad(want_TD.square().sum(), [pkm.subkeys_H2NC, pkm.values_VD])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "softmax"])
def test_dense_path_when_k_covers_the_subkeys(activation):
    torch.manual_seed(0)
    pkm = make(k=N, activation=activation, dense_when_k_covers=True).eval()
    assert pkm.cfg.dense
    x_TD = torch.randn(5, D)
    want_TD = torch.stack([brute_dense_pkm(pkm, x) for x in x_TD])
    torch.testing.assert_close(pkm(x_TD), want_TD, rtol=1e-5, atol=1e-6)


def test_stats_count_nonzero_values_per_token():
    torch.manual_seed(0)
    for k, dense in [(4, False), (N, True)]:
        pkm = make(k=k, dense_when_k_covers=dense).eval()
        pkm.stats.enabled = True
        x_TD = torch.randn(10, D)
        pkm(x_TD)
        n_active = []
        for x in x_TD:
            if dense:  # relu of the head-summed table over all n^2 values
                n_active.append(int((sum(full_table(pkm, x, h) for h in range(H)) > 0).sum()))
            else:  # distinct chosen values with a positive score (heads may share values)
                pos = set()
                for h in range(H):
                    u_V = full_table(pkm, x, h)
                    pos |= {v for v in u_V.topk(k).indices.tolist() if u_V[v] > 0}
                n_active.append(len(pos))
        s = pkm.stats.summary()
        assert s["active_mean"] == pytest.approx(sum(n_active) / 10)
        assert s["width"] == N * N


def test_init_standard_deviations():
    torch.manual_seed(0)
    gain = math.sqrt(2 / 8)
    for value_init, fan in [("default", 128), ("dense", 40**2)]:
        pkm = PKM(PKMConfig(d_model=128, n_layers=8, n_subkeys=40, value_init=value_init))
        assert pkm.subkeys_H2NC.std().item() == pytest.approx(gain / math.sqrt(128), rel=0.03)
        assert pkm.values_VD.std().item() == pytest.approx(gain / math.sqrt(fan), rel=0.03)


def test_parameter_matched_sizes_match_the_dense_baseline():
    # App. sec:hyperparams: 62 sub-keys (WT-S) and 89 (WT-B) match the dense FFN's parameters.
    for d_model, n, d_ff in [(412, 62, 2053), (1024, 89, 4110)]:
        pkm = PKM(PKMConfig(d_model=d_model, n_layers=2, n_subkeys=n))
        n_pkm = sum(p.numel() for p in pkm.parameters())
        n_dense = 2 * d_model * d_ff + d_ff + d_model
        assert abs(n_pkm / n_dense - 1) < 0.01


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="d_model=9 is odd.*even model.d_model"):
        PKMConfig(d_model=9, n_layers=L, n_subkeys=N)
    with pytest.raises(ConfigError, match="ffn.k must be >= 1"):
        PKMConfig(d_model=D, n_layers=L, n_subkeys=N, k=0)
