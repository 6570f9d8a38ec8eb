"""The ``Edit`` record: one typed, serialisable operation on a harness.

An ``Edit`` is what a meta-agent proposes and what a harness records as the step from its
parent, so the lineage of harness versions can be replayed. Prompt edits and code-level edits
are ``set_param`` on a prompt parameter and ``insert``/``replace`` of a ``code`` processor.
It is plain data: ``coevo.harness.edits`` applies it (and re-exports it, the public path).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
    def from_dict(cls, data: dict[str, Any]) -> Edit:
        return cls(**data)

    def describe(self) -> str:
        if self.op == "set_param":
            return f"set_param {self.processor}.{self.param}"
        kind = (self.spec or {}).get("kind", "")  # named only when the processor's name does not say it
        return f"{self.op} {self.processor}" + (f" ({kind})" if kind and kind != self.processor else "")


def edits_key(edits: Sequence[Edit]) -> str:
    """Identity of a change (its edits without their manifests): equal for equal changes."""
    return json.dumps([e.to_dict() | {"manifest": None} for e in edits], sort_keys=True, default=str)
