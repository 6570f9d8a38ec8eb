"""Scaffolding: the processors that make a model behave as it should by forcing or showing it, not
by telling it what exists. A forced tool-call prefill (``tool_choice``) writes the opening of the
call for the model; demonstrations (``few_shot``) show whole worked episodes. Both cost tokens on
every call, and a model that has learned the behaviour no longer needs them.

Scaffolding comes off one layer at a time, outermost first (``SCAFFOLD_KINDS``): the
demonstrations one by one, the one nearest the task first, then the forced prefill.
``without_outer_scaffold`` is the harness the loop measures the model on beside the scaffolded
one: its episodes join their tasks' GRPO groups, so the weights learn to do without the outer
layer while the inner layers still show it, and AEGIS proposes removing the layer once they show
the behaviour (``coevo.meta.retire``). The demonstrations go first because they are what a
scaffolded prompt pays for: each costs 76-87 tokens on every call, the prefill 19 on the first
(SmolLM2's tokenizer, the reasoning env's demonstrations), and each shed costs rounds (the
prefill's took one to four a seed: docs/RESULTS.md), so the tokens are saved before the cheap
layer is argued over. Demonstrations come off singly because a model that cannot yet do without
any of them can often do with one fewer: removing them all at once would ask for the whole
step at once.
"""

from __future__ import annotations

from coevo.harness.edit_record import Edit
from coevo.harness.harness import Harness
from coevo.harness.processor import Processor

SCAFFOLD_KINDS = ("few_shot", "tool_choice")
"""Processor kinds that demonstrate or force behaviour, outermost (retired first) first."""


def scaffold_names(harness: Harness) -> list[str]:
    """Instance names of the harness's scaffold processors, in ``SCAFFOLD_KINDS`` order."""
    return [p.name for kind in SCAFFOLD_KINDS for p in harness.processors if p.kind == kind]


def _outer_kind(harness: Harness) -> str | None:
    """The kind of the outermost scaffold layer held: a ``few_shot`` processor counts only while it
    shows a demonstration."""
    held = {p.kind for p in harness.processors if p.kind != "few_shot" or _shown(p.config)}
    return next((k for k in SCAFFOLD_KINDS if k in held), None)


def outer_scaffold(harness: Harness) -> list[str]:
    """What the outermost scaffold layer is, in words a digest shows: the instance names of every
    forced prefill, or of the ``few_shot`` processor losing a demonstration (with "(its last
    demonstration)" while it shows more than one); empty when the harness holds no scaffolding."""
    kind = _outer_kind(harness)
    if kind == "few_shot":
        p = _nearest_shots(harness)
        return [p.name if _shown(p.config) == 1 else f"{p.name} (its last demonstration)"]
    return [p.name for p in harness.processors if p.kind == kind]


def _without(harness: Harness, names: list[str]) -> Harness:
    for name in names:
        harness = harness.remove(name)
    return harness


def without_outer_scaffold(harness: Harness) -> Harness:
    """``harness`` without its outermost scaffold layer (the same object when it holds none)."""
    if _outer_kind(harness) == "few_shot":
        return with_one_demonstration_fewer(harness)
    return _without(harness, outer_scaffold(harness))


def retire_outer_scaffold(harness: Harness) -> list[Edit]:
    """The edits that turn ``harness`` into ``without_outer_scaffold(harness)``: removing each
    prefill, or the last demonstration (a ``set_param`` of the ``few_shot`` processor's turns or
    pairs, its removal when it shows only that one); none when it holds no scaffolding."""
    if _outer_kind(harness) != "few_shot":
        return [Edit("remove", name) for name in outer_scaffold(harness)]
    p = _nearest_shots(harness)
    if _shown(p.config) == 1:
        return [Edit("remove", p.name)]
    param, value = _fewer(p.config)
    return [Edit("set_param", p.name, param=param, value=value)]


def scaffold_layers(harness: Harness) -> int:
    """Layers of scaffolding the harness holds: each prefill and each demonstration."""
    return sum(p.kind == "tool_choice" for p in harness.processors) + demonstration_count(harness)


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
    p = _nearest_shots(harness)
    if p is None:
        return harness
    if _shown(p.config) == 1:
        return harness.remove(p.name)
    return harness.set_param(p.name, *_fewer(p.config))


def _nearest_shots(harness: Harness) -> Processor | None:
    """The ``few_shot`` processor whose last demonstration is nearest the task (the last one that
    shows any), or None."""
    return next((p for p in reversed(harness.processors) if p.kind == "few_shot" and _shown(p.config)), None)


def _fewer(config: dict) -> tuple[str, list]:
    """(param, value): a ``few_shot`` config's demonstrations without the last one (turn lists come
    after the pairs, so the last is a turn list's when it holds any)."""
    turns = list(config["turns"])
    if turns:
        return "turns", turns[: _demonstration_starts(turns)[-1]]
    return "demos", list(config["demos"])[:-2]
