"""Environments of the RL ecosystem (verifiers, skyrl-gym) run under coevo by name, with no adapter code:
their tasks, tools, turns and rewards arrive as the library defines them (examples/ecosystem_envs.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs import ENVS
from coevo.harness.defaults import BUILTIN_HARNESSES

pytest.importorskip("verifiers")
pytest.importorskip("skyrl_gym")

ROOT = Path(__file__).resolve().parents[2]
TOOL_ENV, GUESS_ENV, SINGLE_ENV = (f"examples.ecosystem_envs:load_{kind}_env" for kind in ("tool", "guess", "single"))
GSM8K_ROWS = "examples.ecosystem_envs:gsm8k_rows"


def episodes(env, solver, tasks, harness="base", max_steps=8):
    service = RolloutService(ScriptedPolicy(solver), env, batch_size=len(tasks), max_steps=max_steps, workers=2, seed=0)
    return service.run(BUILTIN_HARNESSES[harness](), tasks, attempts=1, phase=None).traces


def _operands(messages) -> tuple[int, int, int]:
    """a, b, c of "What is a times b, plus c?" (the first user message)."""
    a, b, c = map(int, re.findall(r"\d+", next(m["content"] for m in messages if m["role"] == "user"))[:3])
    return a, b, c


def arithmetic_with_tools(messages) -> str:
    """multiply(a, b), then add(product, c), then the sum as the answer: what the ToolEnv's tools are for."""
    a, b, c = _operands(messages)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    if len(results) == 1:
        product = int(re.findall(r"-?\d+", results[0])[-1])
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {product}, "b": {c}}}}}</tool_call>'
    return f"<answer>{re.findall(r'-?[0-9]+', results[-1])[-1]}</answer>"


def bisect(messages) -> str:
    """Binary search on the env's higher/lower replies."""
    low, high = 1, 16
    guesses = [int(m["content"].split(">")[1].split("<")[0]) for m in messages if m["role"] == "assistant"]
    hints = [m["content"] for m in messages if m["role"] == "user"][1:]
    for guess, hint in zip(guesses, hints):
        low, high = (guess + 1, high) if "Higher" in hint else (low, guess - 1)
    return f"<answer>{(low + high) // 2}</answer>"


# ------------------------------------------------------------------------------------------ verifiers
def test_a_verifiers_tool_env_runs_its_tools_and_scores_with_its_rubric():
    env = ENVS["verifiers"](environment=TOOL_ENV)
    assert env.name == "tool_env"
    tasks = env.tasks("train")[:6]
    session = env.reset(tasks[0])
    assert set(session.tools) == {"add", "multiply"}
    assert session.tools["add"].parameters["required"] == ["a", "b"]  # the env's own schema, from the docstring
    assert session.call_tool("multiply", {"a": 6, "b": 7}).output == "42"
    # ToolEnv formats a bad call as the tool's reply (verifiers' error_formatter), not as an exception
    assert "missing 1 required positional argument" in session.call_tool("add", {"a": 1}).output
    session.close()

    traces = episodes(env, arithmetic_with_tools, tasks)
    assert all(t.passed and t.reward == 1.0 for t in traces), [(t.final_answer, t.error) for t in traces]
    for trace in traces:  # the rubric read the calls from the completion coevo's actions built
        metrics = trace.verifier_info["metrics"]
        assert (metrics["multiply_calls"], metrics["add_calls"], metrics["used_a_tool"]) == (1, 1, 0.2)
        assert trace.verifier_info["reward"] == pytest.approx(1.2)  # raw, before the clip to [0, 1]
        assert trace.verifier_info["stop"] == "no_tools_called"
    wrong = episodes(env, lambda m: "<answer>0</answer>", tasks[:2])
    assert [(t.passed, t.reward, t.verifier_info["metrics"]["used_a_tool"]) for t in wrong] == [(False, 0.0, 0.0)] * 2


def test_a_verifiers_multi_turn_env_answers_each_reply_until_its_stop_condition():
    env = ENVS["verifiers"](environment=GUESS_ENV)
    task = env.tasks("train")[0]
    target = int(task.answer)
    session = env.reset(task)
    assert session.respond(str(target - 1 if target > 1 else target + 1)) in ("Higher.", "Lower.")
    assert session.respond(str(target)) is None and session.done
    assert session.verify(str(target)).passed
    session.close()

    tasks = env.tasks("train")[:6]
    traces = episodes(env, bisect, tasks)
    assert all(t.passed for t in traces), [(t.messages[-3:], t.error) for t in traces]
    assert any(t.replies for t in traces)  # some took several turns: earlier guesses are replies
    assert all(len(t.replies) + 1 == t.verifier_info["metrics"]["num_turns"] for t in traces)
    never = episodes(env, lambda m: "<answer>0</answer>", tasks[:1])[0]  # max_turns=5 ends it, unsolved
    assert not never.passed and len(never.replies) + 1 == 5 and never.verifier_info["stop"] == "max_turns_reached"


def test_a_verifiers_single_turn_env_with_an_xml_parser_reads_the_base_harness_answer():
    """The base harness strips ``<answer>`` tags from the reply; the rubric's XMLParser needs them back."""
    env = ENVS["verifiers"](environment=SINGLE_ENV)
    tasks = env.tasks("val")[:4]
    word = re.compile(r"'(\w+)'")
    right = episodes(env, lambda m: f"<answer>{word.search(m[-1]['content']).group(1)[::-1]}</answer>", tasks)
    assert [t.passed for t in right] == [True] * 4
    backwards_once = episodes(env, lambda m: "<answer>nothing</answer>", tasks[:1])[0]
    assert not backwards_once.passed and backwards_once.verifier_info["stop"] == "max_turns_reached"


def test_verifiers_splits_seal_the_eval_dataset_as_test():
    env = ENVS["verifiers"](environment=SINGLE_ENV)  # 30 rows, its first 10 also the eval_dataset
    train, val, test = (env.tasks(s) for s in ("train", "val", "test"))
    assert (len(train) + len(val), len(test)) == (30, 10) and train and val
    assert {t.metadata["row"]["question"] for t in test} <= {t.metadata["row"]["question"] for t in train + val}
    assert len({t.task_id for t in train + val + test}) == 40  # a repeated row keeps an id of its own
    again = ENVS["verifiers"](environment=SINGLE_ENV)
    assert [t.task_id for t in again.tasks("val")] == [t.task_id for t in val]


def test_a_verifiers_environment_that_is_not_one_is_refused():
    with pytest.raises(TypeError, match="gave a list, not a vf.Environment"):
        ENVS["verifiers"](environment=GSM8K_ROWS)


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
@pytest.mark.parametrize("args", [
    ["--env", "verifiers", "--env-arg", f"environment={TOOL_ENV}"],
    ["--env", "skyrl_gym", "--env-arg", f"rows={GSM8K_ROWS}", "--env-arg", "env_class=gsm8k",
     "--harness", "function_calling"],
])
def test_coevo_eval_runs_an_ecosystem_env_by_name(tmp_path, args):
    from coevo.cli.main import app

    result = CliRunner().invoke(app, ["eval", *args, "--model", "gold", "--split", "test", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["pass_at_1"] == 1.0 and report["n_tasks"] >= 5


@pytest.mark.slow
@pytest.mark.parametrize("env_overrides", [
    ["env.name=verifiers", f"+env.args.environment={TOOL_ENV}"],
    ["env.name=skyrl_gym", f"+env.args.rows={GSM8K_ROWS}", "+env.args.env_class=gsm8k"],
])
def test_train_py_runs_a_round_on_an_ecosystem_env(tmp_path, env_overrides):
    overrides = ["~env", *env_overrides, "model=tiny", "trainer=grpo", "rounds=1", "batch_tasks=2",
                 "rollout.attempts=2", "val_limit=2", "rollout.max_new_tokens=16", "rollout.keep_truncated=true",
                 "rollout.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert record["train"]["n_traces"] == 4
    name = "tool_env" if "verifiers" in env_overrides[0] else "gsm8k"
    assert all(t.startswith(f"{name}-") for t in record["train"]["outcomes"])
