"""The runtime: hook order, exact token ids in traces, batching, and failures that stay local."""

import threading
import time
from dataclasses import dataclass, field

import pytest

from coevo.agent import Job, ScriptedPolicy, run_attempts, run_episode, run_episodes
from coevo.agent.policy import Policy, byte_ids
from coevo.envs.arithmetic import ArithmeticEnv, calculator_solver
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.harness import Dimension, Hook, Processor
from coevo.harness import events as ev
from coevo.harness.defaults import base_harness
from coevo.harness.events import HOOK_INPUT
from coevo.harness.library import PythonExecutor, ToolRegistry
from coevo.harness.processor import Param

ORDER = "hook_order"


def recorder(hook: Hook) -> Processor:
    cls = type(
        f"Record_{hook.value}",
        (Processor,),
        {
            "kind": f"record_{hook.value}",
            "hook": hook,
            "dimension": Dimension.OBSERVABILITY,
            "consumes": HOOK_INPUT[hook],
            "produces": HOOK_INPUT[hook],
            "process": lambda self, e: (e.state.memory.setdefault(ORDER, []).append(self.hook.value), e)[1],
        },
    )
    return cls()


@dataclass
class FakeSession(EnvSession):
    task: Task
    fail_on: str = ""
    observation: str = "do the thing"
    done: bool = False
    tools: dict = field(default_factory=lambda: {
        "echo": ev.ToolSpec("echo", "echo"), "hang": ev.ToolSpec("hang", "hangs"),
        "boom": ev.ToolSpec("boom", "raises")})

    def call_tool(self, name, arguments):
        if name == "hang":
            time.sleep(30)
        if name == "boom":
            raise RuntimeError("tool exploded")
        return ev.ToolResult(f"echo:{arguments.get('x')}")

    def verify(self, answer):
        if self.fail_on == "verify":
            raise ValueError("verifier broke")
        return Score(float(answer == self.task.answer), answer == self.task.answer)

    def close(self):
        pass


class FakeEnv(Env):
    name = "fake"

    def __init__(self, fail_on: dict[str, str] | None = None):
        self.fail_on = fail_on or {}

    def tasks(self, split):
        return [Task(f"t{i}", "fake", f"task {i}", split, answer="42") for i in range(4)]

    def reset(self, task):
        if self.fail_on.get(task.task_id) == "reset":
            raise ConnectionError("env down")
        return FakeSession(task, self.fail_on.get(task.task_id, ""))


def tool_then_answer(tool: str):
    def respond(messages):
        if messages[-1]["role"] == "tool":
            return "<answer>42</answer>"
        return f'<tool_call>{{"name": "{tool}", "arguments": {{"x": 1}}}}</tool_call>'
    return respond


def echo_forever(messages):
    """A new echo call every step (its argument is the conversation's length), never an answer."""
    return f'<tool_call>{{"name": "echo", "arguments": {{"x": {len(messages)}}}}}</tool_call>'


def test_hooks_fire_in_order():
    h = base_harness()
    for hook in Hook:
        h = h.insert(recorder(hook), index=0 if hook is not Hook.AFTER_MODEL else len(h.at(hook)))
    env = FakeEnv()
    trace = run_episode(env.tasks("test")[0], h, ScriptedPolicy(tool_then_answer("echo")), env)
    step_with_tool = ["step_start", "before_model", "after_model", "before_tool", "after_tool", "step_end"]
    step_answer = ["step_start", "before_model", "after_model", "step_end"]
    expected = ["task_start", *step_with_tool, *step_answer, "task_end"]
    assert [e["hook"] for e in trace.events] == expected
    assert trace.passed and trace.final_answer == "42" and trace.stop_reason == "answer"
    assert trace.tool_calls[0].output == "echo:1"
    assert trace.messages[-1] == {"role": "assistant", "content": "<answer>42</answer>"}


def test_trace_keeps_exact_token_ids_and_costs():
    env = ArithmeticEnv(n_tasks=10)
    task = env.tasks("test")[0]
    policy = ScriptedPolicy(calculator_solver)
    trace = run_episode(task, base_harness(), policy, env)
    assert trace.passed and trace.reward == 1.0
    assert len(trace.model_calls) == 2
    for call in trace.model_calls:
        assert call.completion_ids == byte_ids(call.text)
        assert call.sampler_logprobs == [0.0] * len(call.completion_ids)
        assert call.messages[0]["role"] == "system"
    total = sum(len(c.prompt_ids) for c in trace.model_calls)
    assert trace.cost["prompt_tokens"] == total
    assert trace.cost["completion_tokens"] == sum(len(c.completion_ids) for c in trace.model_calls)
    assert trace.harness_id == base_harness().id and trace.model_version == "scripted"
    assert trace.to_dict() == type(trace).from_dict(trace.to_dict()).to_dict()


def test_model_calls_are_batched_across_episodes():
    env = ArithmeticEnv(n_tasks=30)
    tasks = env.tasks("train")
    policy = ScriptedPolicy(calculator_solver)
    traces = run_episodes([Job(t, base_harness()) for t in tasks], policy, env, batch_size=8)
    assert [t.task_id for t in traces] == [t.task_id for t in tasks]
    assert all(t.passed for t in traces)
    # two model calls per episode, served in full batches of 8 (except the remainder)
    assert sum(policy.batch_sizes) == 2 * len(tasks)
    assert max(policy.batch_sizes) == 8 and len(policy.batch_sizes) <= 2 * (len(tasks) // 8 + 1)


def test_env_that_raises_fails_only_its_episode():
    env = FakeEnv({"t1": "reset", "t2": "verify"})
    jobs = [Job(t, base_harness()) for t in env.tasks("test")]
    traces = run_episodes(jobs, ScriptedPolicy(tool_then_answer("echo")), env)
    by_id = {t.task_id: t for t in traces}
    assert "env reset: ConnectionError: env down" in by_id["t1"].error
    assert "env verify: ValueError: verifier broke" in by_id["t2"].error
    assert not by_id["t1"].passed and not by_id["t2"].trainable
    assert by_id["t0"].passed and by_id["t3"].passed and by_id["t0"].error is None


def test_tool_that_raises_fails_the_episode():
    env = FakeEnv()
    trace = run_episode(env.tasks("test")[0], base_harness(), ScriptedPolicy(tool_then_answer("boom")), env)
    assert trace.error == "env tool 'boom': RuntimeError: tool exploded"
    assert trace.stop_reason == "error" and trace.reward == 0.0


def test_tool_that_hangs_times_out_and_episode_continues():
    env = FakeEnv()
    h = base_harness().set_param("tool_timeout", "default_s", 0.3)
    start = time.perf_counter()
    traces = run_episodes([Job(t, h) for t in env.tasks("test")], ScriptedPolicy(tool_then_answer("hang")), env)
    assert time.perf_counter() - start < 5  # four hung tools overlap, none is waited for
    for trace in traces:
        assert trace.error is None
        assert trace.tool_calls[0].error == "tool timed out after 0.3 s"
        assert trace.messages[-2]["content"].startswith("Error: tool timed out")
        assert not trace.trainable  # infra_error_filter keeps timed-out episodes out of training
        assert trace.passed  # the model answered after the timeout


class Exploding(Processor):
    kind = "exploding"
    hook = Hook.STEP_START
    dimension = Dimension.CONTROL
    consumes = produces = ev.StepStartEvent

    def process(self, event):
        if event.state.task.task_id == "t2":
            raise KeyError("bad processor")
        return event


class WrongType(Processor):
    kind = "wrong_type"
    hook = Hook.STEP_END
    dimension = Dimension.CONTROL
    consumes = produces = ev.StepEndEvent

    def process(self, event):
        return "not an event"


def test_processor_that_raises_fails_only_its_episode():
    env = FakeEnv()
    h = base_harness().insert(Exploding())
    traces = run_episodes([Job(t, h) for t in env.tasks("test")], ScriptedPolicy(tool_then_answer("echo")), env)
    bad = [t for t in traces if t.error]
    assert [t.task_id for t in bad] == ["t2"]
    assert bad[0].error == "processor 'exploding' at step_start: KeyError: 'bad processor'"
    assert sum(t.passed for t in traces) == 3


def test_processor_returning_wrong_type_is_caught():
    env = FakeEnv()
    harness = base_harness().insert(WrongType())
    trace = run_episode(env.tasks("test")[0], harness, ScriptedPolicy(tool_then_answer("echo")), env)
    assert "processor 'wrong_type' at step_end: ProcessorContractError" in trace.error


def test_policy_failure_fails_the_batch_episodes_not_the_run():
    class Broken(Policy):
        model_version = "broken"

        def generate(self, requests):
            raise RuntimeError("CUDA out of memory")

    env = FakeEnv()
    traces = run_episodes([Job(t, base_harness()) for t in env.tasks("test")], Broken(), env)
    assert len(traces) == 4 and all("policy: RuntimeError: CUDA out of memory" == t.error for t in traces)


def test_unknown_tool_and_processor_tools():
    env = FakeEnv()
    h = base_harness().insert(PythonExecutor(), index=0)
    code = '<tool_call>{"name": "python", "arguments": {"code": "print(40 + 2)"}}</tool_call>'

    def respond(messages):
        if messages[-1]["role"] == "tool":
            return f"<answer>{messages[-1]['content'].strip()}</answer>"
        return code

    trace = run_episode(env.tasks("test")[0], h, ScriptedPolicy(respond), env)
    assert trace.tool_calls[0].name == "python" and trace.tool_calls[0].output.strip() == "42"
    assert trace.passed
    # a tool that is not enabled is answered with an error naming the enabled ones
    h2 = base_harness().replace("tool_registry", ToolRegistry(enabled=["echo"]))
    trace2 = run_episode(env.tasks("test")[0], h2, ScriptedPolicy(tool_then_answer("boom")), env)
    assert trace2.error is None and "unknown tool 'boom'" in trace2.tool_calls[0].error


def test_step_budget_and_no_action_stop_episodes():
    env = FakeEnv()
    looping = ScriptedPolicy(echo_forever)
    trace = run_episode(env.tasks("test")[0], base_harness().set_param("step_budget", "max_steps", 3), looping, env)
    assert trace.stop_reason == "step_budget" and len(trace.model_calls) == 3
    silent = ScriptedPolicy(lambda m: "hmm")
    trace = run_episode(env.tasks("test")[0], base_harness(), silent, env)
    # parse_retry (max_retries=1) reminds once, then the episode ends for lack of an action
    assert trace.stop_reason == "no_action" and len(trace.model_calls) == 2
    assert "could not find a tool call" in trace.model_calls[1].messages[-1]["content"]


def test_hard_step_cap_without_budget_processor():
    env = FakeEnv()
    looping = ScriptedPolicy(echo_forever)
    h = base_harness().remove("step_budget")
    trace = run_episode(env.tasks("test")[0], h, looping, env, max_steps=5)
    assert trace.stop_reason == "step_cap" and len(trace.model_calls) == 5


def test_no_threads_leak_from_normal_runs():
    before = threading.active_count()
    env = ArithmeticEnv(n_tasks=10)
    run_episodes([Job(t, base_harness()) for t in env.tasks("train")], ScriptedPolicy(calculator_solver), env)
    assert threading.active_count() <= before


def test_model_calls_record_the_sampling_parameters_that_produced_them():
    """The harness owns sampling and may change it per call: each call keeps what it was sampled
    with, so the trainer can score its tokens at that temperature."""
    from coevo.harness.library import TemperatureSchedule

    env = FakeEnv()
    h = (base_harness().set_param("sampling", "temperature", 0.5).set_param("sampling", "max_new_tokens", 64)
         .set_param("sampling", "top_p", 0.9).insert(TemperatureSchedule(increase=0.25)))
    replies = iter(["no idea", "<answer>42</answer>"])  # a parse failure, then an answer
    trace = run_episode(env.tasks("test")[0], h, ScriptedPolicy(lambda m: next(replies)), env)
    assert trace.passed and len(trace.model_calls) == 2
    first, second = trace.model_calls
    assert (first.temperature, first.top_p, first.max_new_tokens) == (0.5, 0.9, 64)
    assert (second.temperature, second.top_p, second.max_new_tokens) == (0.75, 0.9, 64)  # the schedule's bump
    assert [first.logprob_temperature(), second.logprob_temperature()] == [0.5, 0.75]
    greedy = run_episode(env.tasks("test")[0], base_harness(), ScriptedPolicy(tool_then_answer("echo")), env)
    assert [c.temperature for c in greedy.model_calls] == [0.0, 0.0]
    assert [c.logprob_temperature() for c in greedy.model_calls] == [1.0, 1.0]  # greedy log-probs are at T = 1
    assert type(trace).from_dict(trace.to_dict()).model_calls == trace.model_calls


class RaisingTool(Processor):
    """A harness-provided tool whose implementation crashes (tool infrastructure)."""

    kind = "raising_tool"
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = ev.TaskStartEvent

    def provided_tools(self):
        return [ev.ToolSpec("flaky", "crashes", provider=self.name)]

    def process(self, event):
        for spec in self.provided_tools():
            event.state.available_tools[spec.name] = spec
        return event

    def call_tool(self, call_name, arguments, timeout_s):
        raise OSError("sandbox could not start")


def test_infrastructure_failures_are_marked_on_the_trace():
    """Policy, environment and tool crashes are infrastructure failures; a processor's crash is the
    harness's own defect, and parse errors or wrong answers are the model's."""

    class Broken(Policy):
        model_version = "broken"

        def generate(self, requests):
            raise MemoryError("out of memory")

    env = FakeEnv({"t1": "reset", "t2": "verify"})
    tasks = env.tasks("test")
    by_id = {t.task_id: t for t in run_episodes([Job(t, base_harness()) for t in tasks],
                                                  ScriptedPolicy(tool_then_answer("echo")), env)}
    assert (by_id["t1"].error_source, by_id["t2"].error_source) == ("env", "env")
    policy = run_episode(tasks[0], base_harness(), Broken(), env)
    env_tool = run_episode(tasks[0], base_harness(), ScriptedPolicy(tool_then_answer("boom")), env)
    h = base_harness().insert(RaisingTool(), index=0)
    tool = run_episode(tasks[0], h, ScriptedPolicy(tool_then_answer("flaky")), env)
    processor = run_episode(tasks[0], base_harness().insert(WrongType()), ScriptedPolicy(tool_then_answer("echo")),
                            env)
    wrong = run_episode(tasks[0], base_harness(), ScriptedPolicy(lambda m: "<answer>41</answer>"), env)
    silent = run_episode(tasks[0], base_harness(), ScriptedPolicy(lambda m: "hmm"), env)
    assert [t.error_source for t in (policy, env_tool, tool, processor)] == ["policy", "env", "tool", "processor"]
    assert tool.error == "tool 'flaky' of processor 'raising_tool': OSError: sandbox could not start"
    assert all(t.infra_failure and not t.trainable for t in (by_id["t1"], by_id["t2"], policy, env_tool, tool))
    assert not processor.infra_failure and not processor.trainable
    for model_failure in (wrong, silent, by_id["t0"]):
        assert model_failure.error is None and model_failure.error_source is None and not model_failure.infra_failure
    assert not wrong.passed and not silent.passed


class RecordingPolicy(ScriptedPolicy):
    """A scripted policy that keeps every request it was sent."""

    def __init__(self, respond):
        super().__init__(respond)
        self.requests = []

    def generate(self, requests):
        self.requests.extend(requests)
        return super().generate(requests)


class Prefill(Processor):
    """Prefills the first reply of an episode with ``prefix`` (what ``tool_choice`` does)."""

    kind = "prefill"
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.TOOLS
    consumes = produces = ev.ModelRequestEvent
    params = (Param("prefix", "str", '<tool_call>{"name": "echo", "arguments": {', "the reply's start"),)

    def process(self, event):
        if event.state.step == 0:
            event.reply_prefix = self.config["prefix"]
        return event


def test_reply_prefix_is_prefilled_parsed_with_the_generation_and_kept_in_history():
    """A before_model processor prefills the first reply: the policy gets the prefix, generates
    only the rest, and the parser, the history and the next prompt see the whole call, which runs."""
    prefix = '<tool_call>{"name": "echo", "arguments": {'

    def respond(messages):  # what the model writes after the prefix, then the answer
        return "<answer>42</answer>" if messages[-1]["role"] == "tool" else '"x": 7}}</tool_call>'

    env = FakeEnv()
    policy = RecordingPolicy(respond)
    h = base_harness().insert(Prefill())
    trace = run_episode(env.tasks("test")[0], h, policy, env)
    assert [r.reply_prefix for r in policy.requests] == [prefix, ""]  # only the first call is forced
    first, second = trace.model_calls
    assert (first.reply_prefix, first.text) == (prefix, '"x": 7}}</tool_call>')
    assert first.reply == prefix + first.text and second.reply_prefix == "" and second.reply == second.text
    # the prompt ends with the prefix; the completion is only what was generated
    assert first.prompt_ids[-len(byte_ids(prefix)):] == byte_ids(prefix)
    assert first.completion_ids == byte_ids(first.text)
    assert trace.cost["completion_tokens"] == len(first.completion_ids) + len(second.completion_ids)
    # the parser saw prefix + text: the call ran, and the history holds the whole reply
    assert [(c.name, c.arguments, c.output) for c in trace.tool_calls] == [("echo", {"x": 7}, "echo:7")]
    assert trace.messages[-3] == {"role": "assistant", "content": prefix + '"x": 7}}</tool_call>'}
    assert policy.requests[1].messages[-2] == trace.messages[-3]
    assert trace.passed and trace.stop_reason == "answer"
    before = [e for e in trace.events if e["hook"] == "before_model"]
    assert before[0]["reply_prefix"] == prefix and "reply_prefix" not in before[1]
    again = type(trace).from_dict(trace.to_dict())
    assert again.model_calls == trace.model_calls and again.model_calls[0].reply_prefix == prefix


def test_a_scripted_reply_that_ignores_the_prefix_is_generated_after_it_whole():
    """A scripted whole reply that starts with the prefix loses it (the model did not generate it);
    one that does not is generated whole after the prefix, so the reply is malformed, as a real
    model's would be."""
    env = FakeEnv()
    h = base_harness().insert(Prefill())
    full = run_episode(env.tasks("test")[0], h, ScriptedPolicy(tool_then_answer("echo")), env)
    assert full.model_calls[0].text == '"x": 1}}</tool_call>' and full.passed
    assert full.model_calls[0].reply == tool_then_answer("echo")([{"role": "user", "content": ""}])
    ignoring = run_episode(env.tasks("test")[0], h, ScriptedPolicy(lambda m: "<answer>42</answer>"), env)
    call = ignoring.model_calls[0]
    assert call.text == "<answer>42</answer>" and call.reply == call.reply_prefix + "<answer>42</answer>"
    (parsed,) = [e for e in ignoring.events if e["hook"] == "after_model"]
    assert parsed["parse_error"].startswith("could not parse tool call") and ignoring.tool_calls == []
    assert parsed["answer"] == "42"  # the broken call runs nothing; answer extraction still reads the tags


def test_traces_recorded_before_reply_prefixes_load():
    env = FakeEnv()
    trace = run_episode(env.tasks("test")[0], base_harness(), ScriptedPolicy(tool_then_answer("echo")), env)
    old = trace.to_dict()
    for call in old["model_calls"]:
        del call["reply_prefix"]
    loaded = type(trace).from_dict(old)
    assert [c.reply_prefix for c in loaded.model_calls] == ["", ""]
    assert loaded.to_dict() == trace.to_dict()


class BadPrefix(Processor):
    kind = "bad_prefix"
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.TOOLS
    consumes = produces = ev.ModelRequestEvent

    def process(self, event):
        event.reply_prefix = None
        return event


def test_a_processor_setting_a_non_string_prefix_fails_only_its_episode():
    env = FakeEnv()
    policy = ScriptedPolicy(tool_then_answer("echo"))
    bad, good = base_harness().insert(BadPrefix()), base_harness()
    traces = run_episodes([Job(env.tasks("test")[0], bad), Job(env.tasks("test")[1], good)], policy, env)
    assert traces[0].error_source == "processor" and "reply_prefix must be a str" in traces[0].error
    assert traces[0].model_calls == [] and traces[1].passed


def test_tool_choice_makes_a_model_that_would_answer_directly_call_the_calculator():
    """A scripted model that answers at once unless its reply was opened as a calculator call (it
    then writes the expression): on the base harness it never calls the tool; with tool_choice
    every episode's first call runs the calculator and the second, free call answers from it."""
    from coevo.envs.arithmetic import CALCULATOR
    from coevo.harness.library import ToolChoice
    from coevo.harness.library.tools import forced_call_prefix

    env = ArithmeticEnv(n_tasks=10)
    tasks = env.tasks("train")[:4]
    seen_prefixes = []

    class Guesser(ScriptedPolicy):
        def generate(self, requests):
            seen_prefixes.extend(r.reply_prefix for r in requests)
            return super().generate(requests)

    def respond(messages):
        if messages[-1]["role"] == "tool":
            return f"<answer>{messages[-1]['content']}</answer>"
        return "<answer>0</answer>"

    def continuing(messages):  # what it writes after an opened calculator call
        if messages[-1]["role"] == "tool":
            return respond(messages)
        expression = messages[-1]["content"].split("What is ")[-1].rstrip("?").strip()
        return forced_call_prefix("calculator", CALCULATOR) + f'{expression}"}}}}</tool_call>'

    plain = run_episodes([Job(t, base_harness()) for t in tasks], Guesser(respond), env)
    assert all(t.tool_calls == [] and not t.passed for t in plain)
    forced_h = base_harness().insert(ToolChoice(tool="calculator"))
    seen_prefixes.clear()
    forced = run_episodes([Job(t, forced_h) for t in tasks], Guesser(continuing), env)
    assert seen_prefixes.count(forced_call_prefix("calculator", CALCULATOR)) == len(tasks)
    for t in forced:
        assert [c.name for c in t.tool_calls] == ["calculator"] and t.tool_calls[0].error is None
        assert [c.reply_prefix for c in t.model_calls] == [forced_call_prefix("calculator", CALCULATOR), ""]
        assert t.final_answer == t.tool_calls[0].output and t.passed


def test_run_attempts_groups_traces_per_task_in_the_order_run_episodes_gives():
    """The jobs run task by task, attempt by attempt, exactly like the job list the callers built
    by hand: a policy that numbers its calls sees them in the same order."""
    env = ArithmeticEnv(n_tasks=12)
    tasks = env.tasks("train")[:4]
    other = base_harness().insert(recorder(Hook.TASK_START), index=0)

    def numbering():
        calls = iter(range(1000))
        return ScriptedPolicy(lambda messages: f"<answer>{next(calls)}</answer>")

    seen = []
    groups = run_attempts(tasks, [base_harness(), other, base_harness(), other], numbering(), env, attempts=3,
                          variant=["base", "v1", "base", "v1"], trace_id=lambda t, a: f"x-{t.task_id}-{a}",
                          batch_size=5, workers=2, max_steps=4, on_trace=seen.append)
    harnesses, variants = [base_harness(), other, base_harness(), other], ["base", "v1", "base", "v1"]
    jobs = [Job(t, h, variant=v, trace_id=f"x-{t.task_id}-{a}")
            for t, h, v in zip(tasks, harnesses, variants, strict=True) for a in range(3)]
    by_hand = run_episodes(jobs, numbering(), env, batch_size=5, workers=2, max_steps=4)
    assert [len(g) for g in groups] == [3, 3, 3, 3] and len(seen) == 12
    flat = [t for g in groups for t in g]
    key = lambda t: (t.trace_id, t.task_id, t.variant, t.harness_id, t.final_answer)  # noqa: E731
    assert [key(t) for t in flat] == [key(t) for t in by_hand]
    assert [g[0].trace_id for g in groups] == [f"x-{t.task_id}-0" for t in tasks]
    assert {t.harness_id for t in groups[1]} == {other.id} and {t.variant for t in groups[1]} == {"v1"}
    assert sorted(t.trace_id for t in seen) == sorted(t.trace_id for t in flat)


def test_run_attempts_shares_one_harness_and_checks_its_arguments():
    env = ArithmeticEnv(n_tasks=10)
    tasks = env.tasks("train")[:2]
    groups = run_attempts(tasks, base_harness(), ScriptedPolicy(calculator_solver), env, attempts=2)
    assert all(t.passed and t.variant == "base" and t.harness_id == base_harness().id for g in groups for t in g)
    assert len({t.trace_id for g in groups for t in g}) == 4  # random ids without ``trace_id``
    assert run_attempts([], base_harness(), ScriptedPolicy(calculator_solver), env, attempts=2) == []
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        run_attempts(tasks, base_harness(), ScriptedPolicy(calculator_solver), env, attempts=0)
    with pytest.raises(ValueError, match="2 tasks, but 1 harnesses and 2 variants"):
        run_attempts(tasks, [base_harness()], ScriptedPolicy(calculator_solver), env)


def test_an_empty_answer_ends_the_episode_and_is_scored():
    """``<answer></answer>`` is the model's empty reply: the episode ends on it, the verifier
    scores it, and ``parse_retry`` does not ask the model again as if nothing had been answered."""
    env = FakeEnv()
    trace = run_episode(env.tasks("test")[0], base_harness(), ScriptedPolicy(lambda messages: "<answer></answer>"), env)
    assert trace.error is None and trace.stop_reason == "answer"
    assert trace.final_answer == "" and not trace.passed and trace.reward == 0.0
    assert len(trace.model_calls) == 1  # no format reminder, no second call
