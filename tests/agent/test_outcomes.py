"""Per-task outcomes of traces and pass@1 / pass@k over them (``coevo.agent.outcomes``): hand-computed
cases, infrastructure failures in each of their three treatments, and agreement with the formulas
the callers used before they shared these functions."""

from __future__ import annotations

import itertools
import random
from math import comb

import pytest

from coevo.agent.outcomes import pass_at_1, pass_at_k, pass_rates, task_outcomes, task_pass_at_k
from coevo.agent.trace import Trace

_ids = itertools.count()


def trace(task_id: str, passed: bool, error_source: str | None = None) -> Trace:
    t = Trace(f"tr{next(_ids)}", task_id, "fake", "val", "h", "base", "m", passed=passed, error_source=error_source)
    if error_source is not None:
        t.error, t.passed = f"{error_source}: boom", False  # what the runtime records for a crashed episode
    return t


def test_pass_rates_hand_computed():
    outcomes = {"a": [True, False, False], "b": [False, False, False], "c": [True, True, True],
                "d": [False, True, False]}
    assert pass_at_1(outcomes) == pytest.approx((1 / 3 + 0 + 1 + 1 / 3) / 4)  # 5/12
    assert pass_at_k(outcomes) == 3 / 4  # a, c and d have a passing attempt
    assert pass_rates(outcomes) == (pass_at_1(outcomes), pass_at_k(outcomes))
    one = {"a": [True], "b": [False], "c": [False]}  # k = 1: pass@1 and pass@k coincide
    assert pass_rates(one) == (1 / 3, 1 / 3)
    assert pass_rates({}) == (0.0, 0.0)
    assert pass_rates({"a": [True, True]}) == (1.0, 1.0) and pass_rates({"a": [False]}) == (0.0, 0.0)


def test_pass_at_k_is_the_unbiased_estimator_when_every_task_has_exactly_k_attempts():
    """1 - C(n - c, k) / C(n, k) with n = k is 1 when any attempt passed, else 0."""
    rng = random.Random(0)
    for k in (1, 2, 3, 5):
        outcomes = {f"t{i}": [rng.random() < 0.3 for _ in range(k)] for i in range(20)}
        unbiased = sum(1 - comb(k - sum(o), k) / comb(k, k) for o in outcomes.values()) / len(outcomes)
        assert pass_at_k(outcomes) == pytest.approx(unbiased)


def test_rates_equal_the_formulas_the_callers_used_bit_for_bit():
    rng = random.Random(1)
    for _ in range(200):
        k = rng.randint(1, 6)
        outcomes = {f"t{i}": [rng.random() < 0.4 for _ in range(k)] for i in range(rng.randint(1, 30))}
        n = len(outcomes)
        assert pass_at_1(outcomes) == sum(sum(v) / len(v) for v in outcomes.values()) / n
        assert pass_at_k(outcomes) == sum(any(v) for v in outcomes.values()) / n


def test_a_task_without_attempts_is_an_error_not_a_failure():
    for fn in (pass_at_1, pass_at_k, task_pass_at_k):
        with pytest.raises(ValueError, match="'d'"):
            fn({"a": [True], "d": []})


def test_task_pass_at_k():
    assert task_pass_at_k({"a": [False, True], "b": [False, False], "c": [True]}) == {"a": True, "b": False,
                                                                                      "c": True}


def test_task_outcomes_group_by_task_in_trace_order():
    traces = [trace("b", False), trace("a", True), trace("b", True), trace("a", False)]
    out = task_outcomes(traces)
    assert out == {"b": [False, True], "a": [True, False]} and list(out) == ["b", "a"]  # order of first trace
    named = task_outcomes(traces, ["a", "b", "c"])
    assert named == {"a": [True, False], "b": [False, True], "c": []} and list(named) == ["a", "b", "c"]
    with pytest.raises(KeyError, match="'b'"):
        task_outcomes(traces, ["a"])
    with pytest.raises(ValueError, match="infra must be one of"):
        task_outcomes(traces, infra="skip")
    assert task_outcomes([]) == {}


def test_infrastructure_failures_fail_become_none_or_drop():
    """A crashed policy, environment or tool is an infrastructure failure; a processor's crash is
    the harness's own and counts as a failure in every mode."""
    traces = [trace("a", True), trace("a", False, "env"), trace("b", False, "policy"), trace("b", False, "tool"),
              trace("c", False, "processor"), trace("c", True)]
    assert task_outcomes(traces) == {"a": [True, False], "b": [False, False], "c": [False, True]}
    assert task_outcomes(traces, infra="none") == {"a": [True, None], "b": [None, None], "c": [False, True]}
    assert task_outcomes(traces, infra="drop") == {"a": [True], "c": [False, True]}  # b has no judged attempt
    assert task_outcomes(traces, ["a", "b", "c"], infra="drop") == {"a": [True], "b": [], "c": [False, True]}
    # an evaluation counts them as failed attempts
    assert pass_rates(task_outcomes(traces)) == ((0.5 + 0 + 0.5) / 3, 2 / 3)
    assert pass_rates(task_outcomes(traces, infra="drop")) == ((1 + 0.5) / 2, 1.0)
