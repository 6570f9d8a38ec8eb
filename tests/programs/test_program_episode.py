"""Program-driven episodes: a program reaches the model through coevo's OpenAI-compatible endpoint,
the harness shapes each request, the policy's exact ids and log-probs are recorded; a program that
crashes, hangs, sends garbage or never stops fails (or ends) its own episode only."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import urllib.request

import pytest

from coevo.agent.policy import ChatRequest, Generation, Policy, ScriptedPolicy
from coevo.agent.runtime import run_attempts
from coevo.envs.command_env import CommandEnv
from coevo.harness.defaults import program_harness
from coevo.policy.tiny import tiny_policy
from coevo.programs.channel import ModelChannel
from coevo.programs.endpoint import ModelEndpoint
from tests.train_round import ROOT, one_round

CALCULATOR_AGENT = "python examples/programs/calculator_agent.py"


def calculator_solver(messages) -> str:
    """Call the calculator on the task's expression, then answer with its result."""
    last = messages[-1]
    if last["role"] == "tool":
        return f"<answer>{last['content']}</answer>"
    expression = re.search(r"What is (.*)\?", last["content"]).group(1)
    return json.dumps({"name": "calculator", "arguments": {"expression": expression}}).join(
        ["<tool_call>", "</tool_call>"])


def program(tmp_path, source: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(source))
    return f"{sys.executable} {path}"


def env_for(command: str, **kwargs) -> CommandEnv:
    return CommandEnv(command, tasks_from="arithmetic", tasks_args={"n_tasks": 20, "max_terms": 2}, **kwargs)


def test_an_openai_program_solves_tasks_with_its_own_tool_through_the_endpoint():
    env = env_for(CALCULATOR_AGENT)
    tasks = env.tasks("train")[:4]
    policy = ScriptedPolicy(calculator_solver)
    traces = [t for [t] in run_attempts(tasks, program_harness(), policy, env)]
    assert all(t.passed and t.error is None for t in traces), [t.error for t in traces]
    for trace in traces:
        first, second = trace.model_calls
        assert first.messages[0]["role"] == "system" and "calculator" in first.messages[0]["content"]  # listed
        assert second.messages[-1]["role"] == "tool" and second.messages[-1]["name"] == "calculator"
        assert trace.metrics["tool_calls"] == 1 and trace.metrics["steps"] == 2 and trace.stop_reason == "answer"
    assert policy.batch_sizes == [4, 4]  # the four programs' requests share the policy's batches


class Recording(Policy):
    """A real policy whose every Generation is kept, to compare with what the trace recorded."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.model_version, self.tokenizer = inner, inner.model_version, inner.tokenizer
        self.seen: list[tuple[ChatRequest, Generation]] = []

    def generate(self, requests):
        out = self.inner.generate(requests)
        self.seen += list(zip(requests, out, strict=True))
        return out

    def prompt_ids(self, messages, reply_prefix=""):
        return self.inner.prompt_ids(messages, reply_prefix)


def test_the_ids_and_logprobs_recorded_for_a_programs_request_are_what_the_policy_evaluated_and_sampled(tmp_path):
    command = program(tmp_path, """
        import json, os, urllib.request
        def ask(messages):
            body = json.dumps({"model": "x", "messages": messages, "logprobs": True}).encode()
            req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                         {"Content-Type": "application/json"})
            return json.load(urllib.request.urlopen(req))["choices"][0]
        task = input()
        first = ask([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task}])
        second = ask([{"role": "user", "content": task}, first["message"], {"role": "user", "content": "Sure?"}])
        print(json.dumps([c["logprobs"]["content"] for c in (first, second)]).replace("\\n", " "))
        print(second["message"]["content"].replace("\\n", " ") or "-")
    """)
    env = env_for(command)
    policy = Recording(tiny_policy(seed=2))
    harness = program_harness().set_param("sampling", "temperature", 1.0).set_param("sampling", "max_new_tokens", 12)
    traces = [t for [t] in run_attempts(env.tasks("train")[:3], harness, policy, env)]
    assert all(t.error is None for t in traces), [t.error for t in traces]
    by_episode = {}
    for request, generation in policy.seen:
        by_episode.setdefault(request.episode, []).append(generation)
    for trace in traces:
        generations = by_episode[trace.trace_id]
        assert len(trace.model_calls) == len(generations) == 2
        for call, generation in zip(trace.model_calls, generations, strict=True):
            assert call.prompt_ids == generation.prompt_ids and call.completion_ids == generation.completion_ids
            assert call.sampler_logprobs == generation.logprobs and len(call.sampler_logprobs) > 0
            assert call.prompt_ids == policy.prompt_ids(call.messages)  # the shaped request, rendered once
            assert call.temperature == 1.0
        # the second request carried the first reply back: the model saw its own reply as the assistant turn
        assert trace.model_calls[1].messages[1] == {"role": "assistant", "content": trace.model_calls[0].text}


def test_a_program_that_crashes_hangs_or_sends_garbage_fails_its_own_episode(tmp_path):
    script = program(tmp_path, """
        import json, os, sys, time, urllib.request, urllib.error
        task = input()
        url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
        def post(data):
            try:
                return json.load(urllib.request.urlopen(urllib.request.Request(url, data)))
            except urllib.error.HTTPError as err:
                sys.exit(f"HTTP {err.code}: {err.read().decode()}")
        reply = post(json.dumps({"messages": [{"role": "user", "content": task}]}).encode())
        a, b = [int(x) for x in task.split("What is ")[1].rstrip("?").split(" ")[::2]]
        if a % 4 == 0:
            raise RuntimeError("the agent crashed mid-episode")
        if a % 4 == 1:
            time.sleep(60)
        if a % 4 == 2:
            post(b"{not json")
        print(reply["choices"][0]["message"]["content"])
    """)
    env = env_for(script, program_timeout_s=3)
    tasks = env.tasks("train")[:12]
    kinds = {t.task_id: int(t.instruction.split()[2]) % 4 for t in tasks}
    assert set(kinds.values()) == {0, 1, 2, 3}
    traces = [t for [t] in run_attempts(tasks, program_harness(), ScriptedPolicy(calculator_solver), env)]
    for trace in traces:
        kind = kinds[trace.task_id]
        if kind == 3:
            assert trace.error is None and trace.trainable and len(trace.model_calls) == 1
            continue
        assert trace.error_source == "program" and trace.infra_failure and not trace.trainable
        assert not trace.passed and trace.reward == 0.0
        assert len(trace.model_calls) == 1  # the partial call is kept in the trace, never trained
        expected = {0: "the agent crashed mid-episode", 1: "no model request and no end within 3 s",
                    2: "program request: MalformedRequest: the request body is not JSON"}[kind]
        assert re.search(expected, trace.error), trace.error


def test_past_the_step_budget_a_program_gets_an_empty_reply_cut_for_length(tmp_path):
    command = program(tmp_path, """
        import json, os, urllib.request
        task, turns = input(), 0
        while True:  # a program that never stops on its own
            body = json.dumps({"messages": [{"role": "user", "content": task}]}).encode()
            out = json.load(urllib.request.urlopen(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body))
            turns += 1
            if out["choices"][0]["finish_reason"] == "length" and not out["choices"][0]["message"]["content"]:
                break
        print(turns)
    """)
    env = env_for(command)
    [[trace]] = run_attempts(env.tasks("train")[:1], program_harness(), ScriptedPolicy(lambda m: "thinking"), env,
                             max_steps=3)
    assert trace.error is None and trace.stop_reason == "step_cap" and len(trace.model_calls) == 3


def test_the_endpoint_routes_by_path_bearer_or_header_and_refuses_unknown_sessions():
    endpoint = ModelEndpoint()
    try:
        channel = ModelChannel("abc")
        endpoint.register(channel)
        import threading

        def answer_all():
            for _ in range(3):
                pending = channel.next(5)
                pending.answer({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                             "finish_reason": "stop"}], "id": "x", "model": "m"})

        threading.Thread(target=answer_all, daemon=True).start()
        body = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
        for url, headers in [(endpoint.base_url("abc"), {}), (endpoint.url + "/v1", {"Authorization": "Bearer abc"}),
                             (endpoint.url + "/v1", {"X-Session-Id": "abc"})]:
            req = urllib.request.Request(url + "/chat/completions", body, headers)
            assert json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"] == "hi"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(endpoint.base_url("nope") + "/chat/completions", body))
        assert err.value.code == 404 and "no episode with session 'nope'" in err.value.read().decode()
        models = json.load(urllib.request.urlopen(endpoint.url + "/v1/models"))
        assert models["data"][0]["id"] == "coevo"
        channel.close("over")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(endpoint.base_url("abc") + "/chat/completions", body))
        assert err.value.code == 503
    finally:
        endpoint.close()


@pytest.mark.slow
def test_train_py_runs_a_round_of_an_openai_program_as_the_docs_write_it(tmp_path):
    record = one_round(tmp_path, "env=program", "harness=program", "val_limit=1", "rollout.max_new_tokens=8",
                       "evolution.stat_tasks=2", "evolution.stat_budget=4", cwd=ROOT)  # the command's path is relative
    assert record["train"]["n_traces"] == 4 and record["infra_failures"]["count"] == 0
