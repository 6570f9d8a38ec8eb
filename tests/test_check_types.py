"""The type-check ratchet: a file may not gain mypy errors over scripts/type_baseline.json; fewer lower it."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_types.py"


@pytest.fixture
def check(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_types", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BASELINE", tmp_path / "baseline.json")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    (tmp_path / "baseline.json").write_text(json.dumps({"a.py": 2, "b.py": 1}))

    def run(found: dict[str, int], *argv: str) -> None:
        lines = [f"{f}:1: error: x  [misc]" for f, n in found.items() for _ in range(n)]
        monkeypatch.setattr(module, "run_mypy", lambda: (Counter(found), lines))
        monkeypatch.setattr(sys, "argv", ["check_types.py", *argv])
        module.main()

    return run, tmp_path / "baseline.json"


def test_a_file_with_more_errors_than_its_baseline_fails(check):
    run, _ = check
    with pytest.raises(SystemExit, match="1 file\\(s\\) have more mypy errors"):
        run({"a.py": 3, "b.py": 1})
    with pytest.raises(SystemExit, match="more mypy errors"):
        run({"a.py": 2, "b.py": 1, "new.py": 1})  # a file that had none


def test_fewer_errors_pass_and_update_only_lowers_the_baseline(check, capsys):
    run, baseline = check
    run({"a.py": 1})
    assert "a.py (2 -> 1)" in capsys.readouterr().out and json.loads(baseline.read_text()) == {"a.py": 2, "b.py": 1}
    run({"a.py": 1}, "--update")
    assert json.loads(baseline.read_text()) == {"a.py": 1}
