"""coevo episodes as TRL rollout_func rows: one row per trace whose calls chain, only sampled
tokens masked in, with the sampler's log-probs; a call that does not chain ends the row."""

from __future__ import annotations

import pytest

from coevo.agent.trace import ModelCall, Trace
from coevo.trainers.trl_rollout import coevo_reward_func, trace_row


def call(prompt: list[int], completion: list[int], *, trainable: bool = True) -> ModelCall:
    return ModelCall(step=0, messages=[], prompt_ids=prompt, completion_ids=completion,
                     sampler_logprobs=[-0.1 * t for t in completion], text="", finish_reason="stop",
                     trainable=trainable)


def trace(*calls: ModelCall, trainable: bool = True) -> Trace:
    return Trace(trace_id="t", task_id="a", env="e", split="train", harness_id="h", variant="base",
                 model_version="0", model_calls=list(calls), trainable=trainable)


def test_a_tool_path_trace_is_one_row_with_the_tool_result_masked_out():
    # call 0: prompt 1 2 3 (3 = a prefilled reply prefix), samples 4 5; the runtime appends 6 7 (the
    # template and the tool result); call 1 samples 8 9
    row = trace_row(trace(call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 5, 6, 7], [8, 9])))
    assert row["prompt_ids"] == [1, 2, 3]
    assert row["completion_ids"] == [4, 5, 6, 7, 8, 9]
    assert row["env_mask"] == [1, 1, 0, 0, 1, 1]
    assert row["logprobs"] == pytest.approx([-0.4, -0.5, 0.0, 0.0, -0.8, -0.9])


def test_calls_coevo_does_not_train_are_masked_out():
    row = trace_row(trace(call([1], [2]), call([1, 2, 3], [4], trainable=False)))
    assert row["env_mask"] == [1, 0, 0]
    # a truncated or crashed episode keeps its row (its reward counts in the group) but trains nothing
    assert trace_row(trace(call([1], [2]), call([1, 2, 3], [4]), trainable=False))["env_mask"] == [0, 0, 0]


def test_a_call_that_does_not_extend_the_row_ends_it():
    # call 1 re-tokenised call 0's reply (3 -> 9): the row keeps call 0 and says it left 2 calls out
    row = trace_row(trace(call([1, 2], [3]), call([1, 2, 9, 5], [4]), call([1, 2, 9, 5, 4], [6])))
    assert row["completion_ids"] == [3] and row["env_mask"] == [1] and row["calls_dropped"] == 2
    assert trace_row(trace(call([1], [2]), call([1, 2, 3], [4])))["calls_dropped"] == 0


def test_what_cannot_be_one_row_is_refused():
    with pytest.raises(ValueError, match="no model call"):
        trace_row(trace())
    no_logprobs = call([1], [2])
    no_logprobs.sampler_logprobs = None
    with pytest.raises(ValueError, match="sampler log-probs"):
        trace_row(trace(no_logprobs))


def test_reward_func_returns_the_episode_rewards():
    assert coevo_reward_func(["a", "b"], ["x", "y"], coevo_reward=[1, 0.25]) == [1.0, 0.25]
    with pytest.raises(ValueError, match="2 episode rewards for 1"):
        coevo_reward_func(["a"], ["x"], coevo_reward=[1, 0])
