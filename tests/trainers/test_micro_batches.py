"""Micro-batches by rows and by padded tokens: the budget holds, every process gets as many, and
the step's gradient does not depend on how the rows were split."""

from __future__ import annotations

import pytest
import torch

from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.batch import TrainSequence, micro_batches, row_length
from tests.trainers.helpers import make_trainer, synthetic_traces


def seq(prompt: int, completion: int) -> TrainSequence:
    return TrainSequence(0, [1] * prompt, [2] * completion, [0.0] * completion, None, 1.0, 1.0)


def test_the_token_budget_bounds_rows_times_the_longest():
    rows = [seq(3, 2), seq(3, 2), seq(10, 10), seq(2, 2), seq(2, 2), seq(2, 2), seq(40, 5)]
    (micro,) = micro_batches(rows, world=1, size=8, tokens=24)
    assert [len(mb) for mb in micro] == [2, 1, 3, 1]  # 2x5; 20 alone (a third would pad to 3x20); 3x4; 45 alone
    assert all(len(mb) == 1 or len(mb) * max(map(row_length, mb)) <= 24 for mb in micro)
    assert [r for mb in micro for r in mb] == rows  # order kept: prompt-sharing rows stay side by side
    assert [len(mb) for mb in micro_batches(rows, world=1, size=2)[0]] == [2, 2, 2, 1]  # rows only


def test_every_process_gets_as_many_micro_batches():
    rows = [seq(30, 2), seq(1, 1), seq(30, 2), seq(1, 1), seq(30, 2)]
    per_process = micro_batches(rows, world=2, size=4, tokens=40)
    assert [len(p) for p in per_process] == [3, 3]  # rank 0 holds three wide rows, one per micro-batch
    assert per_process[1][1:] == [[], []] and per_process[1][0] == rows[1::2]


@pytest.mark.parametrize("budget", [60, 30, 1])
def test_the_step_does_not_depend_on_the_split(budget):
    """The same traces stepped in one forward, by a token budget, and one row at a time (a budget
    smaller than any row) move the weights identically (fp32 tolerance)."""
    tok = tiny_tokenizer()
    traces = synthetic_traces(tiny_model(tok, seed=0), tok)
    after = {}
    for name, hyper in (("whole", {"micro_batch_size": 64}),
                        ("split", {"micro_batch_size": 64, "micro_batch_tokens": budget})):
        model = tiny_model(tok, seed=0)
        make_trainer(model, tok, lr=1e-3, optimizer="sgd", **hyper).step(traces)
        after[name] = dict(model.named_parameters())
    assert after["whole"]
    for key, value in after["whole"].items():
        assert torch.allclose(value, after["split"][key], atol=1e-6), key


def test_a_budget_below_one_is_refused():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1"):
        make_trainer(tiny_model(tok, seed=0), tok, micro_batch_tokens=0)
