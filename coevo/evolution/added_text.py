"""The text an edit adds to a harness, read from specs only (nothing is built, so a code
processor is never loaded here): what the quality gate (``coevo.evolution.quality_gate``) and the
reward-hacking monitor (``coevo.evolution.pathologies``) judge.

Added text is the words of a changed string parameter (prompt, template, code source) outside
runs of ≥ 3 words kept from the old value, new items of a string list (demos), new turns of a
turn list (a ``few_shot`` processor's ``turns``: every turn's text, the task, the tool call, the
tool's result and the answer), strings nested in dict parameters (a code processor's
``init_params``). Specs are compared, nothing is built.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coevo.harness.edits import Edit
from coevo.harness.harness import Harness

MIN_KEPT_WORDS = 3
"""A run of fewer than this many words shared by an old and a new prompt is treated as new text
(the word diff would otherwise split a pasted instruction on every "the")."""


# ---------------------------------------------------------------------------------- added text
@dataclass(frozen=True)
class Added:
    """One piece of text an edit adds: where it goes and, for demonstrations, whose turn it is."""

    processor: str
    kind: str
    param: str  # dotted path for nested dict params ("init_params.demos")
    text: str
    role: str | None = None  # "user" / "assistant" for an item of a ``demos`` list, the turn's role in ``turns``


@dataclass
class ProcSpec:
    kind: str
    params: dict[str, Any]
    origin: str | None  # name of the processor in ``harness_before`` this one derives from


def _spec_name(spec: Mapping[str, Any]) -> str:
    params = spec.get("params") or {}
    kind = str(spec.get("kind", ""))
    return str(spec.get("name") or (params.get("class_name") if kind == "code" else None) or kind)


def simulate_edits(edits: Sequence[Edit],
                   harness_before: Harness | None) -> tuple[dict[str, ProcSpec], dict[str, ProcSpec]]:
    """Processors by name before and after the edits, from specs only (nothing is built, so a code
    processor is never loaded here). An edit naming a processor that is not there adds it."""
    before: dict[str, ProcSpec] = {}
    for p in harness_before or ():
        spec = p.spec()
        before[p.name] = ProcSpec(spec["kind"], dict(spec["params"]), p.name)
    state = {name: ProcSpec(p.kind, dict(p.params), p.origin) for name, p in before.items()}
    for e in edits:
        if e.op in ("insert", "replace"):
            spec = e.spec or {}
            name = _spec_name(spec)
            origin = None
            if e.op == "replace" and e.processor in state:
                origin = state.pop(e.processor).origin
            elif name in before and all(p.origin != name for p in state.values()):
                origin = name  # removed earlier in this edit list and inserted again: compare with the old one
            state[name] = ProcSpec(str(spec.get("kind", "")), dict(spec.get("params") or {}), origin)
        elif e.op == "remove":
            state.pop(e.processor, None)
        else:
            proc = state.setdefault(e.processor, ProcSpec("", {}, None))
            proc.params[e.param or ""] = e.value
    return before, state


def _is_turn(value: object) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("content"), str)


def _turn_key(turn: Mapping[str, object]) -> tuple[str, str, str]:
    """A chat turn as a hashable value: (role, tool name, content)."""
    return (str(turn.get("role", "")), str(turn.get("name") or ""), str(turn.get("content", "")))


Leaf = str | list[str] | list[tuple[str, str, str]]
"""A leaf ``param_leaves`` finds: a string, a list of strings, or a list of turns as ``_turn_key`` tuples."""


def param_leaves(value: object, path: str) -> Iterator[tuple[str, Leaf]]:
    """String, list-of-string and list-of-turn leaves of a parameter value (dicts are walked);
    a turn list comes back as a list of ``_turn_key`` tuples."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        yield path, list(value)
    elif isinstance(value, (list, tuple)) and all(_is_turn(v) for v in value):
        yield path, [_turn_key(v) for v in value]
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            yield from param_leaves(value[k], f"{path}.{k}")


def added_words(old: str, new: str) -> list[str]:
    """Runs of ``new`` (whitespace-separated words, each run joined by spaces) that are not kept
    from ``old``: words outside matching blocks of at least ``MIN_KEPT_WORDS`` words (or all of
    ``old`` when it is shorter)."""
    old_w, new_w = old.split(), new.split()
    if not new_w:
        return []
    keep_min = max(1, min(MIN_KEPT_WORDS, len(old_w)))
    kept = [False] * len(new_w)
    matcher = difflib.SequenceMatcher(None, old_w, new_w, autojunk=False)
    for block in matcher.get_matching_blocks():
        if block.size >= keep_min:
            kept[block.b : block.b + block.size] = [True] * block.size
    runs: list[str] = []
    current: list[str] = []
    for word, k in zip(new_w, kept, strict=True):
        if k:
            if current:
                runs.append(" ".join(current))
            current = []
        else:
            current.append(word)
    if current:
        runs.append(" ".join(current))
    return runs


def added_segments(edits: Sequence[Edit], harness_before: Harness | None) -> list[Added]:
    """Every piece of text the edits add, compared with what the processor (or the one it
    replaced) had before: new words of a changed string, new items of a string list. With
    ``harness_before=None`` all text the edits carry counts as added."""
    before, after = simulate_edits(edits, harness_before)
    out: list[Added] = []
    for name, proc in after.items():
        old_params = before[proc.origin].params if proc.origin in before else {}
        old_leaves = dict(param_leaves(old_params, "")) if old_params else {}
        for path, value in param_leaves(proc.params, ""):
            param = path[1:]
            old = old_leaves.get(path)
            if isinstance(value, str):
                old_text = old if isinstance(old, str) else ""
                out.extend(Added(name, proc.kind, param, run) for run in added_words(old_text, value))
                continue
            remaining = Counter(old if isinstance(old, list) else [])
            for i, item in enumerate(value):
                if remaining[item] > 0:
                    remaining[item] -= 1
                    continue
                if isinstance(item, tuple):  # a turn: (role, tool name, content)
                    role, text = item[0], item[2]
                else:
                    role = ("user" if i % 2 == 0 else "assistant") if param.rsplit(".", 1)[-1] == "demos" else None
                    text = item
                if text.strip():
                    out.append(Added(name, proc.kind, param, text, role))
    return out


def edit_text(edits: Sequence[Edit], harness_before: Harness | None) -> str:
    """The text the edits add to the harness (prompts, demos, templates, code), one piece a line:
    what could leak a task into the harness."""
    return "\n".join(a.text for a in added_segments(edits, harness_before))

