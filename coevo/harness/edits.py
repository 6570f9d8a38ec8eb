"""Edits: typed, serialisable operations on a harness, and how they are applied.

An ``Edit`` (defined in ``coevo.harness.edit_record``, below the ``Harness`` that records it) is
what a meta-agent proposes and what a harness records as the step from its parent, so the lineage
of harness versions can be replayed. ``apply_edit`` replays one through the type-checked algebra;
``check_proposed`` refuses a proposed one that would import code.
"""

from __future__ import annotations

import sys

from coevo.harness.edit_record import EDIT_OPS, Edit
from coevo.harness.harness import Harness
from coevo.harness.library import PROCESSORS, build_processor

__all__ = ["EDIT_OPS", "Edit", "apply_edit", "check_proposed"]


def check_proposed(harness: Harness, edit: Edit) -> None:
    """Refuse, before anything is imported, a proposed edit whose new processor names its kind by
    import path (``package.module:Class``) in a module this process has not loaded. Building an
    import-path kind imports its module, so a kind invented by a meta-agent could run any module of
    the host at the Critic's build step. The user's own processors stay proposable: their module is
    loaded already (the starting harness names them, or the user's meta-agent imports them)."""
    kind = (edit.spec or {}).get("kind") if edit.op in ("insert", "replace") else None
    if not isinstance(kind, str) or kind in PROCESSORS or kind in {p.kind for p in harness}:
        return
    if kind.partition(":")[0] in sys.modules:
        return
    raise ValueError(f"{edit.describe()}: kind {kind!r} is not a built-in kind, and its module is not loaded; a "
                     "proposal may not import code (name the kind in the starting harness, or import its module "
                     "in your meta-agent's)")


def apply_edit(harness: Harness, edit: Edit) -> Harness:
    """Apply ``edit`` to ``harness`` through the type-checked algebra; the result records it."""
    if edit.op == "insert":
        return harness.insert(build_processor(edit.spec or {}), index=edit.index, after=edit.after,
                              manifest=edit.manifest)
    if edit.op == "remove":
        return harness.remove(edit.processor, manifest=edit.manifest)
    if edit.op == "replace":
        return harness.replace(edit.processor, build_processor(edit.spec or {}), manifest=edit.manifest)
    return harness.set_param(edit.processor, edit.param or "", edit.value, manifest=edit.manifest)
