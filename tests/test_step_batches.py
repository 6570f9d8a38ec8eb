"""A round's optimizer steps as minibatches of its groups (``trainer.step_traces``): whole groups
with a reward spread, capped per step, every group seen before any repeats; groups with equal
rewards ride along in every step; without the cap every step takes the whole round."""

from __future__ import annotations

from pathlib import Path

import coevo
from coevo.agent.trace import Trace
from coevo.loop.round_grpo import grpo_record, step_batches
from coevo.rundir.records import StepMetrics
from tests.test_loop import records, smoke


def _trace(task: str, i: int, reward: float) -> Trace:
    return Trace(trace_id=f"{task}-{i}", task_id=task, env="e", split="train", harness_id="h", variant="base",
                 model_version="0", reward=reward)


def _round(spread_groups: int, flat_groups: int, size: int = 4) -> list[Trace]:
    out = []
    for g in range(spread_groups):
        out += [_trace(f"s{g}", i, float(i == 0)) for i in range(size)]
    for g in range(flat_groups):
        out += [_trace(f"f{g}", i, 0.0) for i in range(size)]
    return out


def test_without_a_cap_every_step_takes_the_whole_round():
    traces = _round(3, 2)
    batches = step_batches(traces, list(range(len(traces))), 3, None, seed="0-0")
    assert len(batches) == 3
    assert all([t.trace_id for t in part] == [t.trace_id for t in traces] for part, _ in batches)


def test_a_cap_splits_the_spread_groups_whole_and_covers_them_before_repeating():
    traces = _round(5, 2)  # 5 groups with a spread (20 traces), 2 flat ones
    versions = [i % 3 for i in range(len(traces))]
    batches = step_batches(traces, versions, 4, 8, seed="3-1")
    seen: list[set[str]] = []
    for part, part_versions in batches:
        spread = {t.task_id for t in part if t.task_id.startswith("s")}
        assert len(spread) == 2, "8 traces a step: two whole groups of 4"
        for task in spread:  # whole groups only
            assert sum(t.task_id == task for t in part) == 4
        assert {t.task_id for t in part if t.task_id.startswith("f")} == {"f0", "f1"}, "flat groups in every step"
        assert part_versions == [versions[traces.index(t)] for t in part], "each trace keeps its model version"
        seen.append(spread)
    assert seen[0] | seen[1] | seen[2] == {f"s{g}" for g in range(5)}, "all five groups within three steps"
    assert not seen[0] & seen[1], "no repeat before every group was seen"
    again = step_batches(traces, versions, 4, 8, seed="3-1")
    assert [[t.trace_id for t in p] for p, _ in again] == [[t.trace_id for t in p] for p, _ in batches]
    assert step_batches(traces, versions, 4, 8, seed="3-2") != batches, "the order is the round's seed"


def test_a_group_larger_than_the_cap_is_still_trained_whole():
    traces = _round(2, 0, size=6)
    parts = step_batches(traces, [0] * len(traces), 2, 4, seed="0-0")
    assert len(parts) == 2  # two steps, each holding the whole group
    for part, _ in parts:
        assert len(part) == 6


def test_the_round_record_reports_the_whole_batch_not_the_last_minibatch():
    traces = _round(3, 1)
    step = StepMetrics(loss=1.0, clip_fraction=0.0, kl=0.0, ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0,
                       advantage_mean=0.0, advantage_std=1.0, zero_variance_fraction=0.0, excluded_traces=0,
                       infra_traces=0, sequences=4, tokens=40, tokens_per_s=1.0, grad_norm=0.1, lr=1e-5,
                       reward_mean=0.5, reward_std=0.1)
    rec = grpo_record([step], traces)
    assert rec.zero_variance_fraction == 0.25 and abs(rec.reward_mean - 3 / 16) < 1e-12
    written = rec.to_dict()  # rounds.jsonl: the round's figures over the step's, the step's own in steps
    assert (written["zero_variance_fraction"], written["loss"], written["steps"][0]["reward_mean"]) == (0.25, 1.0, 0.5)


def test_a_capped_run_trains_minibatches_and_records_the_round(tmp_path, monkeypatch):
    """trainer.step_traces reaches the loop: every step the trainer is given holds at most one group
    with a reward spread (2 attempts), and some round had more than one, so the cap split it."""
    from coevo.trainers.grpo import GRPOTrainer

    given: list[list[Trace]] = []
    real = GRPOTrainer.step

    def spy(self, traces, **kwargs):
        given.append(list(traces))
        return real(self, traces, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "step", spy)
    run_dir = Path(coevo.run(smoke(tmp_path / "run", "mode=model_only", "rounds=2", "trainer.steps_per_round=2",
                                   "trainer.step_traces=2", "rollout.attempts=2")))
    spread = [{t.task_id for t in part if len({u.reward for u in part if u.task_id == t.task_id}) > 1}
              for part in given]
    assert len(given) == 4 and all(len(groups) <= 1 for groups in spread)
    per_round = [spread[0] | spread[1], spread[2] | spread[3]]
    assert any(len(groups) > 1 for groups in per_round), "a round with two groups with a spread, split over its steps"
    for rec in records(run_dir):
        assert len(rec["grpo"]["steps"]) == 2
