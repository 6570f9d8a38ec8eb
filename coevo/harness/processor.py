"""The Processor: a typed atomic component of a harness (HarnessX §3.2).

A processor attaches to exactly one hook, declares the event type it consumes and the one it
produces, belongs to one of the nine dimensions, and describes itself with a manifest (name,
description, typed parameters). Processor instances are immutable values: their parameters are
fixed at construction and anything that changes during an episode lives in the ``EpisodeState``
carried by the event (``state.memory``), so one harness can run many episodes concurrently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from coevo.harness.errors import ParamError
from coevo.harness.events import Event, ToolResult, ToolSpec
from coevo.harness.hooks import Dimension, Hook

PARAM_TYPES = ("int", "float", "bool", "str", "prompt", "str_list", "dict", "turns")
"""``prompt`` is a string that ``diff`` shows as a text diff; ``str_list`` a list of strings;
``turns`` a list of chat turns ``{"role": "user" | "assistant" | "tool", "content": str}`` (a tool
turn also names its tool: ``"name": str``), the messages the runtime itself would send."""

TURN_ROLES = ("user", "assistant", "tool")

ParamValue = int | float | bool | str | list[str] | dict[Any, Any] | list[dict[str, str]]
"""A parameter's value once ``Param.coerce`` checked it, by type: ``int``, ``float``, ``bool``, ``str``
and ``prompt`` (str), ``str_list``, ``dict`` (its keys unchecked), ``turns`` (a list of turns)."""


def _turn(value: object) -> dict[str, str] | None:
    """One chat turn as a plain dict with only its known keys, or None when it is not one."""
    if not isinstance(value, Mapping) or set(value) - {"role", "content", "name"}:
        return None
    role, content, name = value.get("role"), value.get("content"), value.get("name")
    if role not in TURN_ROLES or not isinstance(content, str):
        return None
    if role == "tool":
        return {"role": role, "name": name, "content": content} if isinstance(name, str) and name else None
    return {"role": role, "content": content} if name is None else None


@dataclass(frozen=True)
class Param:
    """One typed parameter of a processor."""

    name: str
    type: str
    default: Any
    description: str
    choices: tuple[Any, ...] | None = None

    def coerce(self, value: Any, owner: str) -> ParamValue:
        """Check ``value`` against the declared type and return it normalised (ints accepted as
        floats, tuples as lists); raise ``ParamError`` naming the processor otherwise."""
        ok: bool
        if self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type in ("str", "prompt"):
            ok = isinstance(value, str)
        elif self.type == "str_list":
            ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
            value = list(value) if ok else value
        elif self.type == "dict":
            ok = isinstance(value, Mapping)
            value = dict(value) if ok else value
        elif self.type == "turns":
            turns = [_turn(v) for v in value] if isinstance(value, (list, tuple)) else [None]
            ok = all(t is not None for t in turns)
            value = turns if ok else value
        else:  # a typo in a processor definition, not user input
            raise TypeError(f"unknown param type {self.type!r}; use one of {PARAM_TYPES}")
        if not ok:
            raise ParamError(owner, f"parameter {self.name!r} expects {self.type}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ParamError(owner, f"parameter {self.name!r} must be one of {list(self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class Manifest:
    """Self-description of a processor kind, for people and for the meta-agent."""

    kind: str
    description: str
    hook: Hook
    dimension: Dimension
    consumes: str
    produces: str
    params: tuple[Param, ...]
    group: str | None
    runs_after: tuple[str, ...]


class Processor(ABC):
    """Base class. Subclasses set the class attributes and implement ``process``.

    Class attributes:
        kind: stable identifier used in harness specs (``"system_prompt"``).
        hook, dimension: where it attaches and which dimension it belongs to.
        consumes, produces: event types; ``produces is consumes`` means "returns what it got".
        params: typed parameters with defaults.
        group: singleton group; a harness holds at most one processor of a group.
        runs_after: kinds or groups that, when present at the same hook, must run before it.
        delegates: whether the runtime answers the tool it offers with a sub-episode (``Specialist``).
    """

    kind: ClassVar[str] = "processor"
    description: ClassVar[str] = ""
    hook: ClassVar[Hook]
    dimension: ClassVar[Dimension]
    consumes: ClassVar[type[Event]]
    produces: ClassVar[type[Event]]
    params: ClassVar[tuple[Param, ...]] = ()
    group: ClassVar[str | None] = None
    runs_after: ClassVar[frozenset[str]] = frozenset()
    delegates: ClassVar[bool] = False

    def __init__(self, name: str | None = None, **params: object) -> None:
        self.name = name or self.kind
        declared = {p.name: p for p in self.params}
        unknown = sorted(set(params) - set(declared))
        if unknown:
            raise ParamError(self.name, f"unknown parameter(s) {unknown}; {self.kind} takes {sorted(declared)}")
        values = {p.name: p.coerce(params.get(p.name, p.default), self.name) for p in self.params}
        self.config: Mapping[str, Any] = MappingProxyType(values)

    @abstractmethod
    def process(self, event: Event) -> Event:
        """Transform the event; mutate ``event.state`` for effects that outlive the hook."""

    # Processors of the tools or execution dimension may implement tools themselves.
    def provided_tools(self) -> list[ToolSpec]:
        """Tools this processor implements; their ``provider`` is this processor's name."""
        return []

    def call_tool(self, call_name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        raise KeyError(f"processor {self.name!r} provides no tool {call_name!r}")

    def spec(self) -> dict[str, Any]:
        """Canonical, YAML-serialisable description: kind, instance name, every parameter."""
        return {"kind": self.kind, "name": self.name, "params": dict(self.config)}

    def with_params(self, **changes: object) -> Processor:
        """A copy with some parameters changed (processors are immutable)."""
        return type(self)(name=self.name, **{**self.config, **changes})

    def manifest(self) -> Manifest:
        return Manifest(
            kind=self.kind,
            description=self.description,
            hook=self.hook,
            dimension=self.dimension,
            consumes=self.consumes.__name__,
            produces=self.produces.__name__,
            params=self.params,
            group=self.group,
            runs_after=tuple(sorted(self.runs_after)),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Processor) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash((self.kind, self.name))
