"""Scaffolding: the processors that make a model behave as it should by forcing or showing it, not
by telling it what exists. A forced tool-call prefill (``tool_choice``) writes the opening of the
call for the model; demonstrations (``few_shot``) show whole worked episodes. Both cost tokens on
every call, and a model that has learned the behaviour no longer needs them.

Scaffolding comes off one layer at a time, outermost first (``SCAFFOLD_KINDS``): the forced prefill,
then the demonstrations. ``without_outer_scaffold`` is the harness the loop measures the model on
beside the scaffolded one: its episodes join their tasks' GRPO groups, so the weights learn to do
unforced what the outer layer forces while the inner layers still show it, and AEGIS proposes
removing the layer once they show the behaviour (``coevo.meta.retire``).
"""

from __future__ import annotations

from coevo.harness.harness import Harness

SCAFFOLD_KINDS = ("tool_choice", "few_shot")
"""Processor kinds that force or demonstrate behaviour, outermost (retired first) first."""


def scaffold_names(harness: Harness) -> list[str]:
    """Instance names of the harness's scaffold processors, in ``SCAFFOLD_KINDS`` order."""
    return [p.name for kind in SCAFFOLD_KINDS for p in harness.processors if p.kind == kind]


def outer_scaffold(harness: Harness) -> list[str]:
    """Instance names of the outermost scaffold layer the harness holds (every processor of the
    first kind of ``SCAFFOLD_KINDS`` present); empty when it holds none."""
    kind = next((k for k in SCAFFOLD_KINDS if any(p.kind == k for p in harness.processors)), None)
    return [p.name for p in harness.processors if p.kind == kind]


def _without(harness: Harness, names: list[str]) -> Harness:
    for name in names:
        harness = harness.remove(name)
    return harness


def without_outer_scaffold(harness: Harness) -> Harness:
    """``harness`` without its outermost scaffold layer (the same object when it holds none)."""
    return _without(harness, outer_scaffold(harness))


def without_scaffold(harness: Harness) -> Harness:
    """``harness`` with every scaffold processor removed (the same object when it holds none)."""
    return _without(harness, scaffold_names(harness))


def _demonstration_starts(turns: list[dict]) -> list[int]:
    """Indices of the user turns that open each demonstration of a ``few_shot`` ``turns`` list."""
    return [i for i, t in enumerate(turns) if t.get("role") == "user"]


def _shown(config: dict) -> int:
    """Demonstrations one ``few_shot`` processor's config shows: its pairs and its turn lists."""
    return len(config["demos"]) // 2 + len(_demonstration_starts(config["turns"]))


def demonstration_count(harness: Harness) -> int:
    """How many worked demonstrations the harness's ``few_shot`` processors show (pairs and turns)."""
    return sum(_shown(p.config) for p in harness.processors if p.kind == "few_shot")


def with_one_demonstration_fewer(harness: Harness) -> Harness:
    """``harness`` showing one demonstration fewer: the last ``few_shot`` processor's last one (the
    nearest the task), the processor removed when it showed only that one. The step between
    keeping every demonstration and removing them all (``without_outer_scaffold``), each costing
    its tokens on every call; the same object when the harness shows none."""
    shots = [p for p in harness.processors if p.kind == "few_shot" and _shown(p.config)]
    if not shots:
        return harness
    p = shots[-1]
    if _shown(p.config) == 1:
        return harness.remove(p.name)
    turns = list(p.config["turns"])
    if turns:
        return harness.set_param(p.name, "turns", turns[: _demonstration_starts(turns)[-1]])
    return harness.set_param(p.name, "demos", list(p.config["demos"])[:-2])
