"""scripts/ablation.py: paired bootstrap intervals, and the tiny preset end to end."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from coevo.rundir.records import RoundRecord

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ablation", ROOT / "scripts" / "ablation.py")
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)


def records(outcomes: dict[str, list[bool]], train: list[float]) -> list[RoundRecord]:
    """Round records as train.py writes them: a train pass rate per round, the test in the last."""
    out = [{"round": r, "mode": "static", "model_version": 0, "seconds": {"total": 60.0},
            "train": {"pass_rate": p, "mean_reward": p, "n_traces": 2, "outcomes": {}, "tool_use_rate": p / 2},
            "val": None, "test": None, "variants": {}, "by_variant": {}, "evolve": None, "grpo": None,
            "meta_tokens": {}, "buffer": None}
           for r, p in enumerate(train)]
    out[-1]["test"] = {"k": 2, "outcomes": outcomes, "pass_at_1": 0.0, "pass_at_k": 0.0, "tool_use_rate": 0.25}
    return [RoundRecord.from_dict(r) for r in out]


def test_pairing_removes_between_task_variance():
    """Arm b passes exactly the tasks arm a passes plus 10 more of 100: the paired interval of b - a
    is tight around +10 and excludes 0, while the unpaired intervals of the two arms overlap."""
    rng = np.random.default_rng(1)
    base = rng.random(100) < 0.4
    extra = np.zeros(100, bool)
    extra[np.flatnonzero(~base)[:10]] = True
    a = {f"t{i:03d}": [bool(base[i])] * 2 for i in range(100)}
    b = {f"t{i:03d}": [bool(base[i] or extra[i])] * 2 for i in range(100)}
    summary = ablation.summarise({"static": [records(a, [0.1, 0.2])], "harness_only": [records(b, [0.1, 0.3])]})
    diff = summary["differences"]["harness_only - static"]["pass_at_1"]
    assert diff[0] == pytest.approx(10.0)
    assert 0 < diff[1] < 10 < diff[2] < 20
    arms = summary["arms"]
    assert arms["static"]["pass_at_1"][2] > arms["harness_only"]["pass_at_1"][1]  # unpaired: overlapping
    assert arms["harness_only"]["curves"]["pass_rate"] == pytest.approx([10.0, 30.0])
    assert arms["harness_only"]["curves"]["tool_use_rate"] == pytest.approx([5.0, 15.0])


def test_pass_at_k_counts_any_attempt_and_seeds_pair_by_task():
    a = {"t1": [True, False], "t2": [False, False]}
    b = {"t1": [True, True], "t2": [False, True]}
    summary = ablation.summarise({"static": [records(a, [0.0]), records(a, [0.0])],
                                  "coevolve": [records(b, [0.0]), records(b, [0.0])]})
    assert summary["arms"]["static"]["pass_at_1"][0] == pytest.approx(25.0)
    assert summary["arms"]["static"]["pass_at_k"][0] == pytest.approx(50.0)
    assert summary["differences"]["coevolve - static"]["pass_at_1"][0] == pytest.approx(50.0)
    assert summary["differences"]["coevolve - static"]["pass_at_k"][0] == pytest.approx(50.0)
    assert summary["differences"]["coevolve - static"]["seeds"] == 2


def test_seeds_tested_on_different_tasks_are_refused():
    with pytest.raises(ValueError, match="one sealed test split"):
        ablation.summarise({"static": [records({"t1": [True]}, [0.0]), records({"t2": [True]}, [0.0])]})


def test_tiny_preset_runs_every_arm_and_writes_the_report(tmp_path):
    summary = ablation.main(["--preset", "tiny", "--seeds", "0", "--out", str(tmp_path)])
    assert list(summary["arms"]) == list(ablation.MODES)
    for arm in summary["arms"].values():
        assert arm["tasks"] == 6 and arm["seeds"] == 1 and len(arm["curves"]["pass_rate"]) == 2
    assert set(summary["differences"]) == {f"{a} - {b}" for a, b in ablation.DIFFERENCES}
    report = (tmp_path / "ablation.md").read_text()
    assert "paired bootstrap" in report and "--preset tiny" in report
    assert json.loads((tmp_path / "ablation.json").read_text())["arms"].keys() == summary["arms"].keys()
    assert (tmp_path / "ablation.png").stat().st_size > 10_000
    # every trained arm took its GRPO steps; the static arms trained nothing
    for mode in ablation.MODES:
        rounds = [json.loads(line) for line in (tmp_path / f"{mode}-s0" / "rounds.jsonl").read_text().splitlines()]
        assert all((r["grpo"] is not None) == (mode in ("model_only", "coevolve")) for r in rounds)
    check_against(tmp_path)


def check_against(done: Path) -> None:
    """--against on the tiny ablation's runs: the same runs read back against a copy in which one
    test task of model_only failed where it passed (or passed where it failed) differ by exactly
    that task's share, paired; a seed missing there is refused."""
    other = done / "other"
    shutil.copytree(done / "model_only-s0", other / "model_only-s0")
    path = other / "model_only-s0" / "rounds.jsonl"
    rounds = [json.loads(line) for line in path.read_text().splitlines()]
    outcomes = rounds[-1]["test"]["outcomes"]
    task = sorted(outcomes)[0]
    flipped = [not v for v in outcomes[task]]
    outcomes[task] = flipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rounds))
    summary = ablation.main(["--preset", "tiny", "--modes", "model_only", "--seeds", "0", "--out", str(done),
                             "--against", str(other)])
    row = summary["against"]["model_only"]
    attempts = len(flipped)
    expected = 100 * (attempts - 2 * sum(flipped)) / attempts / len(outcomes)  # here − there on that task alone
    assert row["difference"][0] == pytest.approx(expected) and row["seeds"] == 1
    assert row["this"]["zero_variance_by_round"] == row["other"]["zero_variance_by_round"]
    assert f"Against {other}" in (done / "ablation.md").read_text()
    with pytest.raises(SystemExit, match="has not finished there"):
        ablation.against({"static": [ablation.load_run(done / "static-s0").records]}, [0], other)
