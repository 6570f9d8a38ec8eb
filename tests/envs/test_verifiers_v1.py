"""verifiers 0.4 (``verifiers.v1``) tasksets under v1 harness programs (null, bash) in the subprocess
runtime, with coevo's policy answering every model request the program sends through verifiers'
interception server (examples/verifiers_v1/arith.py; no hub download, no sandbox account)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_attempts
from coevo.envs import ENVS
from coevo.errors import UsageError
from coevo.harness.defaults import program_harness
from coevo.policy.tiny import tiny_policy
from tests.train_round import one_round

pytest.importorskip("verifiers.v1")

ARITH = "examples.verifiers_v1.arith:ArithTaskset"


def solve(use_bash: bool):
    """Answer the task's arithmetic (after running it in bash, with ``use_bash``)."""

    def respond(messages) -> str:
        last, task = messages[-1], next(m["content"] for m in messages if m["role"] == "user")
        expression = re.search(r"What is (.*)\?", task).group(1)
        if use_bash and last["role"] != "tool":
            return json.dumps({"name": "bash", "arguments": {"command": f"echo $(({expression}))"}}).join(
                ["<tool_call>", "</tool_call>"])
        return f"The answer is {last['content'].strip() if use_bash else eval(expression)}."

    return respond


@pytest.mark.parametrize("harness", ["null", "bash"])
def test_a_v1_taskset_runs_under_a_v1_harness_program_and_its_rewards_are_the_verdict(harness):
    env = ENVS["verifiers"](taskset=ARITH, taskset_args={"n": 20}, harness=harness)
    tasks = env.tasks("train")[:3]
    assert env.name == "arith" and {t.split for t in env.tasks("test")} == {"test"}
    traces = [t for [t] in run_attempts(tasks, program_harness(), ScriptedPolicy(solve(harness == "bash")), env)]
    for trace in traces:
        assert trace.error is None and trace.passed and trace.reward == 1.0, trace.error
        info = trace.verifier_info
        assert info["rewards"] == {"correct": 1.0} and info["stop_condition"] == "agent_completed"
        assert info["metrics"]["reply_chars"] == len(trace.model_calls[-1].text)
        system = trace.model_calls[0].messages[0]
        assert system["role"] == "system"
        if harness == "bash":  # verifiers' bash program offers its tools; coevo lists them in the model's format
            assert len(trace.model_calls) == 2 and "- bash:" in system["content"]
            assert trace.model_calls[1].messages[-1]["role"] == "tool"
        else:  # the program's own (poor) system prompt reaches the model, as the taskset wrote it
            assert len(trace.model_calls) == 1 and system["content"].startswith("Explain your reasoning at length")


def test_the_tokens_verifiers_records_for_a_turn_are_the_ones_coevo_recorded():
    env = ENVS["verifiers"](taskset=ARITH, taskset_args={"n": 20})
    kept = []
    score = env._score
    env._score = lambda trace: (kept.append(trace), score(trace))[1]
    harness = program_harness().set_param("sampling", "temperature", 1.0).set_param("sampling", "max_new_tokens", 8)
    [[trace]] = run_attempts(env.tasks("train")[:1], harness, tiny_policy(seed=0), env)
    assert trace.error is None, trace.error
    (call,) = trace.model_calls
    (vf_trace,) = kept
    (branch,) = vf_trace.branches
    assert branch.token_ids == call.prompt_ids + call.completion_ids
    assert branch.logprobs[-len(call.completion_ids):] == pytest.approx(call.sampler_logprobs, abs=0)


def test_the_classic_api_and_a_missing_taskset_are_one_line_errors():
    with pytest.raises(UsageError, match="verifiers 0.4 removed the classic environment API"):
        ENVS["verifiers"](environment="wordle")
    with pytest.raises(UsageError, match="needs a taskset"):
        ENVS["verifiers"]()
    with pytest.raises(UsageError, match="not a vf.Taskset subclass"):
        ENVS["verifiers"](taskset="examples.ecosystem_envs:gsm8k_rows")


def test_coevo_eval_runs_a_v1_taskset_by_name(tmp_path):
    from coevo.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--env", "verifiers", "--env-arg", f"taskset={ARITH}",
                                      "--harness", "program", "--model", "gold", "--split", "test",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["pass_at_1"] == 1.0 and report["n_tasks"] >= 5


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["null", "bash"])
def test_train_py_runs_a_round_on_a_v1_taskset_as_the_readme_writes_it(tmp_path, harness):
    record = one_round(tmp_path, "env=verifiers", f"env.args.harness={harness}", "harness=program", "val_limit=2",
                       "rollout.max_new_tokens=16", "evolution.stat_tasks=4", "evolution.stat_budget=8")
    assert record["train"]["n_traces"] == 4 and record["infra_failures"]["count"] == 0
    assert all(t.startswith("arith-") for t in record["train"]["outcomes"])


def _offline_taskset():
    import verifiers.v1 as vf

    class OfflineTaskset(vf.Taskset):
        def load(self):
            try:
                raise OSError("[Errno -3] Temporary failure in name resolution")
            except OSError as err:
                raise RuntimeError("could not load dataset 'openai/gsm8k' from the hub") from ConnectionError(err)

    return OfflineTaskset


OfflineTaskset = _offline_taskset()


def test_a_taskset_that_cannot_fetch_its_data_offline_is_one_line_naming_it():
    with pytest.raises(UsageError, match=r"cannot fetch here \(ConnectionError: .*name resolution\).*HF_HUB_OFFLINE"):
        ENVS["verifiers"](taskset="tests.envs.test_verifiers_v1:OfflineTaskset")
