import pytest

from coevo.agent import ScriptedPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.evaluate import evaluate
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
