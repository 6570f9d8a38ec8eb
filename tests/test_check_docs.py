"""Figures that can drift: a test count or a running time in prose fails ``make lint`` outside the
measurement records, which keep each figure beside its command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_docs.py"


@pytest.fixture(scope="module")
def check_docs():
    spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_repository_states_no_figure_that_can_drift(check_docs):
    assert check_docs.checked_files()  # README, the docs, train.py and the configs are read
    assert check_docs.main() == 0


@pytest.mark.parametrize("line, what", [
    ("make test   # 1,367 tests", "a test count"),
    ("1505 passed, 24 skipped", "a test count"),
    ("make train  # ~6 min on 2 CPU cores", "a running time"),
    ("the suite takes 9 to 27 minutes here", "a running time"),
    ("a tiny model, under a minute", "a running time"),
    ("# ends within 10 minutes", "a running time"),
])
def test_counts_and_times_are_found(check_docs, line, what):
    assert [w for _, w, _ in check_docs.drifting_figures(f"intro\n{line}\n")] == [what]


@pytest.mark.parametrize("line", ["100 sealed test tasks", "8 tasks x 8 attempts", "pass@1 from 6.0% to 54.0%",
                                  "timeouts of 60 s per request", "waits that double from 0.5 s"])
def test_other_numbers_pass(check_docs, line):
    assert check_docs.drifting_figures(line) == []


def test_a_stale_figure_fails_the_check_and_the_records_are_left_alone(check_docs, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "README.md").write_text("make test  # 1,454 tests\n")
    (tmp_path / "docs" / "PERF.md").write_text("1505 passed in 12 min 18 s (`make test`)\n")
    assert check_docs.main(tmp_path) == 1
    (tmp_path / "README.md").write_text("make test  # counts and times: docs/PERF.md\n")
    assert check_docs.main(tmp_path) == 0
