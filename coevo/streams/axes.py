"""Axes: how a stage's capability set becomes a Harness.

An axis function takes a harness (the base one, or an evolved one carried across stages), the
capabilities to expose, the axis universe and a number of distractors, and returns the harness
with exactly that exposure. It edits through the substitution algebra (``set_param`` when its
processor is already there, ``insert`` otherwise) and touches nothing else, so evolved processors
survive and the lineage records the change. Applying it twice with the same arguments is a no-op.

- tools: ``stage_tools`` withholds the universe's unreleased tools and adds distractors;
  ``tool_registry`` enables exactly the released tools plus the distractors, sorted by name, plus
  any non-axis tools it already listed by name (a registry enabling ``'*'`` becomes the exact list,
  so an env that also offers tools outside the axis needs them listed in the base registry). The
  gate is what keeps a stream honest under evolution: an edit that sets the registry to ``['*']``
  still cannot reach an unreleased tool.
- skills: ``skill_library`` holds one note per released skill, retrieved with ``skill_lookup``
  (never injected into the prompt); the pool grows with the stages. Distractors do not apply:
  the earlier skills already are the distractors.
- agents: not supported by the runtime; see ``AGENTS_MISSING``. Its capability annotations can be
  derived (``with_agent_capabilities``) so an agents stream can be built and inspected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from coevo.agent.runtime import fire
from coevo.envs.base import Env, Task
from coevo.harness.errors import CompositionError
from coevo.harness.events import EpisodeState, TaskStartEvent, TaskView
from coevo.harness.harness import Harness
from coevo.harness.hooks import Hook
from coevo.harness.library.stages import DISTRACTORS, SKILL_TOOL, SkillLibrary, StageTools
from coevo.harness.library.tools import ToolRegistry
from coevo.harness.processor import Processor
from coevo.streams.skills import skill_document

AxisHarness = Callable[[Harness, frozenset[str], frozenset[str], int], Harness]
"""(harness, capabilities to expose, axis universe, distractors) → the harness exposing them."""

AGENTS_MISSING = (
    "the agents axis needs a tool whose call runs a specialist sub-episode (its tool bundle, its own harness) "
    "with the policy and returns the specialist's answer to the lead agent. The runtime cannot do that without "
    "large changes: Processor.call_tool(name, arguments, timeout_s) has no access to the policy, and "
    "run_episodes asks the policy for completions only from its driver loop, so a nested episode would need a "
    "re-entrant policy and a runtime hook that yields the sub-episode's requests into the same batches. "
    "Agent capabilities can be derived (with_agent_capabilities) and a stream built from them, but no harness."
)


def _find(harness: Harness, kind: str) -> Processor | None:
    return next((p for p in harness if p.kind == kind), None)


def _place(harness: Harness, processor: Processor, manifest: dict[str, str]) -> Harness:
    """Replace the present processor of ``processor``'s kind (keeping its name and place), or insert it into
    ``task_start`` right before ``tool_registry`` (or at the latest position the algebra accepts)."""
    present = _find(harness, processor.kind)
    if present is not None:
        if dict(present.config) == dict(processor.config):
            return harness
        updated = type(processor)(name=present.name, **processor.config)  # one atomic edit, same place
        return harness.replace(present.name, updated, manifest=manifest)
    chain = list(harness.at(Hook.TASK_START))
    registry = _find(harness, "tool_registry")
    preferred = [chain.index(registry)] if registry is not None else []
    for index in preferred + list(range(len(chain), -1, -1)):
        try:
            return harness.insert(processor, index=index, manifest=manifest)
        except CompositionError:
            continue
    raise CompositionError(processor.name, "no position in task_start accepts it")


def _enable(harness: Harness, names: Sequence[str], axis_names: Iterable[str], manifest: dict[str, str]) -> Harness:
    """Make the tool registry enable ``names`` plus the non-axis tools it already listed by name
    (``axis_names``: the axis universe and every distractor, whose exposure the axis decides)."""
    registry = _find(harness, "tool_registry")
    if registry is None:
        return _place(harness, ToolRegistry(enabled=list(names)), manifest)
    decided = set(axis_names) | set(names)
    kept = [n for n in registry.config["enabled"] if n != "*" and n not in decided]
    enabled = list(names) + kept
    if registry.config["enabled"] == enabled:
        return harness
    return harness.set_param(registry.name, "enabled", enabled, manifest=manifest)


def distractor_names(n: int, exclude: Iterable[str] = ()) -> list[str]:
    """The first ``n`` distractors of the catalogue whose names are not in ``exclude``."""
    pool = [d for d in DISTRACTORS if d not in set(exclude)]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(pool):
        raise ValueError(f"distractors must be an integer in 0..{len(pool)} (the catalogue size), got {n!r}")
    return pool[:n]


def tools_harness(harness: Harness, exposed: frozenset[str], universe: frozenset[str], distractors: int = 0) -> Harness:
    """``harness`` exposing exactly the tools ``exposed`` of the axis ``universe``, plus
    ``distractors`` fake tools (see the module docstring)."""
    stray = sorted(set(exposed) - set(universe))
    if stray:
        raise ValueError(f"exposed tools {stray} are not in the axis universe {sorted(universe)}")
    released = sorted(exposed)
    fake = distractor_names(distractors, exclude=universe)
    manifest = {"hypothesis": f"harness stream: expose tools {released} and {len(fake)} distractors"}
    gate = StageTools(released=released, universe=sorted(universe), distractors=fake)
    harness = _place(harness, gate, manifest)
    # one name-sorted catalogue: distractors are not always listed last, where a model could learn to skip them
    return _enable(harness, sorted(released + fake), set(universe) | set(DISTRACTORS), manifest)


def skills_harness(harness: Harness, exposed: frozenset[str], universe: frozenset[str],
                   distractors: int = 0) -> Harness:
    """``harness`` whose skill pool holds one note per skill in ``exposed``, retrievable with
    ``skill_lookup``. ``distractors`` is accepted for a uniform signature and ignored."""
    stray = sorted(set(exposed) - set(universe))
    if stray:
        raise ValueError(f"exposed skills {stray} are not in the axis universe {sorted(universe)}")
    manifest = {"hypothesis": f"harness stream: skill pool {sorted(exposed)}"}
    harness = _place(harness, SkillLibrary(skills={s: skill_document(s) for s in sorted(exposed)}), manifest)
    registry = _find(harness, "tool_registry")
    if registry is not None and "*" not in registry.config["enabled"] and SKILL_TOOL not in registry.config["enabled"]:
        harness = harness.set_param(registry.name, "enabled", [*registry.config["enabled"], SKILL_TOOL],
                                    manifest=manifest)
    return harness


def agents_harness(harness: Harness, exposed: frozenset[str], universe: frozenset[str],
                   distractors: int = 0) -> Harness:
    """Not supported: raises NotImplementedError with ``AGENTS_MISSING``."""
    raise NotImplementedError(AGENTS_MISSING)


@dataclass(frozen=True)
class Axis:
    name: str
    prefix: str  # capability annotations of this axis are ``<prefix><name>``
    harness: AxisHarness


AXES: dict[str, Axis] = {
    "tools": Axis("tools", "tool:", tools_harness),
    "skills": Axis("skills", "skill:", skills_harness),
    "agents": Axis("agents", "agent:", agents_harness),
}


SUPPORTED = ("tools", "skills")
"""Axes a stream can run today; ``agents`` has capability annotations but no runtime (``AGENTS_MISSING``)."""


def get_axis(name: str) -> Axis:
    """The axis ``name``; an unknown or unsupported one raises ``ValueError`` before any work."""
    if name == "agents":
        raise ValueError(f"axis 'agents' is not supported yet: {AGENTS_MISSING}; choose one of {list(SUPPORTED)}")
    if name not in AXES:
        raise ValueError(f"axis must be one of {list(SUPPORTED)}, got {name!r}")
    return AXES[name]


def with_agent_capabilities(tasks: Sequence[Task], owner: Mapping[str, str]) -> list[Task]:
    """Tasks with ``agent:<owner>`` capabilities added: each ``tool:<t>`` belongs to the specialist
    ``owner[t]`` (tools sharing an owner form its bundle, EvoHarnessBench §3.3), so a task needs
    every specialist that owns one of its tools. Raises ValueError naming unowned tools."""
    out = []
    for task in tasks:
        tools = [c[len("tool:"):] for c in task.capabilities if c.startswith("tool:")]
        missing = sorted(t for t in tools if t not in owner)
        if missing:
            raise ValueError(f"task {task.task_id!r} uses tools {missing} that the owner map does not assign")
        agents = sorted({f"agent:{owner[t]}" for t in tools} - set(task.capabilities))
        out.append(replace(task, capabilities=(*task.capabilities, *agents)))
    return out


def exposed_tools(harness: Harness, env: Env, task: Task) -> list[str]:
    """The tool names an agent on ``harness`` is given for ``task``: the env session's tools put
    through the harness's ``task_start`` chain, exactly as the runtime does."""
    session = env.reset(task)
    try:
        state = EpisodeState(task=TaskView(task.task_id, task.env, task.instruction, task.split),
                             messages=[{"role": "user", "content": session.observation}],
                             available_tools=dict(session.tools))
        fire(harness, Hook.TASK_START, TaskStartEvent(state), [])
        return sorted(state.tools)
    finally:
        session.close()
