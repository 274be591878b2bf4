"""StreamBatcher: targets, epochs, ranks and evaluation coverage
(sigma_moe/framework/data/base.py)."""
import numpy as np
import pytest
import torch

from sigma_moe.framework.data.base import StreamBatcher, train_tokens_for


def test_targets_are_the_next_tokens_and_segments_follow_each_other():
    tokens = np.arange(2 * 21)  # 2 streams of 21: stream 1 starts at 21
    b = StreamBatcher(tokens, batch_size=2, seq_len=4)
    x1, y1, start1 = b.next()
    x2, _, start2 = b.next()
    assert start1 and not start2
    assert x1.tolist() == [[0, 1, 2, 3], [21, 22, 23, 24]]
    assert torch.equal(y1, x1 + 1) and torch.equal(x2, x1 + 4)


@pytest.mark.parametrize("steps,batch,ctx", [(10, 4, 8), (7, 3, 5)])
def test_train_tokens_for_is_one_pass_without_wrapping(steps, batch, ctx):
    b = StreamBatcher(np.arange(train_tokens_for(steps, batch, ctx)), batch, ctx)
    starts = [b.next()[2] for _ in range(steps + 1)]
    assert starts == [True] + [False] * (steps - 1) + [True]  # the wrap comes only after
    # one token fewer per stream and the last step would already wrap
    short = StreamBatcher(np.arange(train_tokens_for(steps, batch, ctx) - batch), batch, ctx)
    assert [short.next()[2] for _ in range(steps)][-1]


def test_ranks_read_disjoint_streams_whose_union_is_the_batch():
    tokens = np.arange(4 * 33)
    whole = StreamBatcher(tokens, 4, 8).next()[0]
    parts = [StreamBatcher(tokens, 4, 8, rank=r, world_size=2).next()[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), whole)


def test_evaluation_scores_every_target_once():
    tokens = np.arange(3 * 30)
    b = StreamBatcher(tokens, 3, 8)
    targets = torch.cat([y for _, y in b.segments()], dim=1)
    assert targets.tolist() == [list(range(s * 30 + 1, (s + 1) * 30)) for s in range(3)]


def test_resume_continues_the_same_order():
    tokens = np.arange(2 * 41)
    a = StreamBatcher(tokens, 2, 4)
    for _ in range(6):
        a.next()
    b = StreamBatcher(tokens, 2, 4)
    b.load_state_dict(a.state_dict())
    for _ in range(8):  # across the epoch boundary
        xa, _, sa = a.next()
        xb, _, sb = b.next()
        assert torch.equal(xa, xb) and sa == sb


# -- from mutation testing (round 4): evaluation coverage and too-short streams ----------
@pytest.mark.parametrize("stream_len", [9, 17, 26, 33])
def test_evaluation_scores_every_target_once_whatever_the_stream_length(stream_len):
    """Mutant `range(0, stream_len - 1, ...)` -> `stream_len - 2`: when one target is left
    after the full segments (26 = 3 x 8 + 1 + 1), the last segment was dropped."""
    b = StreamBatcher(np.arange(2 * stream_len), 2, 8)
    targets = torch.cat([y for _, y in b.segments()], dim=1)
    assert targets.tolist() == [list(range(s * stream_len + 1, (s + 1) * stream_len))
                                for s in range(2)]


def test_a_stream_of_one_token_is_refused():
    """Mutant `stream_len < 2` -> `< 1`: a stream of one token has no target; training read
    empty segments and evaluation scored nothing (a loss of 0/0)."""
    from sigma_moe.framework.data.base import DataError

    with pytest.raises(DataError, match="^3 tokens are too few for 2 streams$"):
        StreamBatcher(np.arange(3), batch_size=2, seq_len=4)
    x, y, _ = StreamBatcher(np.arange(4), batch_size=2, seq_len=4).next()
    assert x.tolist() == [[0], [2]] and y.tolist() == [[1], [3]]
