"""An OpenEnv environment run by name: a small local one (examples/openenv/guess.py) served on the
loopback interface in this process, played over OpenEnv's own client, scored by its step rewards."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_attempts
from coevo.envs import ENVS
from coevo.envs.openenv_env import parse_action
from coevo.errors import UsageError
from coevo.harness.defaults import function_calling_harness
from tests.train_round import one_round

pytest.importorskip("openenv")

APP = "examples.openenv.guess:app"
RESETS = [{"target": t, "high": 16, "max_attempts": 5} for t in range(1, 17)]
SCHEMA = {"properties": {"guess": {"type": "integer"}, "metadata": {}}, "required": ["guess"]}


@pytest.fixture(scope="module")
def env():
    return ENVS["openenv"](app=APP, resets=RESETS)


def bisect(messages) -> str:
    """Binary search over the environment's higher/lower messages (a bare integer: the one required field)."""
    low, high = 1, 16
    for message in messages:
        said = re.search(r"(\d+) is wrong; the secret is (higher|lower)", message["content"])
        if said:
            guess = int(said.group(1))
            low, high = (guess + 1, high) if said.group(2) == "higher" else (low, guess - 1)
    return str((low + high) // 2)


def test_replies_are_actions_stepped_until_the_environment_is_done(env):
    tasks = [t for s in ("train", "val", "test") for t in env.tasks(s)]
    assert len(tasks) == 16 and len({t.task_id for t in tasks}) == 16
    traces = [t for [t] in run_attempts(tasks, function_calling_harness(), ScriptedPolicy(bisect), env, max_steps=6)]
    for trace in traces:
        assert trace.error is None and trace.passed and trace.reward == 1.0, trace.error
        rewards = trace.verifier_info["step_rewards"]
        assert rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0} and len(rewards) <= 5
        first = json.loads(trace.model_calls[0].messages[-1]["content"])
        assert first["action_schema"]["required"] == ["guess"] and "secret integer" in first["observation"]["message"]


def test_a_reply_that_is_no_action_is_told_so_and_scores_nothing(env):
    task = env.tasks("train")[0]
    [[trace]] = run_attempts([task], function_calling_harness(), ScriptedPolicy(lambda m: "I think it is seven"), env,
                             max_steps=2)
    assert trace.error is None and not trace.passed and trace.verifier_info["step_rewards"] == [0.0, 0.0]
    assert "not a valid action" in trace.model_calls[1].messages[-1]["content"]


@pytest.mark.parametrize("reply, action", [('{"guess": 5}', {"guess": 5}), ('```json\n{"guess": 5}\n```', {"guess": 5}),
                                           ("5", {"guess": 5}), ("five", {"guess": "five"})])
def test_an_action_is_a_json_object_or_the_one_required_field(reply, action):
    assert parse_action(reply, SCHEMA) == action


def test_an_action_without_a_single_required_field_needs_json():
    with pytest.raises(ValueError, match="JSON object"):
        parse_action("5", {"properties": {"a": {}, "b": {}}, "required": ["a", "b"]})


def test_one_of_base_url_or_app_is_needed():
    with pytest.raises(UsageError, match="needs one of base_url"):
        ENVS["openenv"]()
    with pytest.raises(UsageError, match="did not answer /schema"):
        ENVS["openenv"](base_url="http://127.0.0.1:9")


def test_coevo_eval_runs_an_openenv_environment_by_name(tmp_path):
    from coevo.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--env", "openenv", "--env-arg", f"app={APP}", "--env-arg",
                                      f"resets={json.dumps(RESETS)}", "--harness", "function_calling",
                                      "--split", "train", "--model", "tiny", "--max-new-tokens", "8",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["n_tasks"] == len(ENVS["openenv"](app=APP, resets=RESETS).tasks("train"))


@pytest.mark.slow
def test_train_py_runs_a_round_on_an_openenv_environment_as_the_readme_writes_it(tmp_path):
    record = one_round(tmp_path, "env=openenv", "harness=function_calling", "val_limit=1", "rollout.max_new_tokens=8",
                       "evolution.stat_tasks=2", "evolution.stat_budget=4")
    assert record["train"]["n_traces"] == 4 and record["infra_failures"]["count"] == 0
    assert all(t.startswith("guess-") for t in record["train"]["outcomes"])
