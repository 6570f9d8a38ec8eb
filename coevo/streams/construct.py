"""Harness streams (EvoHarnessBench §3.2): from capability-annotated tasks to cumulative stages.

The pipeline, for one axis (the capabilities whose names start with a prefix such as ``tool:``):

1. annotations: a task's capabilities on the axis, prefix stripped (``tool:python`` → ``python``);
   a task with none needs nothing from the axis;
2. frequency-ranked release: the universe U is ranked by f(c) = number of tasks needing c (ties by
   name, so the order is the same on every machine) and cut into S contiguous buckets of near-equal
   size, most frequent first: core capabilities are released early, the long tail late;
3. cumulative harness: C_s = released_0 ∪ … ∪ released_s, so C_0 ⊆ C_1 ⊆ … and nothing is ever
   removed once released;
4. assignment: each task goes to the earliest stage whose C_s holds all it needs,
   stage(τ) = max_{c ∈ needs(τ)} release(c), and tasks needing nothing go to stage 0.

Step 4 gives the paper's two guarantees by construction, and ``check_stream`` asserts them anyway:
feasibility (needs(τ) ⊆ C_stage(τ)) and new-capability pressure (needs(τ) ∩ released_stage(τ) ≠ ∅,
except for tasks that need nothing on the axis, which sit in stage 0).

Splits: the tasks' own splits, not a new hash split. ``train`` tasks form a cohort's adaptation
split (what self-evolving adaptation may learn from) and tasks of ``eval_splits`` (``val`` by
default, so the sealed test split stays sealed unless asked for) its evaluation split; tasks of
other splits belong to a cohort but to neither split. Within each split a cohort is ordered by a
hash of (seed, task id), so ``adapt_limit``/``eval_limit`` take a deterministic sample spread over
the cohort rather than the first dataset of an env's generation order.

A stage may end up with an empty cohort (every task needing one of its capabilities also needs a
later one); it is kept, so stage s still means C_s, and its cells in the metrics are undefined.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from coevo.envs.base import SPLITS, Task

ADAPT_SPLIT = "train"
EVAL_SPLITS = tuple(s for s in SPLITS if s != ADAPT_SPLIT)


class StreamError(ValueError):
    """A stream breaks a construction guarantee (feasibility, pressure, nesting, partition)."""


@dataclass(frozen=True)
class Stream:
    """One axis's harness stream. Per-stage tuples are indexed by stage s = 0 … n_stages - 1."""

    prefix: str  # the axis: capabilities named ``<prefix><name>``
    universe: tuple[str, ...]  # capability names (prefix stripped), most frequent first
    frequency: Mapping[str, int]  # capability → number of tasks (all splits) needing it
    released: tuple[tuple[str, ...], ...]  # [s] → capabilities new at stage s, in rank order
    cumulative: tuple[frozenset[str], ...]  # [s] → C_s, everything released up to stage s
    cohorts: tuple[tuple[Task, ...], ...]  # [s] → every task assigned to stage s (all splits)
    adapt: tuple[tuple[Task, ...], ...]  # [s] → the cohort's adaptation split (after adapt_limit)
    evaluate: tuple[tuple[Task, ...], ...]  # [s] → the cohort's evaluation split (after eval_limit)

    @property
    def n_stages(self) -> int:
        return len(self.released)

    def needs(self, task: Task) -> frozenset[str]:
        """What ``task`` needs from this axis (prefix stripped)."""
        return axis_capabilities(task, self.prefix)

    def stage_of(self, task_id: str) -> int:
        for stage, cohort in enumerate(self.cohorts):
            if any(t.task_id == task_id for t in cohort):
                return stage
        raise KeyError(f"task {task_id!r} is not in this stream")

    def summary(self) -> dict[str, object]:
        """Plain JSON description: capabilities per stage and cohort sizes and ids."""
        return {
            "prefix": self.prefix,
            "universe": list(self.universe),
            "frequency": dict(self.frequency),
            "stages": [
                {
                    "stage": s,
                    "released": list(self.released[s]),
                    "cumulative": sorted(self.cumulative[s]),
                    "cohort": len(self.cohorts[s]),
                    "adapt": [t.task_id for t in self.adapt[s]],
                    "evaluate": [t.task_id for t in self.evaluate[s]],
                }
                for s in range(self.n_stages)
            ],
        }


def axis_capabilities(task: Task, prefix: str) -> frozenset[str]:
    """``task``'s capabilities that start with ``prefix``, with the prefix removed."""
    return frozenset(c[len(prefix):] for c in task.capabilities if c.startswith(prefix) and len(c) > len(prefix))


def release_schedule(frequency: Mapping[str, int], stages: int) -> tuple[tuple[str, ...], ...]:
    """Rank capabilities by frequency (descending, ties by name) and cut the ranking into
    ``min(stages, |U|)`` contiguous buckets whose sizes differ by at most one, larger ones first."""
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if not frequency:
        raise ValueError("cannot release an empty capability universe")
    ranked = sorted(frequency, key=lambda c: (-frequency[c], c))
    n = min(stages, len(ranked))
    size, extra = divmod(len(ranked), n)
    buckets, start = [], 0
    for s in range(n):
        end = start + size + (1 if s < extra else 0)
        buckets.append(tuple(ranked[start:end]))
        start = end
    return tuple(buckets)


def hash_order(tasks: Iterable[Task], seed: int) -> list[Task]:
    """A deterministic shuffle: tasks sorted by sha256(seed:task_id)."""
    return sorted(tasks, key=lambda t: hashlib.sha256(f"{seed}:{t.task_id}".encode()).hexdigest())


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{name} must be None or an integer >= 0, got {value!r}")


def build_stream(
    tasks: Sequence[Task],
    *,
    prefix: str,
    stages: int,
    eval_splits: Sequence[str] = ("val",),
    adapt_limit: int | None = None,
    eval_limit: int | None = None,
    seed: int = 0,
) -> Stream:
    """Build the stream of one axis from ``tasks`` (any splits; see the module docstring).

    ``stages`` is clipped to the universe size; ``adapt_limit``/``eval_limit`` cap each cohort's
    adaptation/evaluation split (None: all). Raises ValueError on bad arguments and when no task
    has a capability with ``prefix``; ``StreamError`` if a guarantee were broken.
    """
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if isinstance(eval_splits, str):
        raise ValueError(f"eval_splits must be a list of split names, not the string {eval_splits!r}")  # noqa: TRY004
    bad = [s for s in eval_splits if s not in EVAL_SPLITS]
    if bad or not eval_splits:
        raise ValueError(f"eval_splits must be a non-empty subset of {list(EVAL_SPLITS)}, got {list(eval_splits)}")
    _check_limit("adapt_limit", adapt_limit)
    _check_limit("eval_limit", eval_limit)
    ids = Counter(t.task_id for t in tasks)
    twice = sorted(i for i, n in ids.items() if n > 1)
    if twice:
        raise ValueError(f"tasks must have unique ids; repeated: {twice[:5]}")
    needs = {t.task_id: axis_capabilities(t, prefix) for t in tasks}
    frequency = Counter(c for caps in needs.values() for c in caps)
    if not frequency:
        seen = sorted({c for t in tasks for c in t.capabilities})[:8]
        raise ValueError(f"no task has a capability with prefix {prefix!r} ({len(tasks)} tasks; "
                         f"capabilities seen: {seen}); annotate tasks or choose another axis")
    released = release_schedule(frequency, stages)
    release = {c: s for s, bucket in enumerate(released) for c in bucket}
    cumulative, acc = [], frozenset()
    for bucket in released:
        acc = acc | frozenset(bucket)
        cumulative.append(acc)
    cohorts: list[list[Task]] = [[] for _ in released]
    for task in tasks:
        caps = needs[task.task_id]
        cohorts[max((release[c] for c in caps), default=0)].append(task)
    adapt, evaluate = [], []
    for cohort in cohorts:
        ordered = hash_order(cohort, seed)
        adapt.append(tuple([t for t in ordered if t.split == ADAPT_SPLIT][:adapt_limit]))
        evaluate.append(tuple([t for t in ordered if t.split in eval_splits][:eval_limit]))
    stream = Stream(
        prefix=prefix,
        universe=tuple(c for bucket in released for c in bucket),
        frequency=MappingProxyType(dict(frequency)),
        released=released,
        cumulative=tuple(cumulative),
        cohorts=tuple(tuple(c) for c in cohorts),
        adapt=tuple(adapt),
        evaluate=tuple(evaluate),
    )
    check_stream(stream)
    return stream


def check_stream(stream: Stream) -> None:
    """Raise ``StreamError`` naming the first broken guarantee: releases partition the universe,
    C_s is the running union of releases, every task sits in one cohort, feasibility, pressure,
    and the splits are disjoint parts of their cohort."""
    released = [set(b) for b in stream.released]
    if not released:
        raise StreamError("a stream needs at least one stage")
    flat = [c for b in stream.released for c in b]
    if len(flat) != len(set(flat)) or set(flat) != set(stream.universe) or any(not b for b in released):
        raise StreamError(f"releases {stream.released} must be non-empty disjoint buckets covering {stream.universe}")
    n = stream.n_stages
    if not (len(stream.cumulative) == len(stream.cohorts) == len(stream.adapt) == len(stream.evaluate) == n):
        raise StreamError(f"per-stage fields must all have {n} entries")
    union: set[str] = set()
    for s in range(n):
        union |= released[s]
        if set(stream.cumulative[s]) != union:
            raise StreamError(f"stage {s}: cumulative set {sorted(stream.cumulative[s])} is not the union of "
                              f"releases so far {sorted(union)}")
    seen: dict[str, int] = {}
    for s, cohort in enumerate(stream.cohorts):
        for task in cohort:
            if task.task_id in seen:
                raise StreamError(f"task {task.task_id!r} is in cohorts {seen[task.task_id]} and {s}")
            seen[task.task_id] = s
            caps = stream.needs(task)
            if not caps <= stream.cumulative[s]:
                raise StreamError(f"feasibility: task {task.task_id!r} at stage {s} needs "
                                  f"{sorted(caps - stream.cumulative[s])}, not released by then")
            if caps and not caps & released[s]:
                raise StreamError(f"new-capability pressure: task {task.task_id!r} at stage {s} needs nothing "
                                  f"released at stage {s} ({sorted(released[s])}); it belongs to an earlier stage")
            if not caps and s != 0:
                raise StreamError(f"task {task.task_id!r} needs nothing on the axis but sits at stage {s}, not 0")
        ids = {t.task_id for t in cohort}
        adapt, evaluate = {t.task_id for t in stream.adapt[s]}, {t.task_id for t in stream.evaluate[s]}
        if not adapt <= ids or not evaluate <= ids or adapt & evaluate:
            raise StreamError(f"stage {s}: adaptation and evaluation splits must be disjoint parts of the cohort")
