"""Progress shown while a run works: rich bars for rollouts, re-runs and training, and a table at
the end of each round. When the console is not a terminal (a log file, a batch job), transient
bars would leave nothing behind, so plain lines are printed instead: one when a task starts, one
at each quarter of it (at most one every ``min_interval_s``), one when it ends (with its seconds).
Both say how long the rest should take, from the pace so far. ``NullProgress`` is the same
interface doing nothing (non-main ranks, tests), so the loop never checks which one it has."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from coevo.rundir.records import RoundRecord

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

SHORT_TASK = 16
"""A task of at most this many units gets a line per unit (rate-limited), not per quarter."""


def duration(seconds: float) -> str:
    """``42 s`` under two minutes, else ``3.5 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class ProgressDisplay(Protocol):
    """What the loop and the rollouts show progress on: ``RichProgress`` or ``NullProgress``."""

    def task(self, description: str, total: int) -> contextlib.AbstractContextManager[Callable[[], None]]:
        """A context over ``total`` units of work yielding the function to call per unit done."""
        ...

    def round_done(self, record: RoundRecord) -> None:
        ...

    def message(self, text: str) -> None:
        """A plain line between the bars."""
        ...


class RichProgress:
    def __init__(self, console: Console | None = None, *, log_every_percent: int = 25,
                 min_interval_s: float = 5.0) -> None:
        """``log_every_percent``: on a non-terminal console, a line each time this share of a
        task is done (0: only the start and end lines), but not sooner than ``min_interval_s``
        after the previous line (a task of a few seconds says when it starts and ends)."""
        self.console = console or Console()
        self.log_every_percent = log_every_percent
        self.min_interval_s = min_interval_s

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        """A bar for ``total`` units of work; the caller calls the yielded function per unit. On a
        console that is not a terminal: plain lines at the start, every ``log_every_percent``
        and at the end, instead of a bar."""
        if not self.console.is_terminal:
            with self._lines(description, total) as advance:
                yield advance
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("left"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            bar = progress.add_task(description, total=total)
            yield lambda: progress.advance(bar)

    @contextlib.contextmanager
    def _lines(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        start, lock = time.perf_counter(), threading.Lock()
        done, last = [0, 0], [start]  # units done, the last line's percent; the last line's time
        step = self.log_every_percent

        def say(text: str) -> None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

        def advance() -> None:
            with lock:
                done[0] += 1
                now = time.perf_counter()
                percent = 100 * done[0] // total if total > 0 else 100
                # a line per unit for short tasks of long units (8 benchmark episodes), else per quarter
                crossed = total <= SHORT_TASK or percent // step > done[1] // step
                if step > 0 and done[0] < total and crossed and now - last[0] >= self.min_interval_s:
                    done[1], last[0] = percent, now
                    elapsed = now - start
                    say(f"{description}: {done[0]}/{total} ({percent}%) after {elapsed:.0f} s, "
                        f"~{duration(elapsed / done[0] * (total - done[0]))} left")

        say(f"{description}: started, {total} to do")
        finished = False
        try:
            yield advance
            finished = True
        finally:
            how = "done" if finished else "stopped"
            say(f"{description}: {how}, {done[0]}/{total} in {time.perf_counter() - start:.1f} s")

    def round_done(self, record: RoundRecord) -> None:
        from coevo.report.summary import round_table

        self.console.print(round_table(record))

    def message(self, text: str) -> None:
        """A plain line (no markup: results quote intervals like [+38.0, +68.0]), never wrapped."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class NullProgress:
    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        yield lambda: None

    def round_done(self, record: RoundRecord) -> None:
        pass

    def message(self, text: str) -> None:
        pass
