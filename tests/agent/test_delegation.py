"""Delegation: a lead agent calls specialists as tools; each runs a sub-episode with the same
policy on the same env session (coevo.harness.library.delegation, coevo.agent.episode)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from coevo.agent.episode import MAX_DELEGATION_DEPTH, Job
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_episodes
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.harness.defaults import base_harness
from coevo.harness.events import Message, ModelRequestEvent, ToolResult, ToolSpec
from coevo.harness.harness import Harness
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library import Specialist
from coevo.harness.processor import Processor

ARGS = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
OWNER = {"note_add": "notes", "clock_set": "clock", "explode": "clock"}


@dataclass
class DeskSession(EnvSession):
    """Two entities' state: a notes list and a clock. The verifier checks the final state."""

    task: Task
    notes: list[str] = field(default_factory=list)
    clock: str = "00:00"
    done: bool = False

    @property
    def observation(self) -> str:
        return self.task.instruction

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return {name: ToolSpec(name, f"{name} (owned by {OWNER[name]})", ARGS) for name in OWNER}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "explode":
            raise RuntimeError("the clock service is down")
        text = str(arguments.get("text", ""))
        if name == "note_add":
            self.notes.append(text)
            return ToolResult(f"noted: {text}")
        if not re.fullmatch(r"\d\d:\d\d", text):
            return ToolResult("", error=f"not a time: {text!r}")
        self.clock = text
        return ToolResult(f"clock at {text}")

    def verify(self, answer: str | None) -> Score:
        note, time = self.task.answer
        ok = self.notes == [note] and self.clock == time
        return Score(float(ok), ok)

    def close(self) -> None:
        pass


class Desk(Env):
    name = "desk"

    def __init__(self) -> None:
        self._tasks = [Task(f"d{i}", "desk", f"Add the note 'buy milk {i}' and set the clock to 0{i}:30.", "train",
                            (f"buy milk {i}", f"0{i}:30")) for i in range(4)]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> DeskSession:
        return DeskSession(task)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def lead_harness() -> Harness:
    h = base_harness().set_param("tool_registry", "enabled", ["ask_notes", "ask_clock"])
    for agent, tools in (("notes", ["note_add"]), ("clock", ["clock_set", "explode"])):
        h = h.insert(Specialist(agent=agent, tools=tools, summary=f"the {agent} keeper",
                                instructions=f"You are the {agent} specialist."), index=0)
    return h


def gold(messages: list[Message]) -> str:
    """The scripted gold policy: the lead delegates each entity's part; each specialist acts with
    its own tool and reports."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    last = messages[-1]
    if system.startswith("You are the notes specialist"):
        if last["role"] == "tool":
            return f"<answer>{last['content']}</answer>"
        return call("note_add", text=re.search(r"note '(.+)'", last["content"]).group(1))
    if system.startswith("You are the clock specialist"):
        if last["role"] == "tool":
            return f"<answer>{last['content']}</answer>"
        return call("clock_set", text=re.search(r"(\d\d:\d\d)", last["content"]).group(1))
    task = next(m["content"] for m in messages if m["role"] == "user")
    done = [m for m in messages if m["role"] == "tool"]
    note, time = re.search(r"note '(.+?)'", task).group(1), re.search(r"(\d\d:\d\d)", task).group(1)
    if not done:
        return call("ask_notes", request=f"Add the note '{note}'.")
    if len(done) == 1:
        return call("ask_clock", request=f"Set the clock to {time}.")
    return "<answer>done</answer>"


def run(respond: Any, harness: Harness | None = None, **kwargs: Any) -> list:
    env = Desk()
    jobs = [Job(t, harness or lead_harness()) for t in env.tasks("train")]
    return run_episodes(jobs, ScriptedPolicy(respond), env, max_steps=6, **kwargs)


def test_the_scripted_gold_policy_passes_through_delegation():
    traces = run(gold)
    assert traces
    for trace in traces:
        assert trace.passed and trace.error is None, (trace.error, trace.stop_reason)
        assert [c.name for c in trace.tool_calls if not c.agent] == ["ask_notes", "ask_clock"]
        delegated = [(c.agent, c.name) for c in trace.tool_calls if c.agent]
        assert delegated == [("notes", "note_add"), ("clock", "clock_set")]
        # every model call is in the trace with its exact token ids: 3 of the lead, 2 per specialist
        assert [c.agent for c in trace.model_calls].count("") == 3
        assert sum(c.agent == "notes" for c in trace.model_calls) == 2
        assert all(c.completion_ids and c.prompt_ids for c in trace.model_calls)
        assert trace.cost["prompt_tokens"] == sum(len(c.prompt_ids) for c in trace.model_calls)
        lead_results = [m["content"] for m in trace.messages if m["role"] == "tool"]
        assert lead_results[0].startswith("noted: buy milk")  # the specialist's answer is the tool's output


def test_the_lead_has_no_direct_tool_access_and_the_specialist_only_its_bundle():
    (trace,) = run(gold)[:1]
    lead_request = trace.model_calls[0].messages
    assert "ask_notes" in lead_request[0]["content"] and "note_add:" not in lead_request[0]["content"]
    notes_request = next(c for c in trace.model_calls if c.agent == "notes").messages
    assert notes_request[0]["content"].startswith("You are the notes specialist")
    assert "note_add" in notes_request[0]["content"] and "clock_set" not in notes_request[0]["content"]
    assert "buy milk" in notes_request[-1]["content"] and "Add the note" in notes_request[-1]["content"]


def crashing(messages: list[Message]) -> str:
    system = messages[0]["content"]
    if system.startswith("You are the clock specialist") and messages[-1]["role"] != "tool":
        return call("explode", text="now")
    return gold(messages)


def test_a_specialist_that_crashes_comes_back_as_a_tool_error_and_the_lead_goes_on():
    traces = run(crashing)
    assert traces
    for trace in traces:
        assert trace.error is None and trace.stop_reason == "answer"  # the parent episode ended normally
        (clock,) = [c for c in trace.tool_calls if c.name == "ask_clock"]
        assert "specialist 'clock' failed" in clock.error and "clock service is down" in clock.error
        assert not trace.passed  # the clock was never set


def looping(messages: list[Message]) -> str:
    if messages[0]["content"].startswith("You are the notes specialist"):
        return call("note_add", text="again") if len(messages) < 40 else "<answer>x</answer>"
    return gold(messages)


def test_a_specialist_that_loops_is_stopped_at_its_step_budget():
    h = lead_harness().set_param("specialist_notes", "max_steps", 3)
    traces = run(looping, h)
    assert traces
    for trace in traces:
        assert trace.error is None and trace.stop_reason == "answer"
        assert sum(c.agent == "notes" for c in trace.model_calls) <= 3
        (notes,) = [c for c in trace.tool_calls if c.name == "ask_notes"]
        assert "gave no answer" in notes.error


class FlakyPolicy(ScriptedPolicy):
    """Runs out of memory whenever a specialist asks (a batch of one request at a time)."""

    def generate(self, requests):
        if any(r.messages[0]["content"].startswith("You are the") for r in requests):
            raise MemoryError("CUDA out of memory")
        return super().generate(requests)


def test_a_policy_failure_inside_a_sub_episode_stays_there():
    env = Desk()
    traces = run_episodes([Job(t, lead_harness()) for t in env.tasks("train")], FlakyPolicy(gold), env, max_steps=6,
                          batch_size=1)
    assert traces
    for trace in traces:
        assert trace.error is None and not trace.infra_failure
        errors = [c.error for c in trace.tool_calls if c.name.startswith("ask_")]
        assert errors and all("MemoryError" in e for e in errors)


class NestingSpecialist(Specialist):
    """A specialist of one's own whose sub-harness keeps the lead's specialists (so it can nest)."""

    kind = "tests.agent.test_delegation:NestingSpecialist"

    def harness_for(self, lead: Harness) -> Harness:
        return lead.set_param("system_prompt", "template", "You are the nesting specialist.")


def test_delegation_depth_is_bounded():
    h = base_harness().insert(NestingSpecialist(agent="deep", tools=["note_add"]), index=0)

    def nest(messages: list[Message]) -> str:
        if messages[-1]["role"] == "tool":
            return f"<answer>{messages[-1]['content'][:40]}</answer>"
        return call("ask_deep", request="go deeper")

    (trace, *_) = run(nest, h)
    agents = {c.agent for c in trace.model_calls}
    assert agents == {"", "deep", "deep/deep"}  # MAX_DELEGATION_DEPTH levels, then a tool error
    assert MAX_DELEGATION_DEPTH == 2
    deepest = [c for c in trace.tool_calls if c.agent == "deep/deep" and c.name == "ask_deep"]
    assert deepest and "deeper than 2" in deepest[0].error


def test_specialists_are_harness_components_edited_by_the_algebra():
    h = lead_harness()
    edited = h.set_param("specialist_notes", "instructions", "You are the notes specialist. Be brief.")
    assert edited.parent_id == h.id and edited.edit.describe().startswith("set_param specialist_notes.instructions")
    assert Harness.from_yaml(edited.to_yaml()).id == edited.id
    sub = edited.get("specialist_notes").harness_for(edited)
    assert "specialist_notes" not in sub and "specialist_clock" not in sub
    assert sub.get("tool_registry").config["enabled"] == ["note_add"]
    with pytest.raises(Exception, match="at least one tool"):
        Specialist(agent="empty", tools=[])


class ForceDelegation(Processor):
    """Prefills the lead's first reply with a whole delegation call, so a random model delegates."""

    kind = "tests.agent.test_delegation:ForceDelegation"
    description = "test only"
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.TOOLS
    consumes = produces = ModelRequestEvent

    def process(self, event: ModelRequestEvent) -> ModelRequestEvent:
        if "ask_notes" in event.state.tools and event.state.step == 0:
            event.reply_prefix = call("ask_notes", request="Add the note 'x'.")
        return event


def test_sub_episode_tokens_reach_the_buffer_with_exact_behaviour_logprobs(tmp_path):
    """A tiny model plays both roles: the lead's delegation is prefilled, the specialist samples
    freely. The buffer's behaviour log-probs of the specialist's tokens (one forward of the model,
    at each call's temperature) equal what the sampler drew them with."""
    from coevo.buffers import ReplayBuffer
    from coevo.policy.hf import TransformersPolicy
    from coevo.policy.tiny import tiny_model, tiny_tokenizer
    from coevo.trainers.logprobs import logprob_fn

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    h = (lead_harness().insert(ForceDelegation()).set_param("sampling", "temperature", 0.8)
         .set_param("sampling", "max_new_tokens", 8).set_param("token_annotation", "exclude_truncated", False))
    env = Desk()
    traces = run_episodes([Job(t, h, trace_id=t.task_id) for t in env.tasks("train")[:2]],
                          TransformersPolicy(model, tok, seed=0), env, max_steps=2)
    sub_calls = [c for t in traces for c in t.model_calls if c.agent == "notes"]
    assert sub_calls and all(c.sampler_logprobs for c in sub_calls)
    with ReplayBuffer(tmp_path / "buffer", capacity=8) as buf:
        buf.add(traces, round=0, model_version=0, logprob_fn=logprob_fn(model, tok.pad_token_id, temperature=0.8,
                                                                         batch_size=8))
        (stored, *_) = buf.load(buf.entries())
    for trace in traces:
        for c, behaviour in zip(trace.model_calls, trace.behaviour_logprobs, strict=True):
            assert behaviour == pytest.approx(c.sampler_logprobs, abs=1e-5), c.agent
    assert [c.agent for c in stored.model_calls] == [c.agent for c in traces[0].model_calls]
