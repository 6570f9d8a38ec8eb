"""Firing a harness hook inside an episode: a hook's processors in order, each checked against the
event type it declares, and the line the trace's event log keeps of it. A processor that raises or
breaks its contract becomes an ``EpisodeError`` naming it (``coevo.agent.episode`` ends the episode
as a failed trace; the stream axes fire hooks the same way)."""

from __future__ import annotations

import time
from typing import Any, TypeVar

from coevo.harness import events as ev
from coevo.harness.errors import ProcessorContractError
from coevo.harness.harness import Harness
from coevo.harness.hooks import Hook

E = TypeVar("E", bound=ev.Event)


class EpisodeError(Exception):
    """An episode failed; ``where`` says which component raised, ``source`` its kind ("env",
    "tool" or "processor"; see ``coevo.agent.trace.INFRA_SOURCES``)."""

    def __init__(self, where: str, err: BaseException, source: str) -> None:
        self.where, self.source = where, source
        super().__init__(f"{where}: {type(err).__name__}: {err}")


def _summary(event: ev.Event) -> dict[str, Any]:
    """A few fields of an event worth keeping in the trace's event log."""
    if isinstance(event, ev.ModelRequestEvent):
        out = {"messages": len(event.messages), "temperature": event.sampling.temperature}
        return {**out, "reply_prefix": event.reply_prefix} if event.reply_prefix else out
    if isinstance(event, ev.ParsedOutputEvent):
        return {"tool_calls": [c.name for c in event.tool_calls], "answer": event.answer,
                "parse_error": event.parse_error}
    if isinstance(event, ev.ToolCallEvent):
        return {"tool": event.call.name, "blocked": event.result is not None}
    if isinstance(event, ev.ToolResultEvent):
        return {"tool": event.call.name, "error": event.result.error}
    if isinstance(event, ev.StepEndEvent):
        return {"actions": event.actions, "done": event.state.done}
    if isinstance(event, ev.TaskEndEvent):
        return {"stop_reason": event.state.stop_reason, "answer": event.state.final_answer}
    return {}


def fire(harness: Harness, hook: Hook, event: E, log: list[dict[str, Any]]) -> E:
    """Run the processors of ``hook`` in order, checking each returns its declared event type."""
    start = time.perf_counter()
    for p in harness.at(hook):
        try:
            out = p.process(event)
        except Exception as err:
            raise EpisodeError(f"processor {p.name!r} at {hook.value}", err, "processor") from err
        if not isinstance(out, p.produces):
            err = ProcessorContractError(f"returned {type(out).__name__}, declared {p.produces.__name__}")
            raise EpisodeError(f"processor {p.name!r} at {hook.value}", err, "processor")
        event = out
    log.append(
        {"hook": hook.value, "step": event.state.step, "processors": [p.name for p in harness.at(hook)],
         "seconds": round(time.perf_counter() - start, 6), **_summary(event)}
    )
    return event
