"""The Digester on real episodes: each failure cause produced on purpose by a scripted policy on the
arithmetic env with the base harness, classified with and without reference trajectories."""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass

import pytest

from coevo.agent import Job, ScriptedPolicy, run_episodes
from coevo.agent.trace import Trace
from coevo.envs.arithmetic import ArithmeticEnv, ArithmeticSession, calculator_solver
from coevo.evolution.digest import EXCERPT_CHARS, classify, cluster_failures, digest
from coevo.evolution.reference import gold_reference
from coevo.evolution.steps import first_divergence, normalise_arguments, trace_steps
from coevo.evolution.types import CAUSES, IMPLICATED, Failure
from coevo.harness.defaults import base_harness
from coevo.rundir.evolve_records import Cluster

WRONG = 123456789  # no task's answer: expressions of up to four terms below 100 stay far smaller


def tool(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def expression(messages: list[dict]) -> str:
    task = next(m["content"] for m in messages if m["role"] == "user")
    return re.search(r"What is ([-\d+*/() .]+)\?", task).group(1).strip()


def tool_results(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def respond(mode: str, messages: list[dict]) -> str:
    """One scripted behaviour per failure cause (and "solve" for passing traces)."""
    expr, results = expression(messages), tool_results(messages)
    if mode == "solve":
        return calculator_solver(messages)
    if mode == "garbage":
        return "I am not sure what to do here."
    if mode == "wrong_tool":
        return tool("abacus", {"expression": expr}) if not results else "<answer>0</answer>"
    if mode == "loop":
        return tool("calculator", {"expression": expr})
    if mode == "wrong":
        return tool("calculator", {"expression": expr}) if not results else f"<answer>{int(results[0]) + 1}</answer>"
    if mode == "premature":
        return f"<answer>{WRONG}</answer>"
    if mode == "overflow":
        return "Let me think about this very carefully. " * 20
    if mode == "bad_args":
        return tool("calculator", {"expression": expr + " + banana"}) if not results else "<answer>0</answer>"
    if mode == "step_budget":
        return tool("calculator", {"expression": f"{len(results)} + 1"})
    if mode in ("crash", "hang"):
        return tool("calculator", {"expression": expr}) if not results else f"<answer>{WRONG}</answer>"
    raise AssertionError(mode)


class CrashingSession(ArithmeticSession):
    def call_tool(self, name, arguments):
        raise RuntimeError("calculator backend down")


class HangingSession(ArithmeticSession):
    def call_tool(self, name, arguments):
        time.sleep(1.0)
        return super().call_tool(name, arguments)


class FaultyArithmetic(ArithmeticEnv):
    """The arithmetic env whose calculator raises or hangs on chosen tasks."""

    def __init__(self, crash: set[str], hang: set[str]) -> None:
        super().__init__(n_tasks=30, seed=0)
        self.crash, self.hang = crash, hang

    def reset(self, task):
        cls = CrashingSession if task.task_id in self.crash else HangingSession if task.task_id in self.hang else None
        return cls(task, observation=task.instruction) if cls else super().reset(task)


MODES = ["solve", "solve", "garbage", "wrong_tool", "loop", "wrong", "wrong", "premature", "overflow", "bad_args",
         "step_budget", "crash", "hang"]
# cause and step of each mode, without and with a reference (diverged steps for the latter)
EXPECTED_PLAIN = {
    "garbage": ("format_error", 0), "wrong_tool": ("wrong_tool", 0), "loop": ("loop", 2), "wrong": ("wrong_answer", 1),
    "premature": ("wrong_answer", 0), "overflow": ("truncated", 1), "bad_args": ("tool_misuse", 0),
    "step_budget": ("step_budget", 5), "crash": ("env_error", 0), "hang": ("env_error", 0),
}
EXPECTED_REF = {
    "garbage": ("format_error", 0), "wrong_tool": ("wrong_tool", 0), "loop": ("loop", 1), "wrong": ("wrong_answer", 1),
    "premature": ("premature_answer", 0), "overflow": ("truncated", 0), "bad_args": ("tool_misuse", 0),
    "step_budget": ("step_budget", 0), "crash": ("env_error", 0), "hang": ("env_error", 0),
}


@dataclass
class Round:
    traces: list[Trace]
    modes: dict[str, str]  # task id -> mode
    references: dict[str, Trace]

    def of(self, mode: str) -> list[Trace]:
        return [t for t in self.traces if self.modes[t.task_id] == mode]


@pytest.fixture(scope="module")
def round_() -> Round:
    tasks = ArithmeticEnv(n_tasks=30, seed=0).tasks("train")[: len(MODES)]
    modes = {t.task_id: m for t, m in zip(tasks, MODES, strict=True)}
    env = FaultyArithmetic(crash={t for t, m in modes.items() if m == "crash"},
                           hang={t for t, m in modes.items() if m == "hang"})
    harness = base_harness().set_param("tool_timeout", "per_tool", {"calculator": 0.25})
    policy = ScriptedPolicy(lambda msgs: respond(modes[next_task(msgs, tasks)], msgs))
    traces = run_episodes([Job(t, harness, trace_id=f"tr-{i}") for i, t in enumerate(tasks)], policy, env)
    plain = ArithmeticEnv(n_tasks=30, seed=0)
    references = {t.task_id: gold_reference(plain, t) for t in tasks}
    return Round(traces, modes, references)


def next_task(messages: list[dict], tasks) -> str:
    user = next(m["content"] for m in messages if m["role"] == "user")
    return next(t.task_id for t in tasks if t.instruction == user)


def test_passing_traces_have_no_failure(round_: Round) -> None:
    assert round_.of("solve")
    for trace in round_.of("solve"):
        assert trace.passed
        assert classify(trace) is None
        assert classify(trace, round_.references[trace.task_id]) is None


@pytest.mark.parametrize("mode", sorted(EXPECTED_PLAIN))
def test_each_cause_without_reference(round_: Round, mode: str) -> None:
    (trace,) = round_.of(mode)[:1]
    failure = classify(trace)
    assert not trace.passed
    assert (failure.cause, failure.step) == EXPECTED_PLAIN[mode]
    assert failure.diverged_from_reference is False
    assert (failure.trace_id, failure.task_id, failure.variant) == (trace.trace_id, trace.task_id, "base")
    assert 0 < len(failure.excerpt) <= EXCERPT_CHARS


@pytest.mark.parametrize("mode", sorted(EXPECTED_REF))
def test_each_cause_at_first_divergence(round_: Round, mode: str) -> None:
    trace = round_.of(mode)[0]
    reference = round_.references[trace.task_id]
    failure = classify(trace, reference)
    assert (failure.cause, failure.step) == EXPECTED_REF[mode]
    assert failure.step == first_divergence(trace, reference)
    assert failure.diverged_from_reference is True
    assert len(failure.excerpt) <= EXCERPT_CHARS


def test_required_tools_make_a_bare_answer_premature(round_: Round) -> None:
    trace = round_.of("premature")[0]
    failure = classify(trace, required_tools=["calculator"])
    assert (failure.cause, failure.step) == ("premature_answer", 0)


def test_excerpts_quote_the_completion_and_the_tool_result(round_: Round) -> None:
    bad = classify(round_.of("bad_args")[0])
    assert bad.excerpt.startswith("step 0: <tool_call>")
    assert "calculator → error: unsupported element Name" in bad.excerpt
    crash = classify(round_.of("crash")[0])
    assert "crash: env tool 'calculator': RuntimeError: calculator backend down" in crash.excerpt
    assert crash.detail == "env tool 'calculator': RuntimeError: calculator backend down"
    hang = classify(round_.of("hang")[0])
    assert "timed out" in hang.excerpt and hang.detail == "calculator: tool timed out after 0.25 s"
    trace = round_.of("overflow")[0]
    assert classify(trace).detail.startswith("the completion hit its token budget (")
    assert classify(trace).excerpt == "step 1: " + " ".join(trace.model_calls[1].text.split())
    longer = Trace.from_dict(trace.to_dict())
    longer.model_calls[1].text = "word " * 500
    clipped = classify(longer).excerpt
    assert len(clipped) == EXCERPT_CHARS and clipped.startswith("step 1: word word") and clipped.endswith("…")


def test_first_divergence(round_: Round) -> None:
    solved = round_.of("solve")[0]
    assert first_divergence(solved, round_.references[solved.task_id]) is None
    expected = {"wrong": 1, "premature": 0, "loop": 1, "garbage": 0, "step_budget": 0}
    for mode, step in expected.items():
        trace = round_.of(mode)[0]
        assert first_divergence(trace, round_.references[trace.task_id]) == step, mode
    other = round_.references[round_.of("wrong")[0].task_id]
    with pytest.raises(ValueError, match="reference is for task"):
        first_divergence(solved, other)


def test_a_trace_that_stops_early_diverges_at_its_missing_step() -> None:
    env = ArithmeticEnv(n_tasks=30, seed=0)
    task = env.tasks("train")[0]
    short = base_harness().set_param("step_budget", "max_steps", 1)
    trace = run_episodes([Job(task, short)], ScriptedPolicy(calculator_solver), env)[0]
    reference = gold_reference(env, task)
    assert trace.stop_reason == "step_budget" and len(trace.model_calls) == 1
    assert first_divergence(trace, reference) == 1
    failure = classify(trace, reference)
    assert (failure.cause, failure.step, failure.diverged_from_reference) == ("step_budget", 1, True)
    assert failure.excerpt.startswith("step 0: ")  # the last step the trace reached


def test_an_unenabled_tool_the_reference_needs_is_a_missing_tool() -> None:
    env = ArithmeticEnv(n_tasks=30, seed=0)
    task = env.tasks("train")[0]
    no_tools = base_harness().set_param("tool_registry", "enabled", ["python"])
    policy = ScriptedPolicy(lambda m: respond("wrong_tool", m).replace("abacus", "calculator"))
    trace = run_episodes([Job(task, no_tools)], policy, env)[0]
    assert trace.tool_calls[0].error.startswith("unknown tool 'calculator'")
    assert classify(trace).cause == "wrong_tool"
    assert classify(trace, required_tools=["calculator"]).cause == "missing_tool"
    failure = classify(trace, gold_reference(env, task))
    assert (failure.cause, failure.step) == ("missing_tool", 0)


def test_steps_and_argument_normalisation(round_: Round) -> None:
    steps = trace_steps(round_.of("wrong")[0])
    assert [s.action()[0] for s in steps] == ["tools", "answer"]
    assert steps[0].tool_names == ("calculator",) and steps[0].records[0].error is None
    assert normalise_arguments({"expression": "2 + 3"}) == normalise_arguments({"expression": "2+3 "})
    assert normalise_arguments({"a": 1, "b": "x"}) == normalise_arguments({"b": "x", "a": 1})
    assert normalise_arguments({"code": "X"}) != normalise_arguments({"code": "x"})


def test_digest_clusters_counts_and_severities(round_: Round) -> None:
    d = digest(round_.traces, round=3, variant="base", references=round_.references, max_excerpts=3)
    # the crashed calculator is an infrastructure failure: counted, in no cluster (the hang is a timeout)
    (crashed,) = round_.of("crash")
    assert crashed.infra_failure and d.n_infra == 1
    failed = [t for t in round_.traces if not t.passed and not t.infra_failure]
    assert (d.round, d.variant, d.n_traces, d.n_failed) == (3, "base", 13, 10)
    assert d.pass_rate == 2 / 12
    assert d.harness_id == round_.traces[0].harness_id
    counts = {"wrong_answer": 2, "env_error": 1, "format_error": 1, "wrong_tool": 1, "loop": 1,
              "premature_answer": 1, "truncated": 1, "tool_misuse": 1, "step_budget": 1}
    assert [(c.cause, c.count) for c in d.clusters] == [
        ("wrong_answer", 2), ("env_error", 1), ("format_error", 1), ("loop", 1),
        ("premature_answer", 1), ("step_budget", 1), ("tool_misuse", 1), ("truncated", 1), ("wrong_tool", 1)]
    assert sum(counts.values()) == len(failed) == 10
    assert crashed.trace_id not in {tid for c in d.clusters for tid in c.trace_ids}
    assert crashed.task_id not in d.failed_task_ids + d.passed_task_ids
    assert "1 infrastructure failures left out" in d.text().splitlines()[0]
    for c in d.clusters:
        assert c.severity == counts[c.cause] / 10
        assert c.component == IMPLICATED[c.cause]
        assert len(c.task_ids) == c.count == len(c.trace_ids) == len(c.excerpts)  # one trace per task here
    wrong = d.cluster("wrong_answer")
    assert wrong.trace_ids == [t.trace_id for t in round_.of("wrong")]
    assert d.cluster("missing_tool") is None
    assert d.passed_task_ids == sorted(t.task_id for t in round_.of("solve"))
    assert d.failed_task_ids == sorted(t.task_id for t in failed)


def test_digest_without_references_and_excerpt_cap(round_: Round) -> None:
    d = digest(round_.traces, round=0, variant="base", max_excerpts=1)
    assert d.cluster("wrong_answer").count == 3  # the premature answer is a wrong answer without a reference
    assert d.cluster("premature_answer") is None
    assert all(len(c.excerpts) == 1 for c in d.clusters)


def test_digest_tokens_and_compression(round_: Round) -> None:
    d = digest(round_.traces, round=0, variant="base", references=round_.references)
    chars = sum(len(m["content"]) for t in round_.traces for m in t.messages)
    assert d.raw_tokens == math.ceil(chars / 4)
    assert d.digest_tokens == math.ceil(len(d.text()) / 4)
    assert d.compression > 1.0
    assert d.to_dict()["compression"] == d.raw_tokens / d.digest_tokens


def test_digest_variants_and_harness_ids(round_: Round) -> None:
    a, b, c = (Trace.from_dict(t.to_dict()) for t in round_.traces[:3])
    b.harness_id = "other"
    assert digest([a, b, c], round=0, variant="base").harness_id == a.harness_id  # most common
    b.variant = "v1"
    with pytest.raises(ValueError, match="mix harness ids"):
        digest([a, b, c], round=0, variant="base")
    with pytest.raises(ValueError, match="at least one trace"):
        digest([], round=0, variant="base")


# --------------------------------------------------------------------------- cluster_failures twin

def slow_clusters(failures: list[Failure], max_excerpts: int) -> list[Cluster]:
    """The obvious version: one pass per cause, then a bubble sort."""
    out = []
    for cause in CAUSES:
        members = [f for f in failures if f.cause == cause]
        if not members:
            continue
        tasks: list[str] = []
        for f in members:
            if f.task_id not in tasks:
                tasks.append(f.task_id)
        excerpts: list[str] = []
        seen: list[str] = []
        for f in members:
            if f.task_id not in seen and len(excerpts) < max_excerpts:
                seen.append(f.task_id)
                excerpts.append(f.excerpt)
        out.append(Cluster(cause, IMPLICATED[cause], len(members), len(members) / len(failures), tasks,
                           [f.trace_id for f in members], excerpts))
    for i in range(len(out)):
        for j in range(len(out) - 1 - i):
            x, y = out[j], out[j + 1]
            if x.count < y.count or (x.count == y.count and x.cause > y.cause):
                out[j], out[j + 1] = y, x
    return out


@pytest.mark.parametrize("seed", range(20))
def test_cluster_failures_matches_its_twin(seed: int) -> None:
    rng = random.Random(seed)
    causes = rng.sample(CAUSES, rng.randint(1, len(CAUSES)))
    failures = [
        Failure(f"tr{i}", f"task{rng.randint(0, 5)}", "base", rng.choice(causes), rng.randint(0, 4), f"ex{i}")
        for i in range(rng.randint(1, 40))
    ]
    k = rng.randint(0, 4)
    assert cluster_failures(failures, max_excerpts=k) == slow_clusters(failures, k)


def test_cluster_failures_keeps_singletons_and_rejects_unknown_causes() -> None:
    failures = [Failure("a", "t1", "base", "loop", 2, "x"), Failure("b", "t2", "base", "loop", 1, "y"),
                Failure("c", "t3", "base", "env_error", None, "z")]
    clusters = cluster_failures(failures)
    assert [(c.cause, c.count, c.severity) for c in clusters] == [("loop", 2, 2 / 3), ("env_error", 1, 1 / 3)]
    assert cluster_failures([]) == []
    with pytest.raises(ValueError, match="allowed causes"):
        cluster_failures([Failure("a", "t", "base", "bad_luck", 0, "")])
    with pytest.raises(ValueError, match="max_excerpts"):
        cluster_failures(failures, max_excerpts=-1)


def test_an_env_that_fails_to_reset_is_an_env_error_with_no_step() -> None:
    class DownEnv(ArithmeticEnv):
        def reset(self, task):
            raise ConnectionError("env down")

    env = DownEnv(n_tasks=30, seed=0)
    task = env.tasks("train")[0]
    trace = run_episodes([Job(task, base_harness())], ScriptedPolicy(calculator_solver), env)[0]
    failure = classify(trace)
    assert (failure.cause, failure.step) == ("env_error", None)
    assert failure.excerpt == "no model call: env reset: ConnectionError: env down"
    d = digest([trace], round=0, variant="base")  # an infrastructure failure: counted, never clustered
    assert json.loads(json.dumps(d.to_dict()))["clusters"] == [] and (d.n_infra, d.n_failed) == (1, 0)


def test_a_length_cut_is_the_budget_or_the_context_window_by_its_token_counts(round_: Round) -> None:
    """A completion holding its max_new_tokens was cut by the budget (``truncated``: raise it),
    however long the prompt; one the engine stopped short of its budget was cut by the context
    window (``context_overflow``: shorten the history). A multi-turn conversation whose replies
    ran to the budget at 2.6k of 8k tokens is not a context overflow."""
    trace = Trace.from_dict(round_.of("overflow")[0].to_dict())
    last = trace.model_calls[-1]
    last.prompt_ids, last.completion_ids, last.max_new_tokens = [1] * 2600, [2] * 256, 256
    got = classify(trace)
    assert got.cause == "truncated"
    assert got.detail == "the completion hit its token budget (2600 prompt + 256 completion tokens)"
    last.prompt_ids, last.completion_ids = [1] * 8100, [2] * 92  # the window (8192) stopped it
    got = classify(trace)
    assert (got.cause, got.detail) == ("context_overflow",
                                       "the context window ended the completion (8100 prompt + 92 completion tokens)")
    assert IMPLICATED["truncated"].processors == ("sampling",)
    assert "sampling" not in IMPLICATED["context_overflow"].processors
