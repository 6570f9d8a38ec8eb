"""Memory management: what part of a long history the model sees at each step.

Both processors transform the request view only; ``state.messages`` keeps the full history for
the trace. The task prefix (system prompt, demonstrations, the task) is never dropped.
"""

from __future__ import annotations

from coevo.harness.events import Message, ModelRequestEvent, harness_note
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor


def _split(event: ModelRequestEvent, keep_last: int) -> tuple[list[Message], list[Message], list[Message]]:
    prefix_len = event.state.prefix_len
    prefix, rest = event.messages[:prefix_len], event.messages[prefix_len:]
    cut = max(0, len(rest) - keep_last)
    return prefix, rest[:cut], rest[cut:]


class SlidingWindowMemory(Processor):
    kind = "sliding_window"
    description = "Shows the model the task prefix plus only the last N messages of the episode."
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.MEMORY
    consumes = produces = ModelRequestEvent
    group = "context_window"
    params = (Param("keep_last", "int", 6, "episode messages kept after the task prefix"),)

    def process(self, event: ModelRequestEvent) -> ModelRequestEvent:
        prefix, _dropped, recent = _split(event, self.config["keep_last"])
        event.messages = prefix + recent
        return event


class SummaryMemory(Processor):
    kind = "summary_memory"
    description = (
        "Replaces episode messages older than the last N with one message summarising each of them "
        "in a truncated line, so earlier tool results stay visible at a fraction of the tokens."
    )
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.MEMORY
    consumes = produces = ModelRequestEvent
    group = "context_window"
    params = (
        Param("keep_last", "int", 4, "episode messages kept verbatim"),
        Param("line_chars", "int", 120, "characters kept per summarised message"),
    )

    def process(self, event: ModelRequestEvent) -> ModelRequestEvent:
        prefix, older, recent = _split(event, self.config["keep_last"])
        if not older:
            return event
        width = self.config["line_chars"]
        lines = []
        for m in older:
            text = " ".join(str(m.get("content", "")).split())
            who = m.get("name") or m.get("role", "?")
            lines.append(f"- {who}: {text[:width]}{'…' if len(text) > width else ''}")
        summary = harness_note("Summary of earlier steps:\n" + "\n".join(lines))
        event.messages = prefix + [summary] + recent
        return event
