"""Progress shown while a run works: rich bars for rollouts, re-runs and training, and a table at
the end of each round. ``NullProgress`` is the same interface doing nothing (non-main ranks,
tests), so the loop never checks which one it has."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevo.records import RoundRecord

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RichProgress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        """A bar for ``total`` units of work; the caller calls the yielded function per unit."""
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            bar = progress.add_task(description, total=total)
            yield lambda: progress.advance(bar)

    def round_done(self, record: RoundRecord) -> None:
        from coevo.report import round_table

        self.console.print(round_table(record))

    def message(self, text: str) -> None:
        self.console.print(text)


class NullProgress:
    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        yield lambda: None

    def round_done(self, record: RoundRecord) -> None:
        pass

    def message(self, text: str) -> None:
        pass
