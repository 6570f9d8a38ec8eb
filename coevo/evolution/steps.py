"""A trace read as steps: what each model call of the lead agent did (its tool calls and their
results, an answer, a parse error, a length cut), comparable across traces once arguments and
answers are normalised, so the Digester can find where a failed trace first left a reference
solution of the same task."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coevo.agent.trace import ModelCall, ToolCallRecord, Trace

_WS_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class Step:
    """What one model call of a trace did: its completion, the parsed actions and their results."""

    index: int
    completion: str
    finish_reason: str
    tool_names: tuple[str, ...]  # the calls the parser found, in order
    records: tuple[ToolCallRecord, ...]  # what happened to them (fewer if the episode crashed)
    answer: str | None
    parse_error: str | None
    cut: tuple[str, str] | None = None  # a completion ended by length: (cause, detail), ``length_cut``

    def action(self) -> tuple[Any, ...]:
        """A comparable summary: ("tools", ((name, normalised args, succeeded), ...)),
        ("answer", normalised text) or ("none",)."""
        if self.tool_names:
            calls = []
            for k, name in enumerate(self.tool_names):
                if k < len(self.records):
                    rec = self.records[k]
                    calls.append((rec.name, normalise_arguments(rec.arguments), rec.error is None))
                else:  # the episode crashed while running this call
                    calls.append((name, None, False))
            return ("tools", tuple(calls))
        if self.answer is not None:
            return ("answer", normalise_text(self.answer))
        return ("none",)

    def succeeded_tools(self) -> set[str]:
        return {r.name for r in self.records if r.error is None and not r.blocked}


def normalise_text(text: str) -> str:
    """Whitespace-free, case-folded: ``"12 + 3"`` and ``"12+3"`` are the same action."""
    return _WS_RE.sub("", text).casefold()


def normalise_arguments(arguments: Mapping[str, Any]) -> str:
    """Canonical JSON of tool arguments with the whitespace removed from every string.

    Spacing differences (``"2+3"`` against ``"2 + 3"``) are the commonest harmless difference
    between a model's call and a reference's; case is kept because code is case-sensitive.
    """

    def strip(value: object) -> object:
        if isinstance(value, str):
            return _WS_RE.sub("", value)
        if isinstance(value, Mapping):
            return {str(k): strip(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(arguments), sort_keys=True, ensure_ascii=False, default=str)


def trace_steps(trace: Trace) -> list[Step]:
    """One ``Step`` per model call of the lead agent, from the after_model event log and the tool records.

    A trace without after_model events (built by hand) is read from its tool records, with the
    final answer on its last step when that step called no tool.
    """
    parsed = {e.get("step"): e for e in trace.events if e.get("hook") == "after_model" and not e.get("agent")}
    records: dict[int, list[ToolCallRecord]] = {}
    for rec in trace.tool_calls:
        if not rec.agent:
            records.setdefault(rec.step, []).append(rec)
    lead = [c for c in trace.model_calls if not c.agent]  # a delegated sub-episode shows as its tool call's result
    steps = []
    for k, call in enumerate(lead):
        recs = tuple(records.get(call.step, ()))
        event = parsed.get(call.step)
        if event is not None:
            names = tuple(event.get("tool_calls") or ())
            answer, parse_error = event.get("answer"), event.get("parse_error")
        else:
            names = tuple(r.name for r in recs)
            is_last = k == len(lead) - 1
            answer = trace.final_answer if is_last and not recs else None
            parse_error = None
        steps.append(Step(call.step, call.reply, call.finish_reason, names, recs, answer, parse_error,
                          length_cut(call)))
    return steps


def length_cut(call: ModelCall) -> tuple[str, str] | None:
    """(cause, detail) of a completion cut by length, from its token counts: ``truncated`` when it
    holds its ``max_new_tokens`` (or the budget is unknown), else ``context_overflow`` (the engine
    stopped it earlier: prompt plus completion reached the model's length); None when not cut."""
    if call.finish_reason != "length":
        return None
    counts = f" ({len(call.prompt_ids)} prompt + {len(call.completion_ids)} completion tokens)"
    if call.max_new_tokens is None or len(call.completion_ids) >= call.max_new_tokens:
        return "truncated", "the completion hit its token budget" + counts
    return "context_overflow", "the context window ended the completion" + counts


def first_divergence(trace: Trace, reference: Trace) -> int | None:
    """The first step (n-th model call, the runtime's step number) whose action differs from the
    reference's, or None when the trace repeats the reference exactly. A trace that stopped
    before the reference did diverges at its first missing step."""
    if trace.task_id != reference.task_id:
        raise ValueError(f"reference is for task {reference.task_id!r}, trace for {trace.task_id!r}")
    ours, theirs = trace_steps(trace), trace_steps(reference)
    for i in range(max(len(ours), len(theirs))):
        a = ours[i].action() if i < len(ours) else None
        b = theirs[i].action() if i < len(theirs) else None
        if a != b:
            return i
    return None
