"""Bounded env work: the deadline the runtime sets around ``Env.reset`` and each tool call, and
``run_bounded``, which runs one such call under it.

Why: Python cannot stop a thread, so a timeout that only stops *waiting* leaves the work running;
a simulator spoken to over a pipe then answers the abandoned call, and the next call reads that
stale reply. So the deadline travels with the call (a context variable set in the worker thread)
and work that can be ended reads it: ``coevo.envs.line_process.LineProcess`` waits for a reply only
until ``remaining()`` runs out, then kills its subprocess and raises ``DeadlineExceeded`` (the next
use starts a fresh one). Work that never reads the deadline (in-process Python: a loop, a C call)
cannot be ended: it is abandoned after a short grace period, its thread runs on as a daemon, and
what it returns later is handed to ``on_late`` (a late session is closed) and otherwise discarded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal, TypeVar

T = TypeVar("T")

Outcome = Literal["done", "stopped", "abandoned"]
"""How a bounded call ended: in time; past its deadline but ended (a subprocess killed, or it
returned within the grace period: its result is discarded); or still running (in-process work)."""

GRACE_S = 1.0
"""Seconds waited past the deadline for work that ends itself at it (a kill and a reap take
milliseconds) before the call is abandoned."""

_deadline: ContextVar[float | None] = ContextVar("coevo_env_deadline", default=None)


class DeadlineExceeded(TimeoutError):
    """Raised by work that ended itself at the runtime's deadline."""


def remaining() -> float | None:
    """Seconds left before the current call's deadline (<= 0 once passed); None when unbounded."""
    at = _deadline.get()
    return None if at is None else at - time.monotonic()


@contextmanager
def deadline(at: float) -> Iterator[None]:
    """Work inside the block has until ``time.monotonic() == at`` (an earlier enclosing one wins)."""
    outer = _deadline.get()
    token = _deadline.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


def run_bounded(fn: Callable[[], T], timeout_s: float, on_late: Callable[[T], None] | None = None
                ) -> tuple[T | None, Outcome]:
    """Run ``fn`` in a daemon thread with a deadline ``timeout_s`` from now; returns (its value or
    None, the ``Outcome``). An exception ``fn`` raises in time is re-raised here; one raised past
    the deadline (``DeadlineExceeded`` included) is a "stopped" call. A value that comes past the
    deadline goes to ``on_late`` (here when within the grace period, else in the thread once ``fn``
    returns), never to the caller."""
    at = time.monotonic() + timeout_s
    lock = threading.Lock()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            with deadline(at):
                box["value"] = fn()
        except BaseException as err:  # handed to the caller (or dropped once it gave up)
            box["error"] = err
        with lock:
            box["late"] = time.monotonic() > at
            abandoned = bool(box.get("abandoned"))
        if abandoned and on_late is not None and "value" in box:
            on_late(box["value"])  # type: ignore[arg-type]

    thread = threading.Thread(target=target, daemon=True, name="coevo-bounded")
    thread.start()
    thread.join(timeout_s + GRACE_S)
    with lock:
        if "late" not in box:  # still inside ``fn``: it will hand a late value to ``on_late`` itself
            box["abandoned"] = True
            return None, "abandoned"
    if "error" in box:
        if box["late"] or isinstance(box["error"], DeadlineExceeded):
            return None, "stopped"
        raise box["error"]  # type: ignore[misc]
    if box["late"]:
        if on_late is not None:
            on_late(box["value"])  # type: ignore[arg-type]
        return None, "stopped"
    return box["value"], "done"  # type: ignore[return-value]
