"""skyrl-gym environments run under coevo by name, with no adapter code: their tasks, turns and rewards
arrive as the library defines them (examples/ecosystem_envs.py). verifiers 0.4 tasksets: test_verifiers_v1.py."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs import ENVS
from coevo.harness.defaults import BUILTIN_HARNESSES
from tests.train_round import one_round

pytest.importorskip("skyrl_gym")

GSM8K_ROWS = "examples.ecosystem_envs:gsm8k_rows"


def episodes(env, solver, tasks, harness="base", max_steps=8):
    service = RolloutService(ScriptedPolicy(solver), env, batch_size=len(tasks), max_steps=max_steps, workers=2, seed=0)
    return service.run(BUILTIN_HARNESSES[harness](), tasks, attempts=1, phase=None).traces


def _operands(messages) -> tuple[int, int, int]:
    """a, b, c of "What is a times b, plus c?" (the first user message)."""
    a, b, c = map(int, re.findall(r"\d+", next(m["content"] for m in messages if m["role"] == "user"))[:3])
    return a, b, c


# ------------------------------------------------------------------------------------------ skyrl-gym
def test_a_skyrl_gym_env_steps_on_each_reply_and_keeps_its_outcome_reward(tmp_path):
    from examples.ecosystem_envs import gsm8k_rows

    rows = [{**row, "env_class": "gsm8k_multi_turn"} for row in gsm8k_rows(12)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = ENVS["skyrl_gym"](rows=str(path))
    assert env.name == "gsm8k_multi_turn"
    task = next(t for s in ("train", "val", "test") for t in env.tasks(s))
    truth = task.answer["ground_truth"]
    session = env.reset(task)
    assert session.tools == {} and session.call_tool("add", {}).error
    assert "####" in session.respond("#### -1")  # wrong, but well formatted: the env asks again
    assert session.respond(f"So #### {truth}") is None and session.done
    score = session.verify(truth)
    assert score.passed and score.reward == 1.0 and score.info["step_rewards"][-1] == 1.0
    assert 0 < score.info["step_rewards"][0] < 1  # the env's format credit for the first turn


def test_skyrl_gym_episodes_under_the_plain_text_harness():
    env = ENVS["skyrl_gym"](rows=GSM8K_ROWS, env_class="gsm8k")
    tasks = env.tasks("train")[:5]
    traces = episodes(env, lambda m: f"Multiply, then add.\n#### {_times_plus(m)}", tasks, harness="function_calling")
    assert all(t.passed and t.final_answer.startswith("Multiply") for t in traces), [t.error for t in traces]
    assert all(t.capabilities == ("skill:times_plus",) for t in tasks)


def _times_plus(messages) -> int:
    """a * b + c of the task's question (the gold arithmetic)."""
    a, b, c = _operands(messages)
    return a * b + c


def test_an_unregistered_skyrl_class_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"\['nope'\] is not registered.*'gsm8k'"):
        ENVS["skyrl_gym"](rows=[{"prompt": [{"role": "user", "content": "hi"}], "env_class": "nope"}])


# ------------------------------------------------------------------------------------ by name: CLI, train.py
def test_coevo_eval_runs_an_ecosystem_env_by_name(tmp_path):
    from coevo.cli.main import app

    args = ["--env", "skyrl_gym", "--env-arg", f"rows={GSM8K_ROWS}", "--env-arg", "env_class=gsm8k",
            "--harness", "function_calling"]
    result = CliRunner().invoke(app, ["eval", *args, "--model", "gold", "--split", "test", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["pass_at_1"] == 1.0 and report["n_tasks"] >= 5


@pytest.mark.slow
def test_train_py_runs_a_round_on_skyrl_gym_as_the_readme_writes_it(tmp_path):
    record = one_round(tmp_path, "env=skyrl_gym", f"env.args.rows={GSM8K_ROWS}", "env.args.env_class=gsm8k",
                       "val_limit=2", "rollout.max_new_tokens=16")
    assert record["train"]["n_traces"] == 4
    assert all(t.startswith("gsm8k-") for t in record["train"]["outcomes"])


@pytest.mark.parametrize("field", ["reward_spec", "reward_model"])
def test_rows_name_their_ground_truth_either_way_for_every_math_env(field):
    """skyrl-gym's aime reads ``reward_model``, gsm8k ``reward_spec``: a row written either way works for both."""
    prompt = [{"role": "user", "content": "What is 6 times 7?"}]
    for env_class, right, wrong in [("aime", "Answer: 42", "Answer: 41"), ("gsm8k", "#### 42", "#### 41")]:
        env = ENVS["skyrl_gym"](rows=[{"prompt": prompt, "env_class": env_class, field: {"ground_truth": "42"}}])
        (task,) = [t for s in ("train", "val", "test") for t in env.tasks(s)]
        assert task.answer == {"ground_truth": "42"}
        for reply, passed in ((right, True), (wrong, False)):
            session = env.reset(task)
            session.respond(reply)
            assert session.verify(reply).passed is passed, (env_class, reply)
            session.close()
