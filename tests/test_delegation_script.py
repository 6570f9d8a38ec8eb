"""scripts/delegation.py: the agents-axis measurement, on its quick presets (the gold lead, a tiny model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import delegation  # noqa: E402


def test_the_gold_lead_delegates_rightly_and_passes(tmp_path):
    text = delegation.main(["--model", "gold", "--attempts", "1", "--limit", "4", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "episodes.json").read_text())
    assert len(rows) == 8 and all(r["delegated"] and r["right"] and r["complete"] and r["passed"] for r in rows)
    assert any(len(r["entities"]) > 1 for r in rows)
    assert "| all | 8 | 8 (100%" in text


def test_a_random_tiny_model_is_classified_without_delegating(tmp_path):
    delegation.main(["--model", "tiny", "--attempts", "1", "--limit", "1", "--max-new-tokens", "8", "--max-steps", "1",
                     "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "episodes.json").read_text())
    assert len(rows) == 2 and not any(r["delegated"] or r["passed"] for r in rows)


