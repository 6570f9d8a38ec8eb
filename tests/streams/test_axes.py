"""Axis functions: the tools axis exposes exactly a stage's tools plus distractors (also to an
evolved harness, also against an edit that enables '*'), the skills axis serves a growing pool
through a tool, and the agents axis says what the runtime lacks."""

from __future__ import annotations

import re

import pytest

from coevo.agent.firing import fire
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_episode
from coevo.harness.defaults import base_harness
from coevo.harness.events import EpisodeState, TaskStartEvent, TaskView
from coevo.harness.harness import Harness
from coevo.harness.hooks import Hook
from coevo.harness.library import InstructionTemplate, PythonExecutor, SlidingWindowMemory
from coevo.harness.library.stages import DISTRACTORS, SKILL_TOOL
from coevo.streams.axes import (
    agents_harness,
    distractor_names,
    exposed_tools,
    get_axis,
    skills_harness,
    tools_harness,
    with_agent_capabilities,
)
from coevo.streams.construct import build_stream
from coevo.streams.skills import PROCEDURES, skill_document
from tests.streams.toolbox import ToolboxEnv, make_tasks

UNIVERSE = frozenset({"add", "mul", "neg"})


@pytest.fixture(scope="module")
def env():
    return ToolboxEnv()


@pytest.fixture(scope="module")
def task(env):
    return env.tasks("train")[0]


def test_each_stage_exposes_exactly_its_tools_plus_growing_distractors(env, task):
    stream = build_stream(make_tasks(), prefix="tool:", stages=3)
    seen = []
    for s in range(stream.n_stages):
        h = tools_harness(base_harness(), stream.cumulative[s], UNIVERSE, 2 * s)
        fake = list(DISTRACTORS)[: 2 * s]
        assert exposed_tools(h, env, task) == sorted([*stream.cumulative[s], *fake])
        assert h.get("tool_registry").config["enabled"] == sorted([*stream.cumulative[s], *fake])
        seen.append(set(fake))
    assert seen[0] == set() and seen[0] < seen[1] < seen[2]  # distractors only grow


def test_the_gate_withholds_unreleased_tools_even_when_evolution_enables_everything(env, task):
    h = tools_harness(base_harness(), frozenset({"add"}), UNIVERSE, 1)
    opened = h.set_param("tool_registry", "enabled", ["*"])
    assert exposed_tools(opened, env, task) == ["add", "unit_converter"]
    # a harness-provided tool of the axis is gated too
    universe = UNIVERSE | {"python"}
    with_python = base_harness().insert(PythonExecutor(), index=0)
    assert "python" not in exposed_tools(tools_harness(with_python, frozenset({"add"}), universe), env, task)
    assert "python" in exposed_tools(tools_harness(with_python, frozenset({"add", "python"}), universe), env, task)


def test_the_axis_keeps_evolved_processors_and_is_idempotent(env, task):
    start = tools_harness(base_harness(), frozenset({"add"}), UNIVERSE, 0)
    evolved = start.insert(InstructionTemplate(template="Use a tool: {instruction}")).insert(SlidingWindowMemory())
    grown = tools_harness(evolved, frozenset({"add", "mul"}), UNIVERSE, 1)
    assert {"instruction_template", "sliding_window"} <= {p.kind for p in grown}
    assert grown.get("instruction_template").config["template"] == "Use a tool: {instruction}"
    assert exposed_tools(grown, env, task) == ["add", "mul", "unit_converter"]
    assert grown.parent_id is not None  # the change is an edit in the lineage
    assert tools_harness(grown, frozenset({"add", "mul"}), UNIVERSE, 1).id == grown.id
    assert [p.kind for p in grown].count("stage_tools") == 1


def test_the_registry_keeps_non_axis_tools_it_listed_by_name(env, task):
    h = base_harness().set_param("tool_registry", "enabled", ["add", "skill_lookup"])
    h = tools_harness(h, frozenset({"add", "mul"}), UNIVERSE, 1)
    assert h.get("tool_registry").config["enabled"] == ["add", "mul", "unit_converter", "skill_lookup"]


def test_a_distractor_call_answers_with_an_error(env, task):
    h = tools_harness(base_harness(), frozenset({"add"}), UNIVERSE, 1)
    call = '<tool_call>{"name": "unit_converter", "arguments": {"value": 1, "from_unit": "m", "to_unit": "cm"}}</tool_call>'
    policy = ScriptedPolicy(lambda m: "<answer>0</answer>" if m[-1]["role"] == "tool" else call)
    trace = run_episode(task, h, policy, env, max_steps=4)
    assert trace.error is None
    assert [(c.name, c.error is not None) for c in trace.tool_calls] == [("unit_converter", True)]
    assert "nothing relevant" in trace.tool_calls[0].error


def test_bad_tool_axis_arguments():
    with pytest.raises(ValueError, match="not in the axis universe"):
        tools_harness(base_harness(), frozenset({"div"}), UNIVERSE, 0)
    with pytest.raises(ValueError, match="distractors must be an integer in 0..10"):
        tools_harness(base_harness(), frozenset({"add"}), UNIVERSE, 11)
    assert distractor_names(2, exclude={"unit_converter"}) == ["web_search", "date_diff"]
    with pytest.raises(ValueError, match="axis must be one of"):
        get_axis("memory")


def _start(harness, env, task) -> EpisodeState:
    session = env.reset(task)
    state = EpisodeState(task=TaskView(task.task_id, task.env, task.instruction, task.split),
                         messages=[{"role": "user", "content": session.observation}],
                         available_tools=dict(session.tools))
    fire(harness, Hook.TASK_START, TaskStartEvent(state), [])
    return state


def test_skills_are_retrieved_through_a_tool_never_injected(env, task):
    h = skills_harness(base_harness(), frozenset({"add", "mul"}), frozenset({"add", "mul", "neg"}))
    state = _start(h, env, task)
    assert SKILL_TOOL in state.tools
    prompt = " ".join(m["content"] for m in state.messages)
    assert skill_document("add") not in prompt and skill_document("mul") not in prompt
    library = h.get("skill_library")
    assert library.call_tool(SKILL_TOOL, {"query": "mul"}, 1.0).output == f"Skill mul:\n{skill_document('mul')}"
    assert "No skill matches" in library.call_tool(SKILL_TOOL, {"query": "neg"}, 1.0).output  # not released
    grown = skills_harness(h, frozenset({"add", "mul", "neg"}), frozenset({"add", "mul", "neg"}))
    assert sorted(grown.get("skill_library").config["skills"]) == ["add", "mul", "neg"]
    assert [p.kind for p in grown].count("skill_library") == 1


def test_keyword_lookup_ranks_the_matching_note_first():
    h = skills_harness(base_harness(), frozenset(PROCEDURES), frozenset(PROCEDURES))
    library = h.get("skill_library")
    assert library.lookup("how do I count the letters in a word") == ["letter_counting"]
    assert library.lookup("sudoku grid") == ["mini_sudoku"]
    assert library.lookup("Family Relationships") == ["family_relationships"]
    assert library.call_tool(SKILL_TOOL, {"query": 3}, 1.0).error


def test_skill_notes_hold_no_digit_and_no_answer():
    from coevo.envs.reasoning import ReasoningEnv

    env = ReasoningEnv(n_per_dataset=4, seed=0)
    words = {name: set(re.findall(r"[\w-]+", skill_document(name).lower())) for name in PROCEDURES}
    for name in PROCEDURES:
        assert not re.search(r"\d", skill_document(name))
    for t in env.all_tasks():
        name = t.metadata["dataset"]
        assert str(t.answer).strip().lower() not in words[name], (name, t.answer)
    assert {c for t in env.all_tasks() for c in t.capabilities if c.startswith("skill:")} == {
        f"skill:{n}" for n in PROCEDURES}


def test_the_agents_axis_turns_entities_into_specialists_of_a_lead_without_tools(env, task):
    owner = {"add": "arithmetic", "mul": "arithmetic", "neg": "signs"}
    tasks = with_agent_capabilities(make_tasks(), owner)
    assert next(t for t in tasks if t.task_id == "neg-0").capabilities[-1] == "agent:signs"
    stream = build_stream(tasks, prefix="agent:", stages=2)
    assert stream.released == (("arithmetic",), ("signs",))
    universe = frozenset({"arithmetic", "signs"})
    first = agents_harness(base_harness(), frozenset({"arithmetic"}), universe, owner=owner)
    (specialist,) = [p for p in first if p.kind == "specialist"]
    assert (specialist.config["agent"], specialist.config["tools"]) == ("arithmetic", ["add", "mul"])
    state = _start(first, env, task)
    assert sorted(state.tools) == ["ask_arithmetic"]  # the lead delegates; it calls no tool itself
    # a specialist the lead's engine evolved survives the next stage; the new one joins it
    evolved = first.set_param(specialist.name, "instructions", "You are the arithmetic specialist. Check twice.")
    second = agents_harness(evolved, universe, universe, owner=owner)
    assert second.get(specialist.name).config["instructions"].endswith("Check twice.")
    assert sorted(_start(second, env, task).tools) == ["ask_arithmetic", "ask_signs"]
    assert agents_harness(second, universe, universe, owner=owner).id == second.id  # idempotent
    with pytest.raises(ValueError, match="not in the axis universe"):
        agents_harness(base_harness(), frozenset({"logic"}), universe, owner=owner)
    with pytest.raises(ValueError, match=r"uses tools \['neg'\]"):
        with_agent_capabilities(make_tasks(), {"add": "a", "mul": "a"})
    assert Harness.from_yaml(second.to_yaml()).id == second.id


def test_stage_harnesses_load_back_from_yaml():
    for h in (tools_harness(base_harness(), frozenset({"add"}), UNIVERSE, 2),
              skills_harness(base_harness(), frozenset({"add"}), frozenset({"add", "mul"}))):
        again = Harness.from_yaml(h.to_yaml())
        assert again.id == h.id and [p.spec() for p in again] == [p.spec() for p in h]
