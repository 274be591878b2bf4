"""The model and the LM task against closed forms where a shared oracle cannot tell: the
sinusoid frequencies, evaluation with dropout configured, the training cross-entropy, the
metrics and the tokens a step counts (gaps found by mutation testing:
each test here failed on a mutant the rest of the suite let through)."""
import math

import numpy as np
import pytest
import torch

from tests.test_model import V, make, toy_task


def test_sinusoid_frequencies_are_transformer_xl():
    """1 / 10000^(2i/d) for i < d/2 (the attention tests call the same function)."""
    from sigma_moe.models.attention import sinusoid_encoding

    d, pos = 8, 3.0
    angles = [pos / 10000 ** (2 * i / d) for i in range(d // 2)]
    want = torch.tensor([math.sin(a) for a in angles] + [math.cos(a) for a in angles])
    torch.testing.assert_close(sinusoid_encoding(torch.tensor([pos]), d)[0], want)


def test_evaluation_ignores_dropout():
    model = make("dense", dropout=0.3).eval()
    tokens = torch.randint(0, V, (2, 5))
    assert torch.equal(model(tokens)[0], model(tokens)[0])


def test_training_ce_is_plain_cross_entropy_of_the_logits():
    torch.manual_seed(0)
    model = make("dense").train()  # dropout 0: the same logits twice
    task = toy_task(model)
    x, y, _ = task.batcher.next()
    task.batcher.load_state_dict({"epoch": 0, "step_in_epoch": 0})  # the same batch again
    logits, _ = model(x)
    _, m = next(task.train_losses(1))
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    torch.testing.assert_close(m["ce"], want.detach())


def test_metrics_are_exp_and_bits_of_the_ce():
    task = toy_task(make("dense"))
    assert task.metric(10.0)["ppl"] == pytest.approx(math.exp(10.0))
    assert task.metric(60.0)["ppl"] == pytest.approx(math.exp(50.0))  # the overflow guard
    task.data.metric = "bpc"
    assert task.metric(10.0)["bpc"] == pytest.approx(10.0 / math.log(2))


def test_tokens_per_step_is_the_global_batch():
    """batch_size is the global batch (each of world_size ranks takes its share)."""
    from sigma_moe.framework.data.base import TokenData
    from sigma_moe.tasks.lm import LMTask, LMTaskConfig

    tokens = np.zeros(4 * 40, dtype=np.int64)
    data = TokenData("toy", {"train": tokens, "valid": tokens, "test": tokens}, V, "ppl")
    task = LMTask(LMTaskConfig(batch_size=4, context=4), data, make("dense"),
                  torch.device("cpu"), rank=0, world_size=2)
    assert task.tokens_per_step == 4 * 4
