"""The main job's shape on the tiny model: ``python train.py`` with only the model and the sizes
shrunk runs what ``make train`` runs (the start evaluated on the sealed test split, two rounds of
rollouts, AEGIS under the statistical gate and GRPO, the test split again) and ends with its result: the terminal's last lines and ``summary.md``'s first give
start and end pass@1 with intervals, and the report holds the result figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SHRUNK = ["model=tiny", "model.lora=true", "rollout.attempts=2", "batch_tasks=2", "test_limit=4",
          "evolution.stat_budget=16", "evolution.stat_tasks=4", "rollout.max_new_tokens=16", "rollout.max_steps=2",
          "trainer.step_traces=4"]
"""Only the model and the sizes: every choice of configs/train.yaml (gate, schedule, harness, env,
sampler log-probs, minibatches, start and end test) stays."""


@pytest.mark.slow
def test_the_default_config_runs_on_the_tiny_model_and_ends_with_its_result(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *SHRUNK, f"run_dir={run_dir}",
                          f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1]
    assert all(r["evolve"] is not None for r in records)  # AEGIS in both rounds (evolution.early_rounds=2)
    assert [len(r["grpo"]["steps"]) for r in records] == [3, 3]  # trainer=grpo_lora's steps a round
    assert records[0]["test"] is None and len(records[1]["test"]["outcomes"]) == 4
    start = json.loads((run_dir / "start.json").read_text())
    assert sorted(start["test"]["outcomes"]) == sorted(records[1]["test"]["outcomes"])  # the same held-out tasks

    lines = out.stdout.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("agent pass@1 on 4 held-out test tasks"))
    assert lines[first + 1].startswith("change: ") and " (paired over tasks); tool use " in lines[first + 1]
    assert any(line.startswith("train pass by round: ") for line in lines[first:])
    assert any(line.startswith("estimate: the 2 round(s) ahead take ~") for line in lines)
    assert any(line.startswith("round 0 took ") and " left (ends ~" in line for line in lines)
    summary = (run_dir / "report" / "summary.md").read_text().splitlines()
    assert summary[2] == f"- {lines[first]}"  # the report opens with the same result
    assert (run_dir / "report" / "result.png").stat().st_size > 10_000
