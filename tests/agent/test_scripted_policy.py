"""ScriptedPolicy: its budget counts UTF-8 bytes, and a cut reply is never silent."""

import logging

from coevo.agent import ScriptedPolicy
from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams


def test_a_cut_scripted_reply_is_logged_once_and_marked_length(caplog):
    policy = ScriptedPolicy(lambda m: "é" * 40 + " done")  # 85 bytes, 45 characters
    req = ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=50))
    with caplog.at_level(logging.WARNING, logger="coevo.agent.policy"):
        first, second = policy.generate([req, req])
    assert first.finish_reason == second.finish_reason == "length"
    assert len(first.completion_ids) == 50 and first.text == "é" * 25  # bytes, not characters
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and policy.cuts == 2
    assert "max_new_tokens=50" in warnings[0] and "85 bytes" in warnings[0]
    assert "sampling.max_new_tokens" in warnings[0] and "--max-new-tokens" in warnings[0]


def test_a_reply_within_the_budget_is_not_logged(caplog):
    policy = ScriptedPolicy(lambda m: "<answer>4</answer>")
    with caplog.at_level(logging.WARNING, logger="coevo.agent.policy"):
        gen = policy.generate([ChatRequest([{"role": "user", "content": "2+2"}])])[0]
    assert gen.finish_reason == "stop" and not caplog.records and policy.cuts == 0
