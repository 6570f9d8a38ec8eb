"""The environment base classes: tasks with stable ids and splits, multi-turn sessions, verifiers.

An episode is ``session = env.reset(task)``, then tool calls through ``session.call_tool`` (the
multi-turn step: for a text game the action is a tool call too), then ``session.verify(answer)``
and ``session.close()``. The ground truth in ``Task.answer`` is for verifiers and reference
trajectories only; the agent sees ``Task.instruction`` and observations.

An env subclasses ``Env`` and its sessions ``EnvSession``; the optional parts are declared on those
classes with what an env without them means (docs/environments.md has the table and the checklist).
The one that shapes an episode is ``EnvSession.respond``: a conversation with several user turns.
When the agent answers (``<answer>`` in the default harness), the runtime hands the answer to
``respond``; a string is the user's next message and the episode goes on, None (the default) ends
it with that answer as the final one. The trace keeps the earlier answers in ``Trace.replies``.

``reset`` must release what it opened when it raises: the runtime never got a session to close.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from coevo.harness.events import Message, ToolCall, ToolResult, ToolSpec

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Task:
    task_id: str
    env: str
    instruction: str
    split: str
    answer: Any  # hidden ground truth
    capabilities: tuple[str, ...] = ()  # what the gold solution needs (tools used, game type)
    gold_actions: tuple[ToolCall, ...] = ()  # a known-good action sequence, when the source has one
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    reward: float  # in [0, 1]
    passed: bool
    info: Mapping[str, Any] = field(default_factory=dict)


class EnvSession(ABC):
    """One episode of an env: what the agent is shown first, the tools it offers (provider "env"),
    and whether the env ended the episode (a game won or lost)."""

    observation: str
    tools: dict[str, ToolSpec]
    done: bool = False

    @abstractmethod
    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run a tool of this session (a game's action is one)."""

    @abstractmethod
    def verify(self, answer: str | None) -> Score:
        """The episode's score; it may check the session's final state, not only ``answer``."""

    def respond(self, reply: str) -> str | None:
        """The user's next message after the agent's answer ``reply``; None ends the episode with it."""
        return None

    def close(self) -> None:
        """Release what the session holds."""


class Env(ABC):
    """A task set and the sessions its episodes run in."""

    name: str
    max_sessions: int | None = None  # sessions open at once (a simulator process each); None: no limit
    tool_owners: Mapping[str, str] | None = None  # tool -> owning entity (the agents axis of harness streams)
    scripted_solver: ClassVar[Callable[[list[Message]], str] | None] = None  # a demo policy's replies
    inert_processors: frozenset[str] = frozenset()  # harness processor kinds that change nothing on its agents

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The tasks of ``split`` (one of ``SPLITS``), with stable ids."""

    @abstractmethod
    def reset(self, task: Task) -> EnvSession:
        """A new session for ``task``; it releases what it opened when it raises."""

    def gold_answer(self, task: Task) -> str | None:
        """The final answer after ``task``'s gold actions are replayed (None: the caller's default)."""
        return None

    def tool_names(self, task: Task) -> list[str]:
        """The tool names a session of ``task`` offers (envs declare tools per session, not per env)."""
        session = self.reset(task)
        try:
            return sorted(session.tools)
        finally:
            session.close()

    def close(self) -> None:
        """Release what the env holds (simulators, event loops)."""


def assign_split(task_id: str, seed: int, fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> str:
    """Deterministic split from a hash of (seed, task_id): the same on every machine and run,
    and a task keeps its split when other tasks are added or removed."""
    if len(fractions) != len(SPLITS) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three numbers summing to 1 for {SPLITS}, got {list(fractions)}")
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for split, frac in zip(SPLITS, fractions, strict=True):
        edge += frac
        if u < edge:
            return split
    return SPLITS[-1]


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return split


def skill_of(task: Task) -> str | None:
    """The dataset (or game) a task was drawn from: its ``skill:<name>`` capability, None without one."""
    return next((c.removeprefix("skill:") for c in task.capabilities if c.startswith("skill:")), None)


def stratified(tasks: Sequence[Task], skills: Sequence[str], limit: int) -> list[Task]:
    """The same number of tasks from each of ``skills`` (the first of each, in ``tasks``' order), at
    most ``limit`` in all. The first ``limit`` tasks of a mixed split can all be one dataset (an env
    lists its tasks dataset by dataset), so a sample that names several must be drawn per dataset.
    A ValueError names every skill without a task, or a ``limit`` below one task per skill: a
    transfer table must never measure fewer datasets than it names."""
    if limit < len(skills):
        raise ValueError(f"limit {limit} is fewer than the {len(skills)} datasets named; it needs one task from each")
    by_skill = {s: [t for t in tasks if skill_of(t) == s] for s in skills}
    missing = [s for s, found in by_skill.items() if not found]
    if missing:
        present = sorted({s for t in tasks if (s := skill_of(t)) is not None})
        raise ValueError(f"no task of {missing} in this split (its datasets: {present})")
    each = min(limit // len(skills), *(len(found) for found in by_skill.values()))
    return [t for s in skills for t in by_skill[s][:each]]
