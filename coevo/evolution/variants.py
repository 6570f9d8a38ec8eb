"""Harness variants and how tasks are routed to them (HarnessX §4.5; OO-Harness's router).

Up to K variants live side by side. Each task runs on the variant with the best prior record for
it — its pass rate on that task, ties going to the base — so an edit that helps one kind of task
and hurts another can live in its own variant instead of being thrown away. Records are per
(variant, task): passes and attempts, from rollouts and from the Critic's re-runs.

The optional router is the OO-Harness alternative: a callable that reads the task, the digest
line of its base trajectory and the routing lessons, and names a variant with a confidence; below
the threshold, or naming an unknown variant, the task falls back to the base.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coevo.config.schema import EvolutionConfig
from coevo.envs.base import Task
from coevo.harness.harness import Harness

BASE = "base"

RouteFn = Callable[[str, Mapping[str, str], Sequence[str]], tuple[str, float]]
"""(task text + its base-trajectory digest, variant name → description, lessons) → (variant, confidence)."""


@dataclass
class LessonStore:
    """Short lessons kept newest-last, capped so prompts stay bounded; duplicates are not re-added."""

    cap: int = 20
    items: list[str] = field(default_factory=list)

    def add(self, lesson: str) -> None:
        lesson = " ".join(lesson.split())
        if lesson and lesson not in self.items:
            self.items.append(lesson)
            del self.items[: max(0, len(self.items) - self.cap)]

    def to_dict(self) -> dict[str, Any]:
        return {"cap": self.cap, "items": list(self.items)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LessonStore:
        return cls(cap=int(data["cap"]), items=list(data["items"]))


class VariantSet:
    """The current harness of each variant and the per-task records that route tasks to them."""

    def __init__(self, base: Harness, *, max_variants: int = EvolutionConfig.max_variants) -> None:
        if max_variants < 1:
            raise ValueError(f"max_variants must be >= 1, got {max_variants}")
        self.max_variants = max_variants
        self.harnesses: dict[str, Harness] = {BASE: base}
        self.records: dict[str, dict[str, list[int]]] = {BASE: {}}  # variant -> task -> [passes, attempts]

    def __contains__(self, name: object) -> bool:
        return name in self.harnesses

    def names(self) -> list[str]:
        return list(self.harnesses)

    def record(self, variant: str, outcomes: Mapping[str, Iterable[bool]]) -> None:
        """Add attempts of ``variant`` on tasks (task id → outcomes)."""
        table = self.records.setdefault(variant, {})
        for tid, outs in outcomes.items():
            outs = list(outs)
            row = table.setdefault(tid, [0, 0])
            row[0] += sum(bool(o) for o in outs)
            row[1] += len(outs)

    def rate(self, variant: str, task_id: str) -> float | None:
        row = self.records.get(variant, {}).get(task_id)
        return row[0] / row[1] if row and row[1] else None

    def best_for(self, task_id: str) -> str:
        """The variant with the highest pass rate on the task; unknown rates count as 0 and ties
        go to the base, then to the older variant (insertion order)."""
        best, best_rate = BASE, self.rate(BASE, task_id) or 0.0
        for name in self.harnesses:
            rate = self.rate(name, task_id) or 0.0
            if rate > best_rate:
                best, best_rate = name, rate
        return best

    def assign(self, tasks: Sequence[Task], *, router: RouteFn | None = None, threshold: float = 0.5,
               lessons: Sequence[str] = (), notes: Mapping[str, str] | None = None) -> dict[str, str]:
        """task id → variant. With a ``router``, its choice wins when confident enough and the
        variant exists; otherwise the record decides. ``notes``: task id → its base digest line."""
        out = {}
        descriptions = {n: self.describe(n) for n in self.harnesses}
        for task in tasks:
            choice = self.best_for(task.task_id)
            if router is not None and len(self.harnesses) > 1:
                text = task.instruction + ("\nBase trajectory: " + notes[task.task_id]
                                           if notes and task.task_id in notes else "")
                name, confidence = router(text, descriptions, list(lessons))
                choice = name if name in self.harnesses and confidence >= threshold else BASE
            out[task.task_id] = choice
        return out

    def describe(self, name: str) -> str:
        """One line per variant for a router: its edit history and record."""
        h = self.harnesses[name]
        table = self.records.get(name, {})
        won = sorted(t for t, (p, n) in table.items() if n and p / n >= 0.5)
        edit = h.edit.describe() if h.edit is not None else "no edits"
        return f"{name}: last edit {edit}; passes {len(won)} of {len(table)} recorded tasks"

    def can_spawn(self) -> bool:
        return len(self.harnesses) < self.max_variants

    def spawn(self, harness: Harness, outcomes: Mapping[str, Iterable[bool]]) -> str:
        """A new variant seeded with ``harness`` and the outcomes that justified it."""
        if not self.can_spawn():
            raise ValueError(f"already {len(self.harnesses)} variants (max_variants={self.max_variants})")
        name = f"v{len(self.harnesses)}"
        self.harnesses[name] = harness
        self.records[name] = {}
        self.record(name, outcomes)
        return name

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_variants": self.max_variants,
            "harnesses": {n: h.to_dict() for n, h in self.harnesses.items()},
            "records": {n: {t: list(r) for t, r in table.items()} for n, table in self.records.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VariantSet:
        harnesses = {n: Harness.from_dict(h) for n, h in data["harnesses"].items()}
        out = cls(harnesses[BASE], max_variants=int(data["max_variants"]))
        out.harnesses = harnesses
        out.records = {n: {t: list(r) for t, r in table.items()} for n, table in data["records"].items()}
        return out
