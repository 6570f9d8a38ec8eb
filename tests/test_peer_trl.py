"""scripts/peer_trl.py on its tiny preset: coevo's GRPO loop and TRL's GRPOTrainer side by side must
both train, on the same prompts in the same order, scored by the same (coevo's) reward."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from coevo.envs.base import Score
from coevo.envs.reasoning import ReasoningSession

ROOT = Path(__file__).resolve().parents[1]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("peer_trl", ROOT / "scripts" / "peer_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def alternating_verify() -> Any:
    """A verifier whose k-th verdict on a task is k mod 2. The tiny random model almost never earns
    real credit, so without it neither arm would see a reward difference inside a group, and a
    run that trained nothing would look the same as one that did. With it every group of a task's
    completions in a step holds as many 0s as 1s (the preset draws 2), whatever order the runtime's
    worker threads verify them in."""
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def verify(self: ReasoningSession, answer: str | None) -> Score:
        with lock:
            k = counts.get(self.task.task_id, 0)
            counts[self.task.task_id] = k + 1
        return Score(float(k % 2), k % 2 == 1, {})

    return verify


def test_both_arms_share_coevos_reward_and_the_lenient_single_turn_prompt(tmp_path):
    from coevo.loop.builders import start_harness

    script = load_script()
    args = script.parse_args(["--preset", "tiny", "--out", str(tmp_path)])
    cfg = script.compose_config(args, tmp_path, script.write_harness(tmp_path))
    harness = start_harness(cfg)
    env, batches = script.step_batches(cfg)
    assert [len(b) for b in batches] == [2, 2] and cfg.rollout.attempts == 2 and cfg.rollout.max_steps == 1
    task = batches[0][0]
    assert script.score(env, harness, task, f"<answer>{task.answer}</answer>")[:2] == (1.0, True)
    assert script.score(env, harness, task, f"First 7, so it is {task.answer}")[:2] == (1.0, True)  # last number
    assert script.score(env, harness, task, "no idea")[:2] == (0.0, False)
    prompt = script.score(env, harness, task, "")[2]
    assert [m["role"] for m in prompt] == ["system", "user"] and prompt[1]["content"] == task.instruction
    assert "<answer>" in prompt[0]["content"] and "tool_call" not in prompt[0]["content"]  # no tools offered


@pytest.mark.slow
def test_tiny_preset_trains_both_arms_on_the_same_prompts(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(ReasoningSession, "verify", alternating_verify())
    out = tmp_path / "peer"
    result = script.main(["--preset", "tiny", "--out", str(out)])

    assert result["same_prompts"] and result["same_harness"]
    assert result["settings"]["completions_per_step"] == 4 and result["settings"]["max_new_tokens"] == 8
    for name in ("coevo", "trl"):
        arm = result["arms"][name]
        rows = arm["rows"]
        assert [r["step"] for r in rows] == [1, 2], name
        assert all(math.isfinite(r["reward"]) and 0.0 <= r["reward"] <= 1.0 for r in rows), name
        assert all(r["reward"] == 0.5 for r in rows), name  # the step's own completions: two 0s and two 1s
        assert all(r["seconds"] > 0 for r in rows), name
        assert arm["lora_change"] > 0, name  # no optimizer step (or a zero gradient) leaves it at exactly 0
    assert all(r["zero_variance_fraction"] == 0.0 and r["trained_tokens"] > 0 for r in result["arms"]["coevo"]["rows"])
    assert all(r["frac_reward_zero_std"] == 0.0 for r in result["arms"]["trl"]["rows"])
    assert result["arms"]["trl"]["initial_adapter"] == "coevo's"

    saved = json.loads((out / "peer_trl.json").read_text())
    assert set(saved["arms"]) == {"coevo", "trl"}
    table = (out / "peer_trl.md").read_text()
    assert "| coevo | 2 | 4 | 0.500 | 0.500 |" in table and "| trl | 2 | 4 | 0.500 | 0.500 |" in table
    assert "python scripts/peer_trl.py --preset tiny" in table
    assert (out / "peer_trl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tiny_preset_on_the_tool_path_trains_trl_on_coevo_episodes(tmp_path, monkeypatch):
    import coevo.trainers.trl_rollout as trl_rollout

    script = load_script()
    monkeypatch.setattr(ReasoningSession, "verify", alternating_verify())
    rows: list[dict[str, Any]] = []
    original = trl_rollout.trace_row
    monkeypatch.setattr(trl_rollout, "trace_row", lambda trace: rows.append(original(trace)) or rows[-1])
    out = tmp_path / "peer"
    harness = ROOT / "examples" / "harnesses" / "lenient_tool_choice_demos.yaml"
    result = script.main(["--preset", "tiny", "--harness", str(harness), "--out", str(out)])

    assert result["same_prompts"] and result["same_harness"] and result["settings"]["max_steps"] == 3
    for name in ("coevo", "trl"):
        assert [r["reward"] for r in result["arms"][name]["rows"]] == [0.5, 0.5], name
        assert result["arms"][name]["lora_change"] > 0, name
    assert len(rows) == 8  # TRL's 2 steps x 2 prompts x 2 completions, each a coevo episode
    assert [r["calls_dropped"] for r in result["arms"]["trl"]["rows"]] == [
        sum(r["calls_dropped"] for r in rows[:4]), sum(r["calls_dropped"] for r in rows[4:])]  # tallied per step
    # (the tiny model's 8 tokens never close the forced call, so these episodes are one call each; the
    # masking of tool results is tests/trainers/test_trl_rollout.py's)
    assert all(len(r["env_mask"]) == len(r["completion_ids"]) == len(r["logprobs"]) > 0 for r in rows)
    assert "rollout_func" in (out / "peer_trl.md").read_text()
