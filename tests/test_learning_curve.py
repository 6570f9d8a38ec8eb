"""scripts/learning_curve.py on a tiny model_only run: before/after on the same sealed tasks, and
every GRPO step's figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import coevo
from tests.test_loop import smoke

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("learning_curve", ROOT / "scripts" / "learning_curve.py")
learning_curve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning_curve)


def test_tiny_model_only_run_gives_a_paired_before_after_and_per_step_figures(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "s0", "mode=model_only", "rounds=2", "val_limit=0", "test=true",
                                   "test_limit=6", "eval_attempts=2", "trainer.steps_per_round=3")))
    summary = learning_curve.main([str(run_dir), "--out", str(tmp_path / "out")])
    start = json.loads((run_dir / "start.json").read_text())["test"]["outcomes"]
    end = json.loads((run_dir / "rounds.jsonl").read_text().splitlines()[-1])["test"]["outcomes"]
    before = np.mean([np.mean(v) for v in start.values()])
    after = np.mean([np.mean(v) for v in end.values()])
    assert summary["tasks"] == len(start) == len(end) and summary["seeds"] == 1
    assert summary["difference"][0] == pytest.approx(100 * (after - before))
    assert summary["before"][1] <= summary["before"][0] <= summary["before"][2]
    assert summary["steps"] == 6  # 2 rounds x 3 passes over each round's groups
    curves = summary["curves"]
    assert all(len(curves[k]) == 6 for k in learning_curve.STEP_FIGURES)
    assert curves["approx_kl"][0] == pytest.approx(0.0, abs=1e-6)  # first pass: the policy is the behaviour policy
    assert curves["approx_kl"][2] > curves["approx_kl"][0]  # later passes over the same groups moved it
    assert (tmp_path / "out" / "learning_curve.png").stat().st_size > 0
    assert "paired bootstrap" in (tmp_path / "out" / "learning_curve.md").read_text()
