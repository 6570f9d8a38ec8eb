"""scripts/internalisation.py on a tiny model_only run whose harness forces the tool: the run's
harness with and without its scaffolding, trained and frozen weights, one report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import coevo
from coevo.harness.defaults import base_harness
from coevo.harness.library.tools import ToolChoice
from tests.test_loop import smoke

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("internalisation", ROOT / "scripts" / "internalisation.py")
internalisation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(internalisation)


def test_forms_remove_exactly_the_scaffold():
    h = base_harness().insert(ToolChoice(tool="calculator", steps=1), index=0)
    forms = internalisation.harness_forms(h)
    assert list(forms) == ["as run", "without tool_choice"]  # the base harness shows no demonstrations
    assert forms["as run"] == h and "tool_choice" not in {p.kind for p in forms["without tool_choice"].processors}
    assert len(forms["without tool_choice"]) == len(h) - 1


def test_tiny_run_trained_against_frozen_under_each_form(tmp_path):
    harness = tmp_path / "forced.yaml"
    base_harness().insert(ToolChoice(tool="calculator", steps=1), index=0).save(harness)
    run_dir = Path(coevo.run(smoke(tmp_path / "s0", "mode=model_only", "rounds=1", "model.lora=true",
                                   f"harness.start={harness}", "trainer.lr=1e-2")))
    summary = internalisation.main([str(run_dir), "--limit", "4", "--out", str(tmp_path / "out")])
    forms = summary["forms"]
    assert set(forms) == {"as run", "without tool_choice"} and forms["as run"]["tasks"] >= 1
    for row in forms.values():
        for metric in ("pass", "tool_use"):
            diff, trained, frozen = (row[metric][k][0] for k in ("difference", "trained", "frozen"))
            assert diff == pytest.approx(trained - frozen)
    assert "without tool_choice" in (tmp_path / "out" / "internalisation.md").read_text()
