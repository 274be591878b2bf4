"""Transformer-XL: memory equivalence, causality, relative shift and init (docs/REFERENCE.md)."""
import itertools
import math
import re
import sys

import pytest
import torch

from sigma_moe.models.attention import shifted_view
from sigma_moe.models.ffn.dense import DenseConfig
from sigma_moe.models.ffn.sigma_moe import SigmaMoEConfig
from sigma_moe.models.transformer_xl import TransformerXL, TransformerXLConfig

D, L, V = 36, 3, 50


def make(kind: str, mem_len=8, dropout=0.0) -> TransformerXL:
    ffn = DenseConfig(D, L, 64) if kind == "dense" else SigmaMoEConfig(D, L, 8, 8, 2)
    # 3 heads of 10: heads x head_dim != d_model, like WT-S (10 x 41 with 412)
    cfg = TransformerXLConfig(V, D, L, 3, 10, dropout, mem_len, 2 * mem_len, kind, ffn)
    return TransformerXL(cfg)


@pytest.mark.parametrize("kind", ["dense", "sigma_moe"])
def test_memory_equals_one_pass_over_both_segments(kind):
    torch.manual_seed(0)
    model = make(kind).eval()
    model.cfg = model.cfg.__class__(**{**model.cfg.__dict__, "eval_mem_len": 8})
    tokens = torch.randint(0, V, (2, 16))
    full, _ = model(tokens)
    seg1, mems = model(tokens[:, :8])
    seg2, _ = model(tokens[:, 8:], mems)
    assert all(m.shape == (2, 8, D) and not m.requires_grad for m in mems)
    torch.testing.assert_close(seg2, full[:, 8:], atol=1e-5, rtol=0)
    torch.testing.assert_close(seg1, full[:, :8], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["dense", "sigma_moe"])
def test_future_tokens_never_change_earlier_logits(kind):
    torch.manual_seed(1)
    model = make(kind).eval()
    tokens = torch.randint(0, V, (2, 12))
    mems = model(torch.randint(0, V, (2, 8)))[1]
    base, _ = model(tokens, mems)
    for t in (0, 5, 11):
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 7) % V
        out, _ = model(changed, mems)
        # exact up to float reassociation (MoE rows are batched by expert)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
        assert (out[:, t:] - base[:, t:]).abs().max() > 0  # the change is seen from t on


def test_memory_is_visible_and_bounded():
    torch.manual_seed(2)
    model = make("dense", mem_len=4).train()
    _, mems = model(torch.randint(0, V, (1, 10)))
    assert mems[0].shape[1] == 4  # training keeps mem_len
    model.eval()
    _, mems = model(torch.randint(0, V, (1, 10)))
    assert mems[0].shape[1] == 8  # evaluation keeps eval_mem_len
    tokens = torch.randint(0, V, (1, 3))
    b, _ = model(tokens, [torch.randn_like(m) for m in mems])
    c, _ = model(tokens, mems)
    assert (b - c).abs().max() > 1e-3  # memory content changes the output


@pytest.mark.parametrize("mem_len", [2, 3, 5])
def test_new_memory_is_the_last_mem_len_positions(mem_len):
    """Each layer's new memory: the last mem_len of [old memory ; the layer's input] (the
    old memory is left out when the segment alone is that long)."""
    torch.manual_seed(6)
    model = make("dense", mem_len=mem_len).train()
    _, mems = model(torch.randint(0, V, (2, 4)))
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
             for b in model.blocks]
    _, new = model(torch.randint(0, V, (2, 3)), mems)
    for h in hooks:
        h.remove()
    for old, x, got in zip(mems, inputs, new, strict=True):
        assert torch.equal(got, torch.cat([old, x], 1)[:, -mem_len:])


@pytest.mark.parametrize("T, M, spare", [(3, 2, 1), (4, 0, 1), (1, 3, 1), (3, 2, 6)])
def test_shifted_view_maps_offsets_to_key_positions(T, M, spare):
    """out[b, h, i, j] = bd[h, b, i, j + T - 1 - i] (offset M + i - j) for every visible key,
    read in place from the [H, B, T, P] scores (P = L + spare): no copy, all in bounds."""
    H, B, L = 2, 3, T + M
    bd = torch.arange(H * B * T * (L + spare), dtype=torch.float).view(H, B, T, L + spare)
    out = shifted_view(bd, L)
    assert out.shape == (B, H, T, L) and out.data_ptr() >= bd.data_ptr()
    for b, h, i in itertools.product(range(B), range(H), range(T)):
        for j in range(M + i + 1):
            assert out[b, h, i, j] == bd[h, b, i, j + T - 1 - i]
    with pytest.raises(ValueError, match="contiguous"):
        shifted_view(bd.transpose(0, 1), L)
    with pytest.raises(ValueError, match="P >= L"):
        shifted_view(bd, L + spare)


def test_bd_rows_are_16_byte_aligned():
    from sigma_moe.models.attention import bd_width

    assert [bd_width(L) for L in (1, 7, 8, 1024, 1025)] == [8, 8, 16, 1032, 1032]


def test_zero_pad_appends_zeros_and_copies_nothing_when_there_is_nothing_to_pad():
    from sigma_moe.models.attention import zero_pad

    t = torch.randn(2, 3, 4)
    assert zero_pad(t, 0, dim=1) is t and zero_pad(t, 0) is t  # F.pad would copy
    padded = zero_pad(t, 2, dim=1)
    assert padded.shape == (2, 5, 4) and torch.equal(padded[:, :3], t)
    assert not padded[:, 3:].any()
    assert torch.equal(zero_pad(t, 1, dim=-1)[..., :4], t) and zero_pad(t, 1).shape == (2, 3, 5)


@pytest.mark.parametrize("T, M, P", [(3, 2, 6), (4, 0, 5), (1, 3, 5), (3, 2, 8)])
def test_position_bias_gradient(T, M, P):
    """The bias's backward (the gradient laid back into the unshifted [H, B, T, P]
    layout, zeros outside the window, in the spare columns and on the future keys)
    against finite differences."""
    from sigma_moe.models.attention import _PositionBias

    L = T + M
    future = torch.ones(T, L, dtype=torch.bool).triu(M + 1)
    bd = torch.randn(2, 3, T, P, dtype=torch.float64, requires_grad=True)

    def finite_part(x):  # gradcheck cannot difference through -inf
        return _PositionBias.apply(x, L, False).masked_fill(future, 0.0)

    assert torch.autograd.gradcheck(finite_part, (bd,))
    bias = _PositionBias.apply(bd, L, False)
    assert bias.is_contiguous() and torch.isneginf(bias[:, :, future]).all()


def test_linear_init_std_and_attention_params():
    torch.manual_seed(3)
    cfg = TransformerXLConfig(V, 256, 4, 4, 64, 0.0, 8, 8, "dense", DenseConfig(256, 4, 1024))
    model = TransformerXL(cfg)
    attn = model.blocks[0].attn
    # truncated at 2 sigma, then rescaled: the sample std is exactly the nominal one (a
    # plain cut would give 0.88x), and no value lies beyond ~2.3 std
    for w, fan_in in ((attn.qkv.weight, 256), (model.blocks[0].ffn.w2.weight, 1024)):
        want = math.sqrt(2 / (4 * fan_in))
        assert w.std().item() == pytest.approx(want, rel=1e-5)
        assert w.abs().max().item() <= 2.3 * want
    for lin in (model.blocks[0].ffn.w1, model.blocks[0].ffn.w2):
        assert torch.all(lin.bias == 0)
    assert torch.all(attn.u_HC == 0) and torch.all(attn.v_HC == 0)
    assert attn.scale.item() == pytest.approx(1 / 8)
    assert model.head.bias is not None and model.head.weight is not model.embedding.weight
    # embedding: Xavier-uniform as the authors' code, std sqrt(2 / (vocab + d_model))
    assert model.embedding.weight.std().item() == pytest.approx(
        math.sqrt(2 / (V + 256)), rel=0.03)


def test_relative_attention_matches_a_per_query_loop():
    """score(i, j) = scale [(q_i + u) k_j + (q_i + v) R_{M+i-j}], over memory and the causal
    past only (Transformer-XL Sec. 3.3), with every parameter random (u, v start at 0):
    outputs and gradients."""
    from sigma_moe.models.attention import AttentionConfig, RelativeAttention, sinusoid_encoding

    torch.manual_seed(4)
    H, C, Dm, M, T = 2, 3, 8, 2, 3
    attn = RelativeAttention(AttentionConfig(Dm, H, C, 2))
    with torch.no_grad():
        for p in (attn.u_HC, attn.v_HC):
            p.normal_()
        attn.scale.fill_(0.7)
    h_BTD = torch.randn(2, T, Dm, requires_grad=True)
    mem_BMD = torch.randn(2, M, Dm, requires_grad=True)
    got = attn(h_BTD, mem_BMD)
    Wq, Wk, Wv = attn.qkv.weight.view(3, H, C, Dm)
    want = torch.zeros(2, T, H, C)
    for b in range(2):
        cat_LD = torch.cat([mem_BMD[b], h_BTD[b]])
        for i in range(T):
            for hd in range(H):
                q = Wq[hd] @ h_BTD[b, i]
                js = range(M + i + 1)  # memory and the causal past
                R = attn.pos(sinusoid_encoding(torch.tensor([M + i - j for j in js]), Dm))
                s = torch.stack([(q + attn.u_HC[hd]) @ (Wk[hd] @ cat_LD[j])
                                 + (q + attn.v_HC[hd]) @ R[n].view(H, C)[hd]
                                 for n, j in enumerate(js)])
                p = torch.softmax(attn.scale * s, 0)
                want[b, i, hd] = sum(p[n] * (Wv[hd] @ cat_LD[j]) for n, j in enumerate(js))
    want = attn.out(want.reshape(2, T, H * C))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and the gradients of every input and parameter (the shift's custom backward)
    leaves = [h_BTD, mem_BMD, *attn.parameters()]
    dy = torch.randn_like(got)
    for g, w in zip(torch.autograd.grad(got, leaves, dy), torch.autograd.grad(want, leaves, dy)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("C", [41, 64])
def test_attention_products_see_heads_of_a_multiple_of_8(C, monkeypatch):
    """SDPA's fused kernels need heads of C % 8 == 0 (WT-S's 41 ran the fp32 math kernel on
    an H200) and cuBLAS's aligned ones 16-byte rows: SDPA and bd's product get heads zero-
    padded to 48 (64 stays 64) and bd rows of bd_width(L)."""
    from sigma_moe.models.attention import AttentionConfig, RelativeAttention, bd_width

    B, H, T, M = 2, 3, 8, 5
    attn = RelativeAttention(AttentionConfig(32, H, C, 2))
    seen, sdpa, bmm = [], torch.nn.functional.scaled_dot_product_attention, torch.bmm
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append((q.shape, k.shape, v.shape))
                        or sdpa(q, k, v, **kw))
    monkeypatch.setattr(torch, "bmm", lambda a, b: seen.append((a.shape, b.shape)) or bmm(a, b))
    y = attn(torch.randn(B, T, 32), torch.randn(B, M, 32))
    C8 = 48 if C == 41 else C
    assert seen == [((H, B * T, C8), (H, C8, bd_width(T + M))),
                    ((B, H, T, C8), (B, H, T + M, C8), (B, H, T + M, C8))]
    assert y.shape == (B, T, 32)


def test_position_bias_keeps_no_score_sized_tensor_for_backward(monkeypatch):
    """Outside SDPA (stubbed here), the attention saves nothing of the [B, H, T, L] size for
    its backward: the shift is a view and the scale sits on q (WT-B: 1 GB a layer, and
    the multiply and its gradient were two more passes over it)."""
    from sigma_moe.models.attention import AttentionConfig, RelativeAttention, bd_width

    B, H, T, M = 2, 4, 8, 12
    attn = RelativeAttention(AttentionConfig(64, H, 16, 2))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask, scale: q + v[:, :, :T] + 0 * attn_mask.sum())
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(t.shape) or t,
                                                  lambda t: t):
        attn(torch.randn(B, T, 64), torch.randn(B, M, 64))
    # [T, L] (the mask) is fine; [B, H, T, L] or [H, B, T, P] are not
    score_sized = ((T, T + M), (T, bd_width(T + M)))
    assert shapes and not [s for s in shapes if len(s) > 2 and s[-2:] in score_sized]


def test_relative_attention_under_autocast_stays_in_its_dtype(monkeypatch):
    """Under bf16 autocast every SDPA input is bf16: the fp32 parameters u, v and scale had
    promoted q and the [B, H, T, L] positional bias to fp32 (H200, WT-B: the step's largest
    tensors copied to fp32 and back in every layer); the output stays the fp32 one's within
    bf16 rounding, and the parameters still get gradients."""
    from sigma_moe.models.attention import AttentionConfig, RelativeAttention

    torch.manual_seed(5)
    attn = RelativeAttention(AttentionConfig(64, 4, 16, 2))
    with torch.no_grad():
        for p in (attn.u_HC, attn.v_HC):
            p.normal_()
    h_BTD, mem_BMD = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    want = attn(h_BTD, mem_BMD)
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append((q.dtype, kw["attn_mask"].dtype))
                        or sdpa(q, k, v, **kw))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn(h_BTD, mem_BMD)
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.03)
    got.float().square().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0
               for p in (attn.u_HC, attn.v_HC, attn.scale))


def test_evaluation_is_the_token_weighted_loss_of_one_pass_over_each_stream():
    """LMTask.evaluate: segments with carried memory (covering the whole stream), a shorter
    last segment, and the mean over tokens, not over batches, equal one pass per stream."""
    import numpy as np
    import torch.nn.functional as F

    from sigma_moe.framework.data.base import TokenData
    from sigma_moe.tasks.lm import LMTask, LMTaskConfig

    torch.manual_seed(5)
    model = make("sigma_moe", mem_len=8)
    model.cfg = model.cfg.__class__(**{**model.cfg.__dict__, "eval_mem_len": 64})
    tokens = np.random.default_rng(0).integers(0, V, 2 * 35)  # 2 streams: 34 targets each
    data = TokenData("toy", {"train": tokens, "valid": tokens, "test": tokens}, V, "ppl")
    task = LMTask(LMTaskConfig(batch_size=2, context=8), data, model, torch.device("cpu"))
    got = task.evaluate("valid", batch_size=2, mem_segments=8)
    streams = torch.from_numpy(tokens).view(2, 35)
    model.eval()
    with torch.no_grad():
        logits, _ = model(streams[:, :-1])
        want = F.cross_entropy(logits.flatten(0, 1), streams[:, 1:].flatten())
    assert got["tokens"] == 68 and got["loss"] == pytest.approx(want.item(), rel=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(want.item()), rel=1e-5)
    assert "word_ppl" not in got  # which tokens start a word is not known
    # word level: the summed cross-entropy over the targets that start a word
    word_start = np.arange(V) % 3 == 0
    task.data = TokenData("toy", data.splits, V, "ppl", word_start=word_start)
    got = task.evaluate("valid", batch_size=2, mem_segments=8)
    n_words = int(word_start[streams[:, 1:].numpy()].sum())
    assert got["words"] == n_words and 0 < n_words < 68
    assert got["word_ppl"] == pytest.approx(math.exp(want.item() * 68 / n_words), rel=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(want.item()), rel=1e-5)  # still subword
    # a part of the split: the words of the targets read, not the split's
    part = task.evaluate("valid", batch_size=2, mem_segments=8, max_segments=2)
    n_part = int(word_start[streams[:, 1:17].numpy()].sum())
    assert part["words"] == n_part and part["tokens"] == 32
    assert part["word_ppl"] == pytest.approx(math.exp(part["loss"] * 32 / n_part), rel=1e-5)
    task.data = TokenData("toy", data.splits, V, "bpc", word_start=word_start)
    assert "word_ppl" not in task.evaluate("valid", batch_size=2, mem_segments=8)


def test_splits_shorter_than_one_segment_per_stream_are_refused_before_training():
    """A short train split trained on short wrapped segments without a word; a short valid
    or test split failed only at its evaluation, after the steps were trained."""
    import numpy as np

    from sigma_moe.framework.data.base import DataError, TokenData
    from sigma_moe.tasks.lm import LMTaskConfig, check_split_sizes

    cfg = LMTaskConfig(batch_size=4, context=8, eval_batch_size=2)
    ok = np.zeros(4 * 9, dtype=np.int64)
    check_split_sizes(TokenData("toy", {"train": ok, "valid": ok, "test": ok}, V, "ppl"), cfg)
    for split, n, key in (("train", 4 * 9 - 1, "task.batch_size=4"),
                          ("test", 2 * 9 - 1, "task.eval_batch_size=2")):
        splits = {"train": ok, "valid": ok, "test": ok, split: np.zeros(n, dtype=np.int64)}
        with pytest.raises(DataError, match=rf"^dataset 'toy': its {split} split has {n} tokens, "
                                            rf"fewer than {key} streams x \(task.context=8 \+ 1\)"):
            check_split_sizes(TokenData("toy", splits, V, "ppl"), cfg)
    with pytest.raises(DataError, match="has no split 'valid'"):
        check_split_sizes(TokenData("toy", {"train": ok, "test": ok}, V, "ppl"), cfg)


def test_a_run_records_its_data_and_is_warned_before_reading_a_one_pass_corpus_twice():
    """results.json names the data (tokens, passes, origin); C4/peS2o, which the paper reads
    once, warn when `trainer.steps` was raised without the training tokens to match."""
    import numpy as np

    from sigma_moe.framework.data.base import StreamBatcher, TokenData, train_tokens_for
    from sigma_moe.tasks.lm import LMTaskConfig, describe_data

    cfg = LMTaskConfig(batch_size=4, context=8)
    train = np.zeros(train_tokens_for(10, 4, 8), dtype=np.int64)  # exactly 10 steps
    assert StreamBatcher(train, 4, 8).steps_per_epoch == 10
    origin = {"cache_entry": "/c/x", "sha256": {"train": "ab"}}
    data = TokenData("c4", {"train": train, "valid": train[:50], "test": train[:40]}, V, "ppl",
                     origin, one_pass_key="dataset.train_tokens")
    record, warning = describe_data(data, cfg, 10)
    assert warning is None and record == {"name": "c4", "train_epochs": 1.0, **origin,
                                           "tokens": {"train": 4 * 81, "valid": 50, "test": 40}}
    record, warning = describe_data(data, cfg, 25)
    assert record["train_epochs"] == 2.5
    assert warning == (f"dataset 'c4': 25 steps read its 324-token train split 2.50 times, where "
                       f"the paper reads it once; dataset.train_tokens={4 * (25 * 8 + 1)} trains "
                       f"on fresh text throughout")
    repeated = TokenData("wt103", data.splits, V, "ppl")  # epochs are the norm there
    assert describe_data(repeated, cfg, 25)[1] is None


def toy_task(model: TransformerXL, n_tokens: int = 2 * 13, batch_size: int = 2, context: int = 4):
    """An LMTask over random tokens (the same text in every split)."""
    import numpy as np

    from sigma_moe.framework.data.base import TokenData
    from sigma_moe.tasks.lm import LMTask, LMTaskConfig

    tokens = np.random.default_rng(0).integers(0, V, n_tokens)
    data = TokenData("toy", {"train": tokens, "valid": tokens, "test": tokens}, V, "ppl")
    return LMTask(LMTaskConfig(batch_size=batch_size, context=context), data, model,
                  torch.device("cpu"))


def test_training_loss_is_cross_entropy_plus_each_layers_regularizer():
    """L = CE + sum over layers of gamma * L_reg(x_l W3_l^T) (docs/REFERENCE.md: summed over
    layers, on each layer's own input)."""
    from sigma_moe.models.ffn.base import entropy_regularizer

    torch.manual_seed(0)
    ffn = SigmaMoEConfig(D, L, 8, 8, 2, reg_gamma=0.5)
    model = TransformerXL(TransformerXLConfig(V, D, L, 3, 10, 0.0, 8, 8, "sigma_moe", ffn))
    inputs = []
    for block in model.blocks:
        block.ffn.register_forward_pre_hook(lambda m, a: inputs.append(a[0].reshape(-1, D)))
    loss, m = next(toy_task(model).train_losses(1))
    reg = sum(0.5 * entropy_regularizer(x_TD @ block.ffn.w3_ED.T)
              for x_TD, block in zip(inputs, model.blocks))
    torch.testing.assert_close(m["reg"], reg.detach())
    torch.testing.assert_close(loss, m["ce"] + reg)


def test_the_task_precompiles_each_expert_layer_shape_at_its_micro_batch(monkeypatch):
    """LMTask.precompile (the trainer calls it on CUDA before the first step): one
    kernels.precompile_moe a distinct expert-layer shape, at the tokens of one micro-batch
    of this process; a dense model has nothing to compile."""
    from sigma_moe import kernels

    calls = []
    monkeypatch.setattr(kernels, "precompile_moe",
                        lambda *args, **kw: calls.append((args, kw)) or "compiled")
    task = toy_task(make("sigma_moe"), n_tokens=4 * 13, batch_size=4, context=4)
    assert task.precompile(2, torch.bfloat16) == ["compiled"]  # 3 layers, one shape
    assert calls == [((4 // 2 * 4, D, 8, 8, 2, 0.0, "auto"),
                      {"device": torch.device("cpu"), "dtype": torch.bfloat16,
                       "n_chunks": None})]
    assert toy_task(make("dense")).precompile(1, torch.float32) == []
    monkeypatch.setattr(kernels, "precompile_moe", lambda *args, **kw: None)  # nothing to do
    assert task.precompile(2, torch.bfloat16) == []


def test_training_memory_starts_empty_at_each_epoch():
    """Transformer-XL's memory carries over between the segments of one pass over the
    streams; a new epoch restarts the streams at their beginnings, so it starts empty."""
    model = make("dense")
    task = toy_task(model)
    empty = []
    model.register_forward_pre_hook(lambda m, a: empty.append(a[1] is None))
    n = task.batcher.steps_per_epoch
    assert n > 1
    for _ in range(2 * n):
        list(task.train_losses(1))
    assert empty == ([True] + [False] * (n - 1)) * 2


def test_dropout_is_applied_where_the_authors_apply_it(monkeypatch):
    """p on the embedding, on each block's attention and FFN outputs (before the residual
    sums) and on the final LayerNorm's output: checked by the tensors dropout receives."""
    model = make("dense", dropout=0.3).train()
    expected = []
    for module in (model.embedding, *[m for b in model.blocks for m in (b.attn, b.ffn)],
                   model.ln_f):
        module.register_forward_hook(lambda m, a, out: expected.append(out))
    dropped = []
    dropout = torch.nn.functional.dropout

    def recording(x, p=0.5, training=True, inplace=False):
        dropped.append((x, p, training))
        return dropout(x, p, training, inplace)

    monkeypatch.setattr(torch.nn.functional, "dropout", recording)
    model(torch.randint(0, V, (2, 5)))
    assert len(expected) == 2 + 2 * L
    for out in expected:
        assert any(x is out and p == 0.3 and training for x, p, training in dropped)


def test_an_evaluation_into_a_log_file_says_how_far_it_got(monkeypatch, capsys):
    """No progress bar in a log file (Slurm, nohup), but a line now and then: the final
    evaluation of the main job takes minutes."""
    from sigma_moe.tasks import lm

    monkeypatch.setattr(lm, "EVAL_LINE_S", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    task = toy_task(make("dense"), n_tokens=2 * 25)
    task.evaluate("valid", batch_size=2, mem_segments=2, progress=True)
    lines = capsys.readouterr().err.splitlines()  # the time left depends on the load
    assert [re.sub(r"\| \d\d:\d\d left$", "| MM:SS left", line) for line in lines] == [
        f"eval valid: segment {i}/6 | MM:SS left" for i in range(1, 6)]
    task.evaluate("valid", batch_size=2, mem_segments=2)  # progress=False: nothing
    assert capsys.readouterr().err == ""


def test_memory_keeps_the_newest_layer_inputs():
    """Layer l's memory is its input over the last eval_mem_len tokens read, not the first
    (with two segments it is never longer than the memory, so both look the same)."""
    torch.manual_seed(0)
    model = make("dense", mem_len=8).eval()
    model.cfg = model.cfg.__class__(**{**model.cfg.__dict__, "eval_mem_len": 16})
    tokens_BT = torch.randint(0, V, (2, 24))
    mems = None
    with torch.no_grad():
        for s in range(3):
            _, mems = model(tokens_BT[:, 8 * s: 8 * s + 8], mems)
        torch.testing.assert_close(mems[0], model.embedding(tokens_BT[:, 8:24]))


def test_micro_batches_read_their_own_rows_of_the_memory():
    """With grad_accum, micro-batch i continues streams i*m..(i+1)*m-1: the memory rows of
    those streams. The second step (the first with memory) gives the same losses either way."""
    losses = []
    for n_micro in (1, 2):
        torch.manual_seed(3)
        task = toy_task(make("dense", mem_len=8).eval(), n_tokens=4 * 40, batch_size=4,
                        context=8)  # eval: no dropout, the same numbers either way
        with torch.no_grad():
            for _ in range(2):
                ces = [m["ce"] for _, m in task.train_losses(n_micro)]
        losses.append(torch.stack(ces).mean())
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)


def test_evaluate_keeps_the_memory_segments_it_is_asked_for():
    """evaluate(mem_segments=1) keeps one segment of memory whatever the model could keep."""
    losses = []
    for eval_mem_len in (64, 8):
        torch.manual_seed(5)
        model = make("dense", mem_len=8)
        model.cfg = model.cfg.__class__(**{**model.cfg.__dict__, "eval_mem_len": eval_mem_len})
        task = toy_task(model, n_tokens=2 * 49, context=8)
        losses.append(task.evaluate("valid", batch_size=2, mem_segments=1)["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
