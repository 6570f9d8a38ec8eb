"""SIGTERM as an exception for the length of a run, so that every ``finally`` runs.

Why: Python installs no SIGTERM handler, so the default action ends the process at once and skips
every ``finally`` block: ``coevo.loop.build.run`` closing its env (a TextWorld JVM, a simulator
subprocess), the run directory's lock, the tracker. A scheduler's ``kill`` or a job cancellation
sends SIGTERM, so during a run it raises ``SystemExit(128 + SIGTERM)`` in the main thread instead:
the stack unwinds through the cleanup and the process still exits non-zero (143, as a shell reports
a SIGTERM). A second SIGTERM while that cleanup runs (a scheduler that signals every process of
the job, or an impatient user) is logged and ignored, so it cannot cut a checkpoint write or an
env's shutdown short. The previous handler is restored when the run returns. ``kill -9`` is not catchable;
the sandbox's children die with the process by ``PR_SET_PDEATHSIG`` for that case.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, _ignore_during_cleanup)
    raise SystemExit(128 + signum)


def _ignore_during_cleanup(signum: int, frame: FrameType | None) -> None:
    log.warning("SIGTERM again while the run cleans up after the first one: ignored until the cleanup ends "
                "(kill -9 stops the process now, skipping it)")


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block (or a function it decorates) runs, SIGTERM raises ``SystemExit``. Only the
    main thread can install a handler; elsewhere (a run started from a worker thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:  # None: a handler installed outside Python, which cannot be put back; the default then
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
