"""Reference trajectories: gold traces that really run and pass, policy references that must be
genuine, the on-disk store, and the worked demonstration a few-shot edit is made of."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from coevo.agent import Job, ScriptedPolicy, run_episodes
from coevo.envs.arithmetic import ArithmeticEnv, ArithmeticSession, calculator_solver
from coevo.envs.base import Score
from coevo.evolution.reference import (
    HINT,
    ReferenceStore,
    build_references,
    gold_reference,
    hinted_harness,
    is_genuine,
    policy_reference,
    reference_demo,
    required_tools,
)
from coevo.evolution.steps import first_divergence
from coevo.harness.defaults import base_harness
from coevo.harness.events import EpisodeState, ModelOutputEvent, TaskView, ToolCall
from coevo.harness.library import InstructionTemplate, JsonToolCallParser, SelfVerification
from coevo.harness.library.tools import tool_call_text
from tests.aegis_helpers import service


@pytest.fixture(scope="module")
def env() -> ArithmeticEnv:
    return ArithmeticEnv(n_tasks=30, seed=0)


@pytest.fixture(scope="module")
def tasks(env: ArithmeticEnv):
    return env.tasks("train")[:4]


def expression(task) -> str:
    return re.fullmatch(r"What is (.+)\?", task.instruction).group(1)


def bare_answer(messages: list[dict]) -> str:
    """Reads the hint and restates the answer without any tool: passes, but is not genuine."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    answer = re.search(r"The correct answer is (-?\d+)", user).group(1)
    return f"<answer>{answer}</answer>"


def replay(texts: list[str]):
    """A policy that writes ``texts`` one per model call (counting its own assistant turns)."""
    return lambda messages: texts[sum(m["role"] == "assistant" for m in messages)]


def test_gold_reference_runs_the_gold_actions_and_passes(env, tasks) -> None:
    assert tasks
    for task in tasks:
        ref = gold_reference(env, task)
        expr = expression(task)
        assert ref is not None and ref.passed and ref.reward == 1.0
        assert env.reset(task).verify(ref.final_answer).passed
        assert [c.text for c in ref.model_calls] == [
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>',
            f"<answer>{task.answer}</answer>",
        ]
        (record,) = ref.tool_calls
        assert (record.step, record.name, record.output, record.error) == (0, "calculator", str(task.answer), None)
        assert [m["role"] for m in ref.messages] == ["user", "assistant", "tool", "assistant"]
        assert ref.messages[0]["content"] == task.instruction
        assert (ref.stop_reason, ref.trainable, ref.variant) == ("answer", False, "reference")
        assert ref.metrics["reference"] == {"source": "gold", "instruction": task.instruction}
        assert is_genuine(ref, task) == (True, "genuine")


def test_gold_completions_are_what_the_harness_parses_and_replay_identically(env, tasks) -> None:
    task = tasks[0]
    ref = gold_reference(env, task)
    state = EpisodeState(task=TaskView(task.task_id, task.env, task.instruction))
    parsed = JsonToolCallParser().process(ModelOutputEvent(state, text=ref.model_calls[0].text))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("calculator", {"expression": expression(task)})]
    assert parsed.parse_error is None
    policy = ScriptedPolicy(replay([c.text for c in ref.model_calls]))
    trace = run_episodes([Job(task, base_harness())], policy, env)[0]
    assert trace.passed and trace.stop_reason == "answer"
    assert first_divergence(trace, ref) is None


class RefusingSession(ArithmeticSession):
    def verify(self, answer):
        return Score(0.0, False)


class RefusingEnv(ArithmeticEnv):
    """Its verifier refuses everything (a gold path that no longer solves the task)."""

    def reset(self, task):
        return RefusingSession(task, observation=task.instruction)


def test_no_gold_reference_without_gold_actions_or_when_the_verifier_refuses(env, tasks) -> None:
    task = tasks[0]
    assert gold_reference(env, dataclasses.replace(task, gold_actions=())) is None
    assert gold_reference(RefusingEnv(), task) is None
    broken = dataclasses.replace(task, gold_actions=(ToolCall("calculator", {"expression": "1 / 0"}),))
    assert gold_reference(env, broken) is None


def test_references_refuse_non_train_tasks(env, tmp_path) -> None:
    val = env.tasks("val")[0]
    with pytest.raises(ValueError, match="split 'val'.*only split 'train'"):
        gold_reference(env, val)
    with pytest.raises(ValueError, match="only split 'train'"):
        policy_reference(val, base_harness(), service(ScriptedPolicy(calculator_solver), env), attempts=1)
    store = ReferenceStore(tmp_path / "refs")
    with pytest.raises(ValueError, match="only split 'train'"):
        build_references(env, [env.tasks("train")[0], val], store)
    assert len(store) == 0  # refused before anything was built


def test_required_tools() -> None:
    task = ArithmeticEnv(n_tasks=30, seed=0).tasks("train")[0]
    assert required_tools(task) == {"calculator"}
    read_only = dataclasses.replace(task, gold_actions=(), capabilities=("tool:python", "skill:sudoku", "act"))
    assert required_tools(read_only) == {"python", "act"}
    assert required_tools(read_only, offered=["python", "calculator"]) == {"python"}


def test_a_bare_answer_passes_but_is_not_genuine(env, tasks) -> None:
    task = tasks[0]
    policy = ScriptedPolicy(lambda m: f"<answer>{task.answer}</answer>")
    trace = run_episodes([Job(task, base_harness())], policy, env)[0]
    assert trace.passed
    ok, reason = is_genuine(trace, task)
    assert not ok and reason == "required tool(s) ['calculator'] never called without error"
    # a tool call after the answer does not make it genuine either
    late = ScriptedPolicy(replay([f"<answer>{task.answer}</answer>", tool_call_text(task.gold_actions[0]),
                                  f"<answer>{task.answer}</answer>"]))
    harness = base_harness().insert(SelfVerification(), after="answer_extraction")
    trace = run_episodes([Job(task, harness)], late, env)[0]
    assert trace.passed and [r.name for r in trace.tool_calls] == ["calculator"]
    assert is_genuine(trace, task) == (False, "the first model call states the answer before any tool call")


def test_tool_free_tasks_need_reasoning_besides_the_answer(env, tasks) -> None:
    task = dataclasses.replace(tasks[0], gold_actions=(), capabilities=())
    terse = run_episodes([Job(task, base_harness())], ScriptedPolicy(lambda m: f"<answer>{task.answer}</answer>"),
                         env)[0]
    assert terse.passed and is_genuine(terse, task) == (False, "the answer is restated without reasoning")
    worked = ScriptedPolicy(lambda m: f"First multiply, then add and subtract in order. <answer>{task.answer}</answer>")
    trace = run_episodes([Job(task, base_harness())], worked, env)[0]
    assert is_genuine(trace, task) == (True, "genuine")
    with pytest.raises(ValueError, match="trace is for task"):
        is_genuine(trace, tasks[1])


def test_hinted_harness_puts_the_answer_in_the_task_message(env, tasks) -> None:
    task = tasks[0]
    hint = HINT.replace("{answer}", str(task.answer))
    hinted = hinted_harness(base_harness(), task)
    seen: list[list[dict]] = []
    policy = ScriptedPolicy(lambda m: (seen.append(m), calculator_solver(m))[1])
    run_episodes([Job(task, hinted)], policy, env)
    users = [m["content"] for m in seen[0] if m["role"] == "user"]
    assert users == [f"{task.instruction}\n\n{hint}"]
    existing = base_harness().insert(InstructionTemplate(template="Task: {instruction}"))
    again = hinted_harness(existing, task)
    assert again.get("instruction_template").config["template"] == f"Task: {{instruction}}\n\n{hint}"
    assert len(again) == len(existing)


def test_policy_reference_keeps_the_first_genuine_passing_attempt(env, tasks) -> None:
    task = tasks[1]
    assert policy_reference(task, base_harness(), service(ScriptedPolicy(bare_answer), env), attempts=3) is None
    first_turns = []

    def bare_then_solve(messages):
        if not any(m["role"] == "assistant" for m in messages):
            first_turns.append(1)
            if len(first_turns) == 1:
                return bare_answer(messages)
        return calculator_solver(messages)

    ref = policy_reference(task, base_harness(), service(ScriptedPolicy(bare_then_solve), env), attempts=2)
    assert ref is not None and ref.passed and ref.trace_id == f"policy:{task.task_id}:1"
    assert is_genuine(ref, task) == (True, "genuine")
    assert (ref.trainable, ref.variant) == (False, "reference")
    assert ref.metrics["reference"] == {"source": "policy", "instruction": task.instruction}
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        policy_reference(task, base_harness(), service(ScriptedPolicy(calculator_solver), env), attempts=0)


def test_reference_demo_has_the_runtime_turn_structure(env, tasks) -> None:
    """A demonstration is the turns of an episode: the task, the assistant's tool call, the tool's
    result in its own turn, the assistant's answer; the model is never shown writing a tool result."""
    task = tasks[0]
    call = tool_call_text(task.gold_actions[0])
    gold = reference_demo(gold_reference(env, task))
    assert gold == [
        {"role": "user", "content": task.instruction},
        {"role": "assistant", "content": call},
        {"role": "tool", "name": "calculator", "content": str(task.answer)},
        {"role": "assistant", "content": f"<answer>{task.answer}</answer>"},
    ]
    ref = policy_reference(task, base_harness(), service(ScriptedPolicy(calculator_solver), env), attempts=1)
    demo = reference_demo(ref)
    assert demo[0] == {"role": "user", "content": task.instruction}  # never the hinted message
    assert [t["role"] for t in demo] == ["user", "assistant", "tool", "assistant"]
    assert demo[2] == {"role": "tool", "name": "calculator", "content": str(task.answer)}
    assert demo[3]["content"] == f"The calculator says {task.answer}.\n<answer>{task.answer}</answer>"
    # the assistant turns are exactly what the model wrote, nothing the runtime added
    assert [t["content"] for t in demo if t["role"] == "assistant"] == [c.text for c in ref.model_calls]


def test_a_demo_shows_the_turns_a_real_episode_with_the_same_tool_call_produces(env, tasks) -> None:
    """The demonstration equals, turn for turn, the history of a real episode whose model writes the
    same replies; the few_shot processor puts exactly those turns before the next task, where the
    policy's chat rendering shows them as it shows a real episode's."""
    from coevo.harness.events import DEMO
    from coevo.harness.library import FewShotDemos
    from coevo.harness.library.context import first_user_index
    from coevo.policy.chat import to_template_messages

    task, other = tasks[1], tasks[2]
    demo = reference_demo(gold_reference(env, task))
    replies = [t["content"] for t in demo if t["role"] == "assistant"]
    episode = run_episodes([Job(task, base_harness())], ScriptedPolicy(replay(replies)), env)[0]
    assert episode.passed and len(episode.tool_calls) == 1
    real = episode.messages[first_user_index(episode.messages):]
    assert real == demo
    def solve_current(messages: list[dict]) -> str:  # calculator_solver, on the last task rather than a demo's
        return calculator_solver(messages[-1:] if messages[-1]["role"] == "tool" else [messages[-1]])

    shown = run_episodes([Job(other, base_harness().insert(FewShotDemos(turns=demo)))],
                         ScriptedPolicy(solve_current), env)[0]
    request = shown.model_calls[0].messages
    assert shown.passed and request[0]["role"] == "system"
    shown_demo = request[1 : 1 + len(demo)]
    assert all(m.pop(DEMO) for m in shown_demo)  # each marked as a demonstration (coevo.agent.demos)
    assert shown_demo == demo and request[1 + len(demo)]["content"] == other.instruction
    for tool_role in (False, True):
        assert to_template_messages(request[1 : 1 + len(demo)], tool_role) == to_template_messages(real, tool_role)


def test_store_round_trips_and_survives_a_reopen(env, tasks, tmp_path) -> None:
    store = ReferenceStore(tmp_path / "refs")
    ref = gold_reference(env, tasks[0])
    assert tasks[0].task_id not in store and store.get(tasks[0].task_id) is None
    store.put(tasks[0].task_id, ref)
    renamed = dataclasses.replace(ref, task_id="reasoning/chain_sum/abc")
    store.put("reasoning/chain_sum/abc", renamed)
    reopened = ReferenceStore(tmp_path / "refs")
    assert tasks[0].task_id in reopened and "reasoning/chain_sum/abc" in reopened
    assert reopened.get(tasks[0].task_id).to_dict() == json.loads(json.dumps(ref.to_dict()))
    assert reopened.get("reasoning/chain_sum/abc").task_id == "reasoning/chain_sum/abc"
    long_id = "x/" * 300
    store.put(long_id, dataclasses.replace(ref, task_id=long_id))
    assert ReferenceStore(tmp_path / "refs").get(long_id).task_id == long_id
    store.put(long_id, dataclasses.replace(ref, task_id=long_id))  # overwrites in place
    assert len(reopened) == 3 and not list((tmp_path / "refs").glob("*.tmp"))
    assert sorted(reopened.task_ids()) == sorted([tasks[0].task_id, "reasoning/chain_sum/abc", long_id])
    with pytest.raises(ValueError, match="trace is for task"):
        store.put("other", ref)
    (tmp_path / "refs" / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a stored trace"):
        store.get("broken")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        ReferenceStore(tmp_path / "file")


def test_build_references_gold_first_then_policy_then_cache(env, tasks, tmp_path) -> None:
    no_gold = dataclasses.replace(tasks[1], gold_actions=())
    store = ReferenceStore(tmp_path / "refs")
    only_gold = build_references(env, [tasks[0], no_gold], store)
    assert list(only_gold) == [tasks[0].task_id]
    assert only_gold[tasks[0].task_id].metrics["reference"]["source"] == "gold"
    built = build_references(env, [tasks[0], no_gold], store, harness=base_harness(),
                             rollouts=service(ScriptedPolicy(calculator_solver), env), attempts=1)
    assert built[no_gold.task_id].metrics["reference"]["source"] == "policy"
    assert built[tasks[0].task_id].to_dict() == only_gold[tasks[0].task_id].to_dict()
    assert sorted(store.task_ids()) == sorted([tasks[0].task_id, no_gold.task_id])

    def never(messages):
        raise AssertionError("cached references must not run the policy")

    cached = build_references(env, [tasks[0], no_gold], store, harness=base_harness(),
                              rollouts=service(ScriptedPolicy(never), env))
    assert {k: v.to_dict() for k, v in cached.items()} == {k: v.to_dict() for k, v in built.items()}
    with pytest.raises(ValueError, match="harness and rollouts go together"):
        build_references(env, [tasks[0]], store, harness=base_harness())
