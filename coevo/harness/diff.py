"""Differences between two harnesses, named by processor, parameter and prompt text.

Processors are matched by instance name. Prompt parameters (type ``prompt``) are shown as a
unified text diff, other parameters as old → new, and a change of position within a hook as a
move. The Critic and the reports use this to say what an edit changed.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass, field

from coevo.harness.harness import Harness
from coevo.harness.hooks import HOOK_ORDER


@dataclass(frozen=True)
class Change:
    kind: str  # "added" | "removed" | "replaced" | "moved" | "param" | "prompt"
    processor: str
    param: str | None = None
    old: object = None
    new: object = None
    text_diff: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        if self.kind in ("added", "removed"):
            return f"{self.kind} {self.processor} ({self.new or self.old})"
        if self.kind == "replaced":
            return f"replaced {self.processor}: {self.old} -> {self.new}"
        if self.kind == "moved":
            return f"moved {self.processor}: position {self.old} -> {self.new}"
        if self.kind == "prompt":
            return f"prompt {self.processor}.{self.param}:\n" + "\n".join(self.text_diff)
        return f"param {self.processor}.{self.param}: {self.old!r} -> {self.new!r}"


def diff(a: Harness, b: Harness, *, ignore_params_of: Collection[str] = ()) -> list[Change]:
    """What changed from ``a`` to ``b``; empty when they have the same id. Parameter changes of
    processors whose kind is in ``ignore_params_of`` are left out (e.g. ``sampling``, which a run
    writes its rollout settings into)."""
    changes: list[Change] = []
    a_by_name = {p.name: p for p in a}
    b_by_name = {p.name: p for p in b}
    for name, p in a_by_name.items():
        if name not in b_by_name:
            changes.append(Change("removed", name, old=p.kind))
    for name, p in b_by_name.items():
        if name not in a_by_name:
            changes.append(Change("added", name, new=p.kind))
    for name, pa in a_by_name.items():
        pb = b_by_name.get(name)
        if pb is None:
            continue
        if pa.kind != pb.kind:
            changes.append(Change("replaced", name, old=pa.kind, new=pb.kind))
            continue
        if pa.kind in ignore_params_of:
            continue
        types = {p.name: p.type for p in pb.params}
        for key in sorted(set(pa.config) | set(pb.config)):
            old, new = pa.config.get(key), pb.config.get(key)
            if old == new:
                continue
            if types.get(key) == "prompt" and isinstance(old, str) and isinstance(new, str):
                lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "before", "after", lineterm="", n=1)
                changes.append(Change("prompt", name, key, old, new, tuple(lines)))
            else:
                changes.append(Change("param", name, key, old, new))
    for hook in HOOK_ORDER:
        shared = [p.name for p in a.at(hook) if p.name in b_by_name]
        order_b = [p.name for p in b.at(hook) if p.name in a_by_name]
        for name in shared:
            if name in order_b and shared.index(name) != order_b.index(name):
                changes.append(Change("moved", name, old=shared.index(name), new=order_b.index(name)))
    return changes


def format_diff(a: Harness, b: Harness, *, ignore_params_of: Collection[str] = ()) -> str:
    changes = diff(a, b, ignore_params_of=ignore_params_of)
    head = f"{a.id} -> {b.id}"
    if ignore_params_of:
        head += f" (parameters of {', '.join(sorted(ignore_params_of))} not compared)"
    if not changes:
        return head + "\n(no differences)"
    return head + "\n" + "\n".join(f"- {c}" for c in changes)
