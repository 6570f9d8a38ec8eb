"""Progress on a console that is not a terminal: plain lines a log file keeps, not transient bars."""

import io

import pytest
from rich.console import Console

from coevo.report.progress import RichProgress


def test_a_log_file_gets_a_line_at_the_start_each_quarter_and_the_end():
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=False, width=200))
    with progress.task("arithmetic/test episodes", 8) as advance:
        for _ in range(8):
            advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "arithmetic/test episodes: started, 8 to do"
    assert [line.split(": ")[1].split(" after")[0] for line in lines[1:-1]] == ["2/8 (25%)", "4/8 (50%)", "6/8 (75%)"]
    assert lines[-1].startswith("arithmetic/test episodes: done, 8/8 in ") and lines[-1].endswith(" s")


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
