"""The vocabulary a rule template is written in: ``Draft`` (what a template returns), ``Template``
(one catalogue entry), and the helpers that read a harness and make edits that apply to it
(``find_kind``, ``insert_edit``, ``set_edit``, ``applies``, ``flatten``).

The built-in templates (``coevo.meta.templates``) and templates of your own (docs/processors.md)
use them alike; the rule meta-agent (``coevo.meta.rule``) runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coevo.evolution.meta_agent import Demo, PlanContext
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.errors import CompositionError
from coevo.harness.events import Message
from coevo.harness.harness import Harness
from coevo.harness.library import processor_class
from coevo.harness.processor import Processor
from coevo.rundir.evolve_records import Cluster

Draft = tuple[str, list[Edit]]
"""What a template returns: the hypothesis and the edits that test it."""


@dataclass(frozen=True)
class Template:
    """One catalogue entry. ``kinds`` are the processor kinds its edits touch: they identify which
    template a proposal came from (for ``revise``) and the first one gives the proposal's dimension."""

    name: str
    kinds: tuple[str, ...]
    build: Callable[[Cluster, Harness, PlanContext], Draft | None]

    def made(self, kinds: set[str]) -> bool:
        """Whether a proposal touching processor ``kinds`` can come from this template: it touches
        the template's first kind and no kind outside the template's (a template may leave its
        later kinds out, e.g. ``tool_choice`` adds demonstrations only where some are missing)."""
        return self.kinds[0] in kinds and kinds <= set(self.kinds)

    @property
    def dimension(self) -> str:
        return processor_class(self.kinds[0]).dimension.value


# ---------------------------------------------------------------------------------------- helpers
def find_kind(harness: Harness, kind: str) -> Processor | None:
    """The first processor of ``kind`` in firing order, or None."""
    return next((p for p in harness if p.kind == kind), None)


def fresh_name(harness: Harness, kind: str) -> str:
    name, k = kind, 2
    while name in harness:
        name, k = f"{kind}_{k}", k + 1
    return name


def insert_edit(harness: Harness, processor: Processor) -> Edit | None:
    """An insert of ``processor`` at the latest position of its hook that the algebra accepts.

    Trying positions from the end backwards respects ``runs_after`` and event-type constraints
    without restating them here (e.g. ``python_executor`` must precede ``tool_registry``).
    Returns None when no position works (a singleton conflict, say)."""
    for index in range(len(harness.at(processor.hook)), -1, -1):
        try:
            harness.insert(processor, index=index)
        except CompositionError:
            continue
        return Edit("insert", processor.name, spec=processor.spec(), index=index)
    return None


def set_edit(harness: Harness, kind: str, param: str, value: object) -> Edit | None:
    """A set_param on the present processor of ``kind``, or None when absent or already ``value``."""
    p = find_kind(harness, kind)
    if p is None or p.config[param] == value:
        return None
    return Edit("set_param", p.name, param=param, value=value)


def applies(harness: Harness, edits: list[Edit]) -> bool:
    """Whether ``edits`` apply in order and change the harness."""
    current = harness
    try:
        for e in edits:
            current = apply_edit(current, e)
    except (CompositionError, ValueError, TypeError):
        return False
    return bool(edits) and current.id != harness.id


def flatten(demos: list[Demo]) -> list[Message]:
    """Demonstrations as one ``few_shot`` ``turns`` list."""
    return [dict(turn) for demo in demos for turn in demo]

