"""scripts/gpu_check.py's round check, the tiny preset a CPU runs: one train.py round through
coevo.run, its phase seconds and the loss kernel's calls read back (the GPU run times SmolLM2's)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_round_check_times_a_round_by_phase_and_the_loss_inside_it(tmp_path):
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--checks", "round", "--model",
                           "tiny", "--round-override", "experiment=smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r["check"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())}
    assert "transformers_contract" not in rows and "kernel_timing" not in rows  # --checks round ran only the round
    r = rows["gpu_round"]
    assert r["passed"] and {"rollout", "logprobs", "grpo", "critic", "total"} <= set(r["phases"])
    assert abs(sum(v for k, v in r["phases"].items() if k != "total") - r["phases"]["total"]) < 0.05
    assert r["loss_calls"] >= 1 and r["loss_tokens"] > 0 and 0 < r["loss_share_of_grpo"] < 1
