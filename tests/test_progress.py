"""Progress on a console that is not a terminal: plain lines a log file keeps, not transient bars."""

import io

import pytest
from rich.console import Console

from coevo.report import progress as progress_module
from coevo.report.progress import RichProgress


class Clock:
    """``time.perf_counter`` stand-in: ``now`` seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_log_file_gets_a_line_at_the_start_each_quarter_and_the_end_with_the_time_left(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=False, width=200))
    with progress.task("arithmetic/test episodes", 40) as advance:
        for _ in range(40):
            clock.now += 10.0  # 10 s a unit: at 10/40, 300 s are left
            advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "arithmetic/test episodes: started, 40 to do"
    assert lines[1:-1] == ["arithmetic/test episodes: 10/40 (25%) after 100 s, ~5.0 min left",
                           "arithmetic/test episodes: 20/40 (50%) after 200 s, ~3.3 min left",
                           "arithmetic/test episodes: 30/40 (75%) after 300 s, ~100 s left"]
    assert lines[-1] == "arithmetic/test episodes: done, 40/40 in 400.0 s"


def test_a_short_task_of_long_units_gets_a_line_per_unit(monkeypatch):
    """Eight benchmark episodes of minutes each: a line as each ends, not two in the whole run."""
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=False, width=200))
    with progress.task("bfcl/val episodes", 8) as advance:
        for _ in range(8):
            clock.now += 60.0
            advance()
    lines = out.getvalue().splitlines()
    assert lines[1] == "bfcl/val episodes: 1/8 (12%) after 60 s, ~7.0 min left"
    assert len(lines) == 1 + 7 + 1  # started, one per episode before the last, done


def test_quarter_lines_are_skipped_when_the_last_line_is_recent(monkeypatch):
    """A task that moves fast (a Critic stage of a few seconds) says when it starts and ends, not
    five lines in three seconds; a slow one keeps its quarters."""
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=False, width=200), min_interval_s=5.0)
    with progress.task("critic", 4) as advance:
        for seconds in (1.0, 1.0, 6.0, 1.0):  # 25% at 1 s (too soon), 50% at 2 s (too soon), 75% at 8 s
            clock.now += seconds
            advance()
    lines = out.getvalue().splitlines()
    assert lines == ["critic: started, 4 to do", "critic: 3/4 (75%) after 8 s, ~3 s left", "critic: done, 4/4 in 9.0 s"]


def test_a_failed_task_says_where_it_stopped_and_every_zero_logs_only_start_and_end():
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=False, width=200), log_every_percent=0)
    with pytest.raises(RuntimeError):
        with progress.task("training", 4) as advance:
            advance()
            raise RuntimeError("boom")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("training: stopped, 1/4 in ")


def test_a_terminal_still_gets_a_transient_bar():
    out = io.StringIO()
    with RichProgress(Console(file=out, force_terminal=True, width=200)).task("episodes", 2) as advance:
        advance()
        advance()
    assert "started" not in out.getvalue()
