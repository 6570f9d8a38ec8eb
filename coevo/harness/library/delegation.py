"""Delegation: specialist agents a lead agent calls as tools.

A ``Specialist`` is one entity-scoped agent (EvoHarnessBench §3.3, the agents axis): a name, a
description the lead sees, its tool bundle, and its instructions (system prompt and procedural
context). It offers the lead one tool, ``ask_<name>``, taking a ``request`` string. The runtime
(``coevo.agent.episode``) answers a call of that tool by running a sub-episode with the same
policy, on the same env session (the world state the lead acts on), with the specialist's harness
(``harness_for``): the lead's harness without its lead-only context (specialists, task template,
demonstrations), with the specialist's instructions as system prompt and only its bundle enabled.
The specialist's final answer comes back to the lead as the tool's output; a failure, a step cap
or a missing answer comes back as the tool's error.

Specialists are ordinary processors, so AEGIS edits them with the same algebra and gates
(``set_param specialist_calendar.instructions``, a bundle change, a new specialist), and a
harness holding them loads back from YAML.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Protocol, Self, TypeVar

from coevo.harness.errors import ParamError
from coevo.harness.events import TaskStartEvent, ToolResult, ToolSpec
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library.context import SystemPrompt
from coevo.harness.processor import Param, Processor

DELEGATE_PREFIX = "ask_"
LEAD_ONLY_KINDS = frozenset({"specialist", "instruction_template", "few_shot"})
"""Processor kinds a specialist's sub-episode does not inherit from the lead's harness."""

DEFAULT_INSTRUCTIONS = (
    "You are the {name} specialist. Carry out the request with your tools, one call at a time, then give a short "
    "report of what you did and any value you were asked for as <answer>...</answer>."
)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_REQUEST = {"type": "object", "properties": {"request": {"type": "string"}}, "required": ["request"]}


class LeadHarness(Protocol):
    """What ``harness_for`` uses of the lead's harness: a ``coevo.harness.Harness``, whose module imports this
    library (so this module cannot import it)."""

    def __iter__(self) -> Iterator[Processor]: ...

    def remove(self, name: str) -> Self: ...

    def set_param(self, name: str, param: str, value: object) -> Self: ...

    def insert(self, processor: Processor, *, index: int | None = None) -> Self: ...


H = TypeVar("H", bound=LeadHarness)


class Specialist(Processor):
    kind = "specialist"
    description = ("Offers the lead agent an ask_<name> tool that delegates a request to a specialist sub-agent with "
                   "its own instructions and tool bundle (run by the runtime with the same policy).")
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = TaskStartEvent
    delegates = True  # the runtime answers this processor's tool with a sub-episode, not call_tool
    params = (
        Param("agent", "str", "", "the specialist's name (ask_<agent> is its tool)"),
        Param("summary", "str", "", "what the specialist does, shown to the lead in the tool's description"),
        Param("tools", "str_list", [], "the specialist's tool bundle (names of env or harness tools)"),
        Param("instructions", "prompt", DEFAULT_INSTRUCTIONS, "the specialist's system prompt ({name}: its name)"),
        Param("max_steps", "int", 6, "model calls of one delegated sub-episode at most"),
    )

    def __init__(self, name: str | None = None, **params: object) -> None:
        agent = params.get("agent", "")
        super().__init__(name or f"specialist_{agent}", **params)
        if not _NAME.match(self.config["agent"]):
            raise ParamError(self.name, f"agent must be a lower-case identifier, got {self.config['agent']!r}")
        if not self.config["tools"]:
            raise ParamError(self.name, "a specialist needs at least one tool in its bundle")
        if self.config["max_steps"] < 1:
            raise ParamError(self.name, f"max_steps must be >= 1, got {self.config['max_steps']}")

    @property
    def tool_name(self) -> str:
        return DELEGATE_PREFIX + self.config["agent"]

    def provided_tools(self) -> list[ToolSpec]:
        summary = self.config["summary"] or f"the {self.config['agent']} specialist"
        tools = ", ".join(self.config["tools"])
        return [ToolSpec(self.tool_name, f"Delegate a request to {summary} (its tools: {tools}); returns its report.",
                         _REQUEST, provider=self.name)]

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        for spec in self.provided_tools():
            event.state.available_tools.setdefault(spec.name, spec)
        return event

    def call_tool(self, call_name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        # reached only when a runtime without delegation runs the harness
        return ToolResult("", error=f"{call_name} delegates to a sub-agent, which this runtime cannot run")

    def harness_for(self, lead: H) -> H:
        """The specialist's harness (a ``coevo.harness.Harness``), derived from the lead's ``lead``
        (see the module docstring)."""
        h = lead
        for p in list(h):
            if p.kind in LEAD_ONLY_KINDS:
                h = h.remove(p.name)
        prompt = self.config["instructions"].replace("{name}", self.config["agent"])
        system = next((p for p in h if p.kind == "system_prompt"), None)
        h = h.set_param(system.name, "template", prompt) if system is not None else h.insert(
            SystemPrompt(template=prompt), index=0)
        registry = next((p for p in h if p.kind == "tool_registry"), None)
        if registry is not None:
            h = h.set_param(registry.name, "enabled", list(self.config["tools"]))
        return h
