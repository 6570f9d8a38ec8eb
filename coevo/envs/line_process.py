"""A simulator in a subprocess that answers one line with one line: the building block for envs
whose session talks to a process of its own.

Why: a reply that comes after the caller gave up must never be read by a later call. ``ask`` waits
for the reply with ``select`` only until the runtime's deadline (``coevo.envs.deadline``, set around
every reset and tool call) or the process's own ``timeout_s``; past it the process (its whole
process group) is killed and reaped and ``DeadlineExceeded`` raised. The next ``ask`` starts a fresh
process, so the stale reply died with the old one. A session that keeps state in the simulator
rebuilds it after a restart (``starts`` counts them; a TextWorld session replays its commands the
same way when it gets another JVM).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress

from coevo.envs.deadline import DeadlineExceeded, remaining


class LineProcess:
    """``argv`` started on first use (and after every kill); ``ask(line)`` returns its reply line."""

    def __init__(self, argv: Sequence[str], *, timeout_s: float | None = None, cwd: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.argv, self.timeout_s, self.cwd, self.env = list(argv), timeout_s, cwd, env
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""

    @property
    def pid(self) -> int | None:
        """The running process's id (None before the first ``ask`` and after a kill)."""
        return None if self._proc is None else self._proc.pid

    def ask(self, line: str) -> str:
        """Send ``line`` (no newline in it) and return the reply line, within the deadline."""
        if "\n" in line:
            raise ValueError("a line-protocol request must be one line")
        limit = self._limit()
        if limit is not None and limit <= 0:
            raise DeadlineExceeded(f"no time left to ask {self.argv[0]}")
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
        except OSError as err:  # it died since the last reply
            self.kill()
            raise RuntimeError(f"{self.argv[0]} exited before reading the request") from err
        return self._read_line(limit)

    def kill(self) -> None:
        """End the process and its children now and reap it; the next ``ask`` starts a fresh one."""
        proc, self._proc, self._buf = self._proc, None, b""
        if proc is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is the simulator's
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            with suppress(OSError):
                pipe.close()  # type: ignore[union-attr]

    close = kill

    def _limit(self) -> float | None:
        """Seconds this ask may wait: the runtime's deadline or the own timeout, whichever is sooner."""
        left = [s for s in (remaining(), self.timeout_s) if s is not None]
        return min(left) if left else None

    def _start(self) -> None:
        self.kill()
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.cwd,
                                      env=None if self.env is None else dict(self.env), start_new_session=True)
        self.starts += 1

    def _read_line(self, limit: float | None) -> str:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        end = None if limit is None else time.monotonic() + limit
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                self.kill()
                raise DeadlineExceeded(f"{self.argv[0]} gave no reply within {limit:g} s; killed it")
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = proc.wait()
                self.kill()
                raise RuntimeError(f"{self.argv[0]} exited (code {code}) before replying")
            self._buf += chunk
        reply, _, self._buf = self._buf.partition(b"\n")
        return reply.decode()
