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
- agents: the env's ownership map (tool → entity, ``env.tool_owners``) groups its tools into
  bundles; each released entity becomes a ``specialist`` processor (its bundle, default
  instructions) offering the lead an ``ask_<entity>`` tool, and the lead's ``tool_registry``
  enables exactly those delegation tools: the lead has no direct tool access. Specialists already
  in the harness are kept as they are (an evolved specialist survives a stage), new ones are
  inserted before the registry. Tasks get ``agent:<entity>`` capabilities from their tools
  (``with_agent_capabilities``), so the frequency-ranked release is over entities. Distractors do
  not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from coevo.agent.firing import fire
from coevo.envs.base import Env, Task
from coevo.harness.errors import CompositionError
from coevo.harness.events import EpisodeState, TaskStartEvent, TaskView
from coevo.harness.harness import Harness
from coevo.harness.hooks import Hook
from coevo.harness.library.delegation import DELEGATE_PREFIX, Specialist
from coevo.harness.library.stages import DISTRACTORS, SKILL_TOOL, SkillLibrary, StageTools
from coevo.harness.library.tools import ToolRegistry
from coevo.harness.processor import Processor
from coevo.streams.skills import skill_document

AxisHarness = Callable[[Harness, frozenset[str], frozenset[str], int], Harness]
"""(harness, capabilities to expose, axis universe, distractors) → the harness exposing them."""

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


def bundles(owner: Mapping[str, str]) -> dict[str, list[str]]:
    """entity → its tools (sorted), from the ownership map tool → entity."""
    out: dict[str, list[str]] = {}
    for tool, entity in sorted(owner.items()):
        out.setdefault(entity, []).append(tool)
    return out


def agents_harness(harness: Harness, exposed: frozenset[str], universe: frozenset[str], distractors: int = 0, *,
                   owner: Mapping[str, str]) -> Harness:
    """``harness`` as a lead agent delegating to the specialists ``exposed`` (entities of
    ``owner``, tool → entity), and to nothing else (see the module docstring). ``distractors`` is
    accepted for a uniform signature and ignored; bind ``owner`` with ``functools.partial``."""
    stray = sorted(set(exposed) - set(universe))
    if stray:
        raise ValueError(f"exposed agents {stray} are not in the axis universe {sorted(universe)}")
    by_entity = bundles(owner)
    unknown = sorted(set(universe) - set(by_entity))
    if unknown:
        raise ValueError(f"agents {unknown} own no tool in the ownership map")
    manifest = {"hypothesis": f"harness stream: a lead delegating to specialists {sorted(exposed)}"}
    present = {p.config["agent"] for p in harness if p.kind == Specialist.kind}
    for entity in sorted(set(exposed) - present):
        chain = list(harness.at(Hook.TASK_START))
        registry = _find(harness, "tool_registry")
        index = chain.index(registry) if registry is not None else len(chain)
        harness = harness.insert(Specialist(agent=entity, tools=by_entity[entity], summary=f"the {entity} specialist"),
                                 index=index, manifest=manifest)
    delegates = [DELEGATE_PREFIX + e for e in sorted(exposed)]
    registry = _find(harness, "tool_registry")
    if registry is None:
        return _place(harness, ToolRegistry(enabled=delegates), manifest)
    if registry.config["enabled"] == delegates:
        return harness
    return harness.set_param(registry.name, "enabled", delegates, manifest=manifest)


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


def get_axis(name: str) -> Axis:
    """The axis ``name``; an unknown one raises ``ValueError`` before any work."""
    if name not in AXES:
        raise ValueError(f"axis must be one of {list(AXES)}, got {name!r}")
    return AXES[name]


def tool_owners(env: Env) -> dict[str, str]:
    """The env's ownership map (tool → entity) that the agents axis needs: ``env.tool_owners``."""
    owner = env.tool_owners
    if not isinstance(owner, Mapping) or not owner:
        raise ValueError(f"env {env.name!r} has no tool_owners map (tool name -> owning entity); "
                         "the agents axis groups tools into specialists by it")
    return dict(owner)


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
