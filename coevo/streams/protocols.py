"""Evaluation protocols over a harness stream (EvoHarnessBench §3.4), plus the task-specific reference.

- ``deployment``: at each stage a fresh system, the base harness with that stage's capabilities
  (``axis_harness(base, C_s, …)``), evaluated on every cohort released so far; nothing is carried
  between stages, so any change is harness-induced.
- ``self_evolving``: one AEGIS engine carried across stages. Its current harness (every variant)
  gains each stage's newly released capabilities through the same axis function, which edits only
  the axis's own processors, so evolved processors are kept; then it adapts on the stage's
  adaptation split for ``rounds_per_stage`` rounds of the co-evolution loop in ``harness_only``
  mode (``coevo.loop.coevolution.Coevolution``: the same round, batching and reference policy as ``train.py``
  and ``coevo evolve``; each stage's run directory is ``<run_dir>/stage-<s>``), and is evaluated
  (each task on the variant AEGIS routes it to) on every cohort released so far. The evaluation
  split is held out: AEGIS never sees its traces.
- ``task_specific_reference``: each evaluation task on the base harness exposing only its own
  annotated capabilities (no distractors), once per cohort; the ã_j of forward transfer.

Each returns a ``ProtocolResult`` with one ``Outcome`` per (stage, cohort, task) and token costs.
Every episode runs through the ``RolloutService`` given (its policy, env, limits and progress);
meta-agent and critic come in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from coevo.agent.rollouts import RolloutService, trace_tokens
from coevo.agent.trace import Trace
from coevo.config.schema import EvolutionConfig
from coevo.envs.base import Task
from coevo.evolution.critic import Critic
from coevo.evolution.meta_agent import MetaAgent
from coevo.harness.harness import Harness
from coevo.loop.builders import build_aegis
from coevo.loop.coevolution import Coevolution
from coevo.loop.schedule import Schedule, Splits
from coevo.report.progress import NullProgress
from coevo.report.tracking import NullTracker
from coevo.streams.axes import AxisHarness, exposed_tools
from coevo.streams.construct import Stream
from coevo.streams.outcomes import Outcome, ProtocolResult

PROTOCOLS = ("deployment", "self_evolving")
"""Protocols ``run_stream`` can run; the task-specific reference always runs (FWT needs it)."""

Item = tuple[int, int, Task, Harness, str]  # (stage, cohort, task, harness, variant)


def evaluate_items(items: Sequence[Item], rollouts: RolloutService, *, attempts: int,
                   description: str) -> list[Outcome]:
    """``attempts`` episodes per item in one batched run; one Outcome per item."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if not items:
        return []
    done = rollouts.run([harness for _, _, _, harness, _ in items], [task for _, _, task, _, _ in items],
                        attempts=attempts, phase=None, variant=[variant for *_, variant in items], label=description)
    groups = [done.traces[i * attempts : (i + 1) * attempts] for i in range(len(items))]
    return [Outcome(stage, cohort, task.task_id, tuple(bool(t.passed) for t in mine), trace_tokens(mine), harness.id)
            for (stage, cohort, task, harness, _), mine in zip(items, groups, strict=True)]


def stage_harnesses(stream: Stream, base: Harness, axis_harness: AxisHarness,
                    distractors_per_stage: int = 0) -> list[Harness]:
    """The deployment harness of every stage: ``base`` exposing C_s and s × distractors_per_stage
    distractors (distractors grow with the stage, like the catalogue)."""
    if distractors_per_stage < 0:
        raise ValueError(f"distractors_per_stage must be >= 0, got {distractors_per_stage}")
    universe = frozenset(stream.universe)
    return [axis_harness(base, stream.cumulative[s], universe, distractors_per_stage * s)
            for s in range(stream.n_stages)]


def deployment(stream: Stream, base: Harness, axis_harness: AxisHarness, rollouts: RolloutService, *,
               attempts: int = 1, distractors_per_stage: int = 0) -> ProtocolResult:
    """A fresh system per stage from ``base``; every released cohort evaluated at every stage."""
    result = ProtocolResult("deployment", stream.n_stages)
    for s, harness in enumerate(stage_harnesses(stream, base, axis_harness, distractors_per_stage)):
        items = [(s, j, t, harness, "base") for j in range(s + 1) for t in stream.evaluate[j]]
        result.outcomes += evaluate_items(items, rollouts, attempts=attempts,
                                          description=f"deployment stage {s}: evaluate")
        result.harness_ids[s] = [harness.id]
        result.harnesses.append({"base": harness})
    return result


def task_specific_reference(stream: Stream, base: Harness, axis_harness: AxisHarness, rollouts: RolloutService, *,
                            attempts: int = 1) -> ProtocolResult:
    """Each evaluation task on ``base`` exposing only its own capabilities; outcomes at stage = cohort."""
    universe = frozenset(stream.universe)
    result = ProtocolResult("reference", stream.n_stages)
    cache: dict[frozenset[str], Harness] = {}
    items: list[Item] = []
    for j, cohort in enumerate(stream.evaluate):
        for task in cohort:
            needs = stream.needs(task)
            if needs not in cache:
                cache[needs] = axis_harness(base, needs, universe, 0)
            items.append((j, j, task, cache[needs], "reference"))
            if cache[needs].id not in result.harness_ids[j]:
                result.harness_ids[j].append(cache[needs].id)
    result.outcomes = evaluate_items(items, rollouts, attempts=attempts,
                                     description="task-specific reference: evaluate")
    return result


def self_evolving(stream: Stream, base: Harness, axis_harness: AxisHarness, rollouts: RolloutService,
                  meta: MetaAgent, run_dir: str | Path, evolution: EvolutionConfig, *, critic: Critic | None = None,
                  rounds_per_stage: int = 1, attempts: int = 1, references: Mapping[str, Trace] | None = None,
                  distractors_per_stage: int = 0, seed: int = 0) -> ProtocolResult:
    """AEGIS carried across stages (see the module docstring), built as the main job builds it
    (``coevo.loop.builders.build_aegis`` over ``evolution``; ``critic`` replaces its Critic).

    ``references``: task id → reference trajectory of adaptation-split (train) tasks; at stage s
    AEGIS sees only those of cohorts ≤ s, so no demonstration uses a capability not yet released.
    ``rounds_per_stage`` = 0 evaluates the carried harness without adapting (a control).
    ``run_dir``: where each stage's loop writes its run directory (records, lineage, checkpoints).
    """
    if rounds_per_stage < 0:
        raise ValueError(f"rounds_per_stage must be >= 0, got {rounds_per_stage}")
    starts = stage_harnesses(stream, base, axis_harness, distractors_per_stage)  # checks every stage up front
    universe = frozenset(stream.universe)
    cohort_of = {t.task_id: s for s, cohort in enumerate(stream.cohorts) for t in cohort}
    probe = next(t for cohort in stream.cohorts for t in cohort)  # any task: only its session's tools are read
    aegis = build_aegis(evolution, starts[0], rollouts, meta, tasks={t.task_id: t for c in stream.adapt for t in c},
                        references={}, tools=[], critic=critic)
    result = ProtocolResult("self_evolving", stream.n_stages)
    progress = rollouts.progress or NullProgress()
    next_round = 0  # AEGIS numbers its rounds across stages (its monitors need them to increase)
    for s in range(stream.n_stages):
        if s > 0:  # the new capabilities arrive in the carried harnesses, evolved processors stay
            aegis.release(lambda h, s=s: axis_harness(h, stream.cumulative[s], universe, distractors_per_stage * s),
                          round=next_round - 1, note=f"stage {s} released")
        aegis.references = {tid: r for tid, r in (references or {}).items() if cohort_of.get(tid, s + 1) <= s}
        aegis.critic_pool = {t.task_id: t for j in range(s + 1) for t in stream.adapt[j]}  # released cohorts only
        aegis.tools = exposed_tools(aegis.harness(), rollouts.env, probe)
        reruns = aegis.critic.reruns
        batch = list(stream.adapt[s])
        if batch and rounds_per_stage:
            schedule = Schedule(rounds=rounds_per_stage, batch_tasks=len(batch), attempts=attempts, seed=seed,
                                steps_per_round=0, val_every=0, eval_attempts=attempts, first_round=next_round)
            loop = Coevolution(mode="harness_only", rollouts=rollouts, aegis=aegis, splits=Splits(batch),
                               run_dir=Path(run_dir) / f"stage-{s}", schedule=schedule, tracker=NullTracker(),
                               progress=progress)
            next_round += rounds_per_stage
            for record in loop.run():
                result.adapt_tokens[s] += record.train.tokens
                result.evolve_reports.append({"stage": s, **record.evolve.to_dict()})
        result.critic_episodes[s] = aegis.critic.reruns - reruns
        tasks = [(j, t) for j in range(s + 1) for t in stream.evaluate[j]]
        harnesses, variants = aegis.routed([t for _, t in tasks])
        items = [(s, j, t, h, v) for (j, t), h, v in zip(tasks, harnesses, variants, strict=True)]
        result.outcomes += evaluate_items(items, rollouts, attempts=attempts,
                                          description=f"self-evolving stage {s}: evaluate")
        result.harness_ids[s] = sorted({h.id for _, _, _, h, _ in items})
        result.harnesses.append(aegis.current())
    return result
