"""The errors a user can fix, and how the entry points print them: one line, no stack trace.

A stack trace is for a fault in coevo; a bad config value, a missing dependency, a file that cannot
be read or a combination the launch refuses is the user's to fix, and the message that names the
field (or file) and the fix is all they need. ``UsageError`` marks those (exit status 2, the
convention for usage errors); ``RunDirError`` marks a run directory that cannot be used as it is
(held by another run, damaged: exit status 1, the command was right). ``train.py`` and the
``coevo`` command print either as ``error: <message>`` on one line; ``HYDRA_FULL_ERROR=1`` (or
``coevo --debug``) shows the stack trace instead. Any other exception is a fault and keeps its trace.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

USAGE_EXIT = 2
RUN_DIR_EXIT = 1


class UsageError(ValueError):
    """Something the user gave cannot work: the message names the field or file and the fix.
    A ``ValueError``, so callers that validate input and catch ``ValueError`` keep working."""


class RunDirError(RuntimeError):
    """The run directory cannot be used as it is (another run holds it, a file in it is damaged)."""


class DamagedFileError(RunDirError, ValueError):
    """A run file that does not read back as what the run writes there (a malformed line, a field of
    the wrong type, a repeated round), named by file and line. A ``ValueError`` too, for readers that
    treat any unreadable input alike; the command line reports it as damage (exit 1), not as a
    wrong argument."""


def one_line(err: BaseException) -> str:
    """``error: <message>`` with the message's line breaks and runs of spaces folded to one space."""
    return "error: " + " ".join(str(err).split())


def debugging() -> bool:
    """True when the user asked for stack traces (``HYDRA_FULL_ERROR=1``, also set by ``coevo --debug``)."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


@contextlib.contextmanager
def reported_as_one_line() -> Iterator[None]:
    """Turn a ``UsageError`` (or a ``MissingDependency``, which is one) into one line on stderr and
    exit status 2, a ``RunDirError`` into one line and status 1; re-raise when ``debugging()``."""
    try:
        yield
    except (UsageError, RunDirError) as err:
        if debugging():
            raise
        print(one_line(err), file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT if isinstance(err, UsageError) else RUN_DIR_EXIT) from None
