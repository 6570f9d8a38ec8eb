"""Bloat of an edit (HarnessEvolve §3.5): how many examples it injects into the harness, read
from specs only; the other half of the quality gate (``coevo.evolution.quality_gate``).

Bloat counts injected examples: new few-shot demonstrations (pairs of ``demos``, demonstrations
of ``turns``) plus prompt growth in characters divided by ``chars_per_example`` (400: a worked
example pasted into a prompt instead of a demo counts too). Code source is not prompt text and
does not count (it is still checked for leakage).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from coevo.evolution.added_text import param_leaves, simulate_edits
from coevo.harness.edits import Edit
from coevo.harness.harness import Harness

CHARS_PER_EXAMPLE = 400


# ---------------------------------------------------------------------------------- bloat
class Bloat(NamedTuple):
    """Injected examples: ``score = demos_added + prompt_growth / chars_per_example``."""

    score: float
    demos_added: int
    prompt_growth: int  # characters added to prompt parameters (net per parameter, never < 0)


def _prompt_params(kind: str) -> set[str]:
    from coevo.harness.errors import UnknownProcessorError
    from coevo.harness.library import processor_class

    if kind == "code":
        return set()
    try:  # a processor of the user's own, by import path, has its prompts gated too
        cls = processor_class(kind)
    except UnknownProcessorError:
        return set()
    return {p.name for p in cls.params if p.type == "prompt"}


def bloat(edits: Sequence[Edit], harness_before: Harness | None, *,
          chars_per_example: int = CHARS_PER_EXAMPLE) -> Bloat:
    """Count the examples the edits inject: new demonstration pairs in any ``demos`` list, new
    demonstrations (a user turn and what follows it) in any turn list, and growth of prompt
    parameters (built-in ``prompt`` params, and string ``init_params`` of a code processor, which
    configure its base's prompts) in units of ``chars_per_example``."""
    if chars_per_example < 1:
        raise ValueError(f"chars_per_example must be >= 1, got {chars_per_example}")
    before, after = simulate_edits(edits, harness_before)
    demos_added = 0
    growth = 0
    for proc in after.values():
        old_params = before[proc.origin].params if proc.origin in before else {}
        old_leaves = dict(param_leaves(old_params, ""))
        prompts = _prompt_params(proc.kind)
        for path, value in param_leaves(proc.params, ""):
            old = old_leaves.get(path)
            leaf = path.rsplit(".", 1)[-1]
            if isinstance(value, list) and (leaf == "demos" or any(isinstance(v, tuple) for v in value)):
                split = _pairs if leaf == "demos" else _turn_demos
                old_demos = Counter(split(old if isinstance(old, list) else []))
                for demo in split(value):
                    if old_demos[demo] > 0:
                        old_demos[demo] -= 1
                    else:
                        demos_added += 1
            elif isinstance(value, str):
                is_prompt = path[1:] in prompts or (proc.kind == "code" and path.startswith(".init_params."))
                if is_prompt:
                    growth += max(0, len(value) - (len(old) if isinstance(old, str) else 0))
    return Bloat(demos_added + growth / chars_per_example, demos_added, growth)


def _pairs(items: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(items[i : i + 2]) for i in range(0, len(items), 2)]


def _turn_demos(turns: Sequence[tuple[str, str, str]]) -> list[tuple[tuple[str, str, str], ...]]:
    """Turn keys grouped into demonstrations: each starts at a user turn."""
    demos: list[list[tuple[str, str, str]]] = []
    for turn in turns:
        if turn[0] == "user" or not demos:
            demos.append([])
        demos[-1].append(turn)
    return [tuple(d) for d in demos]
