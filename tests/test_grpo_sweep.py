"""scripts/grpo_sweep.py on a tiny model_only run: every setting trains on the same buffered round
from the same starting weights and is scored on the validation split against the untrained model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import coevo
from tests.test_loop import smoke

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("grpo_sweep", ROOT / "scripts" / "grpo_sweep.py")
grpo_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_sweep)


def test_settings_parse_and_refuse_unknown_keys():
    assert grpo_sweep.parse_setting("small:lora_r=4,lr=1e-4") == ("small", {"lora_r": 4, "lr": 1e-4})
    with pytest.raises(ValueError, match="unknown key 'rank'"):
        grpo_sweep.parse_setting("x:rank=4")
    with pytest.raises(ValueError, match="give it a name"):
        grpo_sweep.parse_setting(":lr=1")


def test_first_attempts_keeps_the_first_g_of_each_task():
    class T:
        def __init__(self, task_id):
            self.task_id = task_id
    traces = [T(t) for t in "aabbbac"]
    kept, versions = grpo_sweep.first_attempts(traces, list(range(7)), 2)
    assert [t.task_id for t in kept] == ["a", "a", "b", "b", "c"] and versions == [0, 1, 2, 3, 6]


def test_tiny_sweep_trains_each_setting_from_the_same_start(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "s0", "mode=model_only", "rounds=1", "model.lora=true",
                                   "trainer.lr=1e-2")))
    summary = grpo_sweep.main([str(run_dir), "--steps", "2", "--step-traces", "0", "--limit", "3",
                               "--setting", "fast:lr=5e-2", "--setting", "off:lr=0", "--out", str(tmp_path / "out")])
    rows = summary["rows"]
    assert list(rows) == ["untrained", "fast", "off"] and summary["tasks"] >= 1
    assert rows["untrained"]["vs_untrained"][0] == 0.0
    # lr 0 leaves the weights where they started: the policy never moved from the behaviour one
    assert rows["off"]["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert "| fast | lr=0.05 |" in (tmp_path / "out" / "grpo_sweep.md").read_text()
