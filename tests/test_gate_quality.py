"""scripts/gate_quality.py end to end on its tiny preset: a scripted model whose response to each
planted edit is known, the main job's config and the default gate. The issue's targets must hold."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("gate_quality", ROOT / "scripts" / "gate_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_tiny_preset_meets_the_targets_and_writes_the_table(tmp_path, capsys):
    script = load_script()
    rows = script.main(["--preset", "tiny", "--runs", "20", "--out", str(tmp_path / "quality")])
    by_edit = {r["edit"]: r for r in rows}
    assert list(by_edit) == ["helpful", "harmful", "neutral"]
    assert by_edit["helpful"]["shipped"] >= 0.8 and by_edit["harmful"]["shipped"] <= 0.05
    assert by_edit["neutral"]["shipped"] <= 0.2
    assert all(r["met"] and r["runs"] == 20 for r in rows)
    # the known effects show in the paired attempts: 0.25 → 0.6, 0.25 → 0, 0.25 → 0.25
    assert by_edit["helpful"]["candidate_pass"] > by_edit["helpful"]["parent_pass"] + 0.2
    assert by_edit["harmful"]["candidate_pass"] == 0.0 < by_edit["harmful"]["parent_pass"]
    assert abs(by_edit["neutral"]["candidate_pass"] - by_edit["neutral"]["parent_pass"]) < 0.1
    assert all(r["episodes_per_decision"] <= 64 for r in rows)  # the main job's budget per decision (configs/train.yaml)
    out = capsys.readouterr().out
    assert "| edit | runs | shipped | 95% CI |" in out and "gate stat: alpha 0.1" in out
    detail = json.loads((tmp_path / "quality.json").read_text())
    assert len(detail["runs"]) == 60 and (tmp_path / "quality.md").read_text().count("\n| ") == 4


