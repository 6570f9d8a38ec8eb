"""The tools a harness lists, and listing only those its episodes call.

Every tool the ``tool_registry`` enables costs its line in the system prompt (name, description,
argument schema) on every model call, whether or not the model ever calls it. On the reasoning env
the Python tool's line is about 35 of SmolLM2's tokens a call, and no episode of three distill runs
called it (1,536 buffered episodes). A harness that lists only the tools its episodes call is
leaner in the sense the Critic judges removals: it needs no gain to ship, only no harm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coevo.harness.edit_record import Edit
from coevo.harness.harness import Harness
from coevo.harness.processor import Processor


def _registry(harness: Harness) -> Processor | None:
    return next((p for p in harness.processors if p.kind == "tool_registry"), None)


def unlisting(harness: Harness, called: Iterable[str], offered: Sequence[str] | None = None) -> Edit | None:
    """The ``set_param`` of the harness's ``tool_registry`` that enables only the listed tools in
    ``called``; None when the harness has no registry, when no listed tool was called (the model
    that calls none is not shown fewer), or when every listed tool was. ``offered``: the tools the
    environment offers, which a registry enabling ``*`` lists (None: not known, so any tool named
    in ``called`` counts as listed)."""
    registry = _registry(harness)
    if registry is None:
        return None
    enabled = list(registry.config["enabled"])
    listed = enabled if "*" not in enabled else None if offered is None else list(offered)
    keep = sorted({t for t in called if listed is None or t in listed})
    if not keep or (listed is not None and set(keep) == set(listed)):
        return None
    return Edit("set_param", registry.name, param="enabled", value=keep)


def lists_fewer(parent: Harness, edits: Sequence[Edit]) -> bool:
    """Whether ``edits`` only narrow the parent's ``tool_registry``: one ``set_param`` of its
    ``enabled`` to a strict subset of what it enables (any explicit list, where it enables ``*``)."""
    registry = _registry(parent)
    if registry is None or len(edits) != 1:
        return False
    edit = edits[0]
    if edit.op != "set_param" or edit.processor != registry.name or edit.param != "enabled":
        return False
    value, enabled = list(edit.value or []), list(registry.config["enabled"])
    if not value or "*" in value:
        return False
    return "*" in enabled or set(value) < set(enabled)
