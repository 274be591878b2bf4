"""Dense baseline and top-K activation against their equations, token by token."""
from __future__ import annotations

import pytest
import torch

from sigma_moe.framework.config import ConfigError
from sigma_moe.models.ffn.dense import DenseConfig, DenseFFN
from sigma_moe.models.ffn.topk import TopKConfig, TopKFFN

D, F_, L = 12, 40, 4


def brute_dense(ffn: DenseFFN, x_TD: torch.Tensor, k: int | None) -> torch.Tensor:
    """y = W2 u + b2, u = relu(W1 x + b1) with all but its k largest entries zeroed."""
    rows = []
    for x_D in x_TD.detach():
        u_F = torch.relu(ffn.w1.weight @ x_D + ffn.w1.bias)
        if k is not None:
            order = sorted(range(F_), key=lambda i: -u_F[i].item())
            mask = torch.zeros(F_, dtype=torch.bool)
            mask[order[:k]] = True
            u_F = u_F * mask
        rows.append(ffn.w2.weight @ u_F + ffn.w2.bias)
    return torch.stack(rows)


@pytest.mark.parametrize("k", [None, 1, 7])
def test_matches_brute_force(k):
    torch.manual_seed(0)
    cfg = dict(d_model=D, n_layers=L, d_ff=F_, dropout=0.3)
    ffn = (DenseFFN(DenseConfig(**cfg)) if k is None else TopKFFN(TopKConfig(**cfg, k=k))).eval()
    x_BTD = torch.randn(2, 5, D)
    y = ffn(x_BTD).reshape(-1, D)
    torch.testing.assert_close(y, brute_dense(ffn, x_BTD.reshape(-1, D), k), rtol=1e-5, atol=1e-5)


def test_dense_dropout_is_on_the_hidden_layer():
    """y = W2 dropout(u) + b2 (docs/REFERENCE.md, "Dropout"), not dropout(W2 u + b2)."""
    ffn = DenseFFN(DenseConfig(d_model=D, n_layers=L, d_ff=F_, dropout=0.5)).train()
    x_TD = torch.randn(5, D)
    torch.manual_seed(3)
    y_TD = ffn(x_TD)
    torch.manual_seed(3)  # the same mask
    u_TF = torch.nn.functional.dropout(torch.relu(ffn.w1(x_TD)), 0.5, True)
    torch.testing.assert_close(y_TD, ffn.w2(u_TF))


def test_topk_counts_exactly_k_active_in_eval_and_training():
    torch.manual_seed(0)
    ffn = TopKFFN(TopKConfig(d_model=D, n_layers=L, d_ff=F_, dropout=0.5, k=5))
    x_TD = torch.randn(64, D)
    with torch.no_grad():
        ffn.w1.bias += 10  # every unit positive: ~F/2 survive dropout, far more than K
    ffn.eval()
    ffn.stats.enabled = True
    ffn(x_TD)
    assert ffn.stats.summary()["active_mean"] == 5.0
    assert ffn.stats.summary()["width"] == F_
    # Dropout happens before the choice, so K units survive in training too.
    ffn.train()
    assert ((ffn.hidden(x_TD) != 0).sum(-1) == 5).all()


def test_topk_applies_dropout_once():
    ffn = TopKFFN(TopKConfig(d_model=8, n_layers=2, d_ff=32, dropout=0.5, k=5)).train()
    x = torch.randn(20, 8)
    torch.manual_seed(0)
    y = ffn(x)
    torch.manual_seed(0)  # the same mask: hidden() draws it, nothing after it does
    torch.testing.assert_close(y, ffn.w2(ffn.hidden(x)))


def test_topk_gradient_only_through_kept_units():
    torch.manual_seed(0)
    ffn = TopKFFN(TopKConfig(d_model=D, n_layers=L, d_ff=F_, k=3)).eval()
    x_TD = torch.randn(1, D)
    ffn(x_TD).sum().backward()
    kept = ffn.hidden(x_TD)[0] != 0
    assert (ffn.w1.weight.grad.abs().sum(-1) != 0).tolist() == kept.tolist()


def test_dense_stats_count_positive_units():
    torch.manual_seed(0)
    ffn = DenseFFN(DenseConfig(d_model=D, n_layers=L, d_ff=F_)).eval()
    x_TD = torch.randn(32, D)
    ffn.stats.enabled = True
    ffn(x_TD)
    expected = (torch.relu(ffn.w1(x_TD)) > 0).sum(-1).double()
    assert ffn.stats.summary()["active_mean"] == pytest.approx(float(expected.mean()))
    assert ffn.stats.summary()["active_std"] == pytest.approx(float(expected.std(correction=0)))


def test_topk_k_too_large_is_one_line_config_error():
    with pytest.raises(ConfigError, match=r"ffn.k=41 .* ffn.d_ff=40") as e:
        TopKConfig(d_model=D, n_layers=L, d_ff=F_, k=41)
    assert "\n" not in str(e.value)
