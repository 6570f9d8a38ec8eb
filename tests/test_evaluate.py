import pytest

from coevo.agent import ScriptedPolicy
from coevo.agent.evaluate import evaluate, markdown_report
from coevo.agent.rollouts import RolloutService
from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.harness.defaults import base_harness


def test_evaluate_counts_attempts_and_failures():
    env = ArithmeticEnv(n_tasks=20)
    flaky = {"n": 0}

    def respond(messages):  # every other episode answers wrong on its final turn
        reply = calculator_solver(messages)
        if "<answer>" in reply:
            flaky["n"] += 1
            if flaky["n"] % 2:
                return "<answer>-1</answer>"
        return reply

    rollouts = RolloutService(ScriptedPolicy(respond), env, batch_size=1, max_steps=6, workers=1, seed=0)
    report, traces = evaluate(base_harness(), rollouts, "val", attempts=2)
    assert report.n_tasks == len(env.tasks("val")) and len(traces) == 2 * report.n_tasks
    assert report.pass_at_1 == pytest.approx(0.5)
    assert report.mean_reward == pytest.approx(0.5)
    with pytest.raises(ValueError, match="attempts"):
        evaluate(base_harness(), rollouts, attempts=0)


class LimitedArithmetic(ArithmeticEnv):
    """An env whose task listing takes a limit (a benchmark that builds each task it lists)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.limits = []

    def tasks(self, split, limit=None):
        self.limits.append(limit)
        return super().tasks(split)[:limit]


def scripted(env):
    return RolloutService(ScriptedPolicy(calculator_solver), env, batch_size=4, max_steps=6, workers=1, seed=0)


def test_evaluate_passes_the_limit_to_an_env_that_takes_one():
    env = LimitedArithmetic(n_tasks=40)
    report, traces = evaluate(base_harness(), scripted(env), "test", limit=3)
    assert env.limits == [3] and report.n_tasks == 3 and len(traces) == 3
    report, _ = evaluate(base_harness(), scripted(env), "test")
    assert env.limits == [3, None] and report.n_tasks == len(ArithmeticEnv(n_tasks=40).tasks("test"))
    plain = ArithmeticEnv(n_tasks=40)  # tasks(split) only: listed whole, then cut
    assert evaluate(base_harness(), scripted(plain), "test", limit=2)[0].n_tasks == 2


def test_report_shows_pass_at_k_only_with_several_attempts():
    env = ArithmeticEnv(n_tasks=40)
    one = markdown_report(*evaluate(base_harness(), scripted(env), "test", limit=2))
    assert "pass@1 | mean reward" in one and "pass@1 |" in one and one.count("pass@") == 1
    assert "| 1.000 | 1.000 |" in one  # pass@1 then mean reward: one column each
    head, rule = [line for line in one.splitlines() if line.startswith("| pass@1") or line.startswith("|---|")][:2]
    assert head.count("|") == rule.count("|")
    two = markdown_report(*evaluate(base_harness(), scripted(env), "test", limit=2, attempts=2))
    assert "| pass@1 | pass@2 | mean reward |" in two
    head, rule = [line for line in two.splitlines() if line.startswith("| pass@1") or line.startswith("|---|")][:2]
    assert head.count("|") == rule.count("|")


def test_an_evaluation_stopped_halfway_keeps_the_traces_of_the_episodes_it_finished(tmp_path):
    """``TraceLog`` appends each trace as its episode ends: when the run dies before ``write_eval``
    (a kill, a crash in a later episode), ``traces.jsonl`` holds every episode that finished."""
    import json

    from coevo.agent.evaluate import TraceLog

    env = ArithmeticEnv(n_tasks=20)
    seen = {"n": 0}

    def respond(messages):  # the fifth model call kills the evaluation
        seen["n"] += 1
        if seen["n"] == 5:
            raise KeyboardInterrupt
        return calculator_solver(messages)

    log = TraceLog(tmp_path / "traces.jsonl")
    rollouts = RolloutService(ScriptedPolicy(respond), env, batch_size=1, max_steps=6, workers=1, seed=0)
    with pytest.raises(KeyboardInterrupt):
        evaluate(base_harness(), rollouts, "val", on_trace=log.append)
    kept = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(kept) == 2 and all(t["passed"] for t in kept)  # two episodes of two calls each had ended


def test_a_stopped_evaluation_reports_the_episodes_that_ended(tmp_path):
    """Stopped after some episodes ended, ``on_partial`` gets their report (``partial=True``, only the
    tasks with an ended episode) before the stop propagates; ``write_eval`` marks it in report.md."""
    from coevo.agent.evaluate import write_eval

    env = ArithmeticEnv(n_tasks=20)
    seen = {"n": 0}

    def respond(messages):  # the seventh model call stops the evaluation: three episodes of two calls ended
        seen["n"] += 1
        if seen["n"] == 7:
            raise KeyboardInterrupt
        return calculator_solver(messages)

    got = []
    rollouts = RolloutService(ScriptedPolicy(respond), env, batch_size=1, max_steps=6, workers=1, seed=0)
    with pytest.raises(KeyboardInterrupt):
        evaluate(base_harness(), rollouts, "val", on_partial=lambda r, t: got.append((r, t)))
    (report, traces), = got
    assert report.partial and report.n_tasks == 3 and len(traces) == 3 and report.pass_at_1 == 1.0
    assert [t.task_id for t in traces] == [t.task_id for t in env.tasks("val")[:3]]
    write_eval(tmp_path, base_harness(), report, traces)
    assert "**Partial**" in (tmp_path / "report.md").read_text()
    full, _ = evaluate(base_harness(), scripted(env), "val", limit=2)
    assert not full.partial and "Partial" not in markdown_report(full, _)
