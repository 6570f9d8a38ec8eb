"""Edits: typed, serialisable operations on a harness.

An ``Edit`` is what a meta-agent proposes and what a harness records as the step from its
parent, so the lineage of harness versions can be replayed. Prompt edits and code-level edits
are ``set_param`` on a prompt parameter and ``insert``/``replace`` of a ``code`` processor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coevo.harness.harness import Harness

EDIT_OPS = ("insert", "remove", "replace", "set_param")


@dataclass(frozen=True)
class Edit:
    """One operation. ``processor`` names the instance it targets (for insert: the new one).

    ``spec`` is the new processor's spec (insert/replace); ``index``/``after`` place an insert
    within its hook; ``param``/``value`` are for set_param. ``manifest`` holds the proposer's
    change manifest (hypothesis, scope, predicted impact), which does not affect application.
    """

    op: str
    processor: str
    spec: dict[str, Any] | None = None
    index: int | None = None
    after: str | None = None
    param: str | None = None
    value: Any = None
    manifest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.op not in EDIT_OPS:
            raise ValueError(f"edit op must be one of {EDIT_OPS}, got {self.op!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Edit":
        return cls(**data)

    def describe(self) -> str:
        if self.op == "set_param":
            return f"set_param {self.processor}.{self.param}"
        kind = (self.spec or {}).get("kind", "")
        return f"{self.op} {self.processor}" + (f" ({kind})" if kind else "")


def check_proposed(harness: "Harness", edit: Edit) -> None:
    """Refuse, before anything is imported, a proposed edit whose new processor names its kind by
    import path (``package.module:Class``) in a module this process has not loaded. Building an
    import-path kind imports its module, so a kind invented by a meta-agent could run any module of
    the host at the Critic's build step. The user's own processors stay proposable: their module is
    loaded already (the starting harness names them, or the user's meta-agent imports them)."""
    import sys

    from coevo.harness.library import PROCESSORS

    kind = (edit.spec or {}).get("kind") if edit.op in ("insert", "replace") else None
    if not isinstance(kind, str) or kind in PROCESSORS or kind in {p.kind for p in harness}:
        return
    if kind.partition(":")[0] in sys.modules:
        return
    raise ValueError(f"{edit.describe()}: kind {kind!r} is not a built-in kind, and its module is not loaded; a "
                     "proposal may not import code (name the kind in the starting harness, or import its module "
                     "in your meta-agent's)")


def apply_edit(harness: "Harness", edit: Edit) -> "Harness":
    """Apply ``edit`` to ``harness`` through the type-checked algebra; the result records it."""
    from coevo.harness.library import build_processor

    if edit.op == "insert":
        return harness.insert(build_processor(edit.spec or {}), index=edit.index, after=edit.after, manifest=edit.manifest)
    if edit.op == "remove":
        return harness.remove(edit.processor, manifest=edit.manifest)
    if edit.op == "replace":
        return harness.replace(edit.processor, build_processor(edit.spec or {}), manifest=edit.manifest)
    return harness.set_param(edit.processor, edit.param or "", edit.value, manifest=edit.manifest)
