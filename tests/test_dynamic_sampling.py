"""Dynamic sampling (``rollout.signal_groups``): a training round whose groups carry too
little reward spread rolls out further train tasks from a reserve fixed in advance, trains on them
and never shows them to AEGIS; the rest of the round samples as it would without them; their
references are withheld like a batch's; a killed round resumes to the uninterrupted result."""

from __future__ import annotations

from pathlib import Path

import torch

import coevo
from coevo.agent.trace import Trace
from coevo.buffers import ReplayBuffer
from coevo.envs.base import Task
from coevo.envs.load import make_env
from coevo.evolution.engine import AEGIS
from coevo.loop.round_grpo import dynamic_sample, signal_groups
from coevo.loop.round_plan import extra_pools, round_batches
from tests.test_loop import killed_in_round_1_and_resumed, records, smoke, weights

SMOKE_ENV = {"n_tasks": 30, "max_terms": 3, "max_operand": 3, "partial_credit": True}


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", env="e", instruction=f"task {i}", split="train", answer=str(i))


def _trace(task: str, reward: float, trainable: bool = True) -> Trace:
    return Trace(trace_id=f"{task}-{reward}", task_id=task, env="e", split="train", harness_id="h", variant="base",
                 model_version="0", reward=reward, passed=reward == 1.0, trainable=trainable)


def test_extra_pools_are_disjoint_from_every_batch_and_from_each_other_and_seeded():
    tasks = [_task(i) for i in range(30)]
    batches = round_batches(tasks, 4, seed=0, rounds=3)
    pools = extra_pools(tasks, batches, 6, seed=0)
    assert [len(p) for p in pools] == [6, 6, 6]
    batched = {t.task_id for b in batches for t in b}
    drawn = [t.task_id for p in pools for t in p]
    assert len(set(drawn)) == 18 and not set(drawn) & batched
    assert pools == extra_pools(tasks, batches, 6, seed=0)
    assert pools != extra_pools(tasks, batches, 6, seed=1)
    assert [len(p) for p in extra_pools(tasks, batches, 8, seed=0)] == [8, 8, 2]  # the split runs out: 30 - 12 = 18


def test_signal_groups_counts_groups_whose_trainable_rewards_differ():
    traces = [_trace("a", 0.0), _trace("a", 1.0), _trace("b", 0.0), _trace("b", 0.0),
              _trace("c", 1.0), _trace("c", 0.0, trainable=False)]
    assert signal_groups(traces) == 1


def test_dynamic_sample_draws_chunks_in_order_until_enough_groups_have_a_spread():
    reserve = [_task(i) for i in range(10)]
    calls: list[tuple[list[str], bool]] = []

    def roll_out(tasks: list[Task], first: bool) -> list[Trace]:
        calls.append(([t.task_id for t in tasks], first))
        spread = {"t1", "t2", "t5"}  # these tasks' groups get a reward spread
        return [_trace(t.task_id, r) for t in tasks for r in ((0.0, 1.0) if t.task_id in spread else (0.0, 0.0))]

    extra = dynamic_sample([_trace("b", 0.0), _trace("b", 1.0)], reserve, 3, 3, roll_out)
    assert calls == [(["t0", "t1", "t2"], True)]  # 1 + 2 groups with a spread after one chunk: stop
    assert {t.task_id for t in extra} == {"t0", "t1", "t2"}
    calls.clear()
    extra = dynamic_sample([], reserve, 3, 3, roll_out)
    assert [c[0][0] for c in calls] == ["t0", "t3"] and [c[1] for c in calls] == [True, False]
    calls.clear()
    assert len(dynamic_sample([], reserve, 4, 99, roll_out)) == 20 and len(calls) == 3  # the reserve runs out
    assert dynamic_sample([], reserve, 3, 0, roll_out) == [] and len(calls) == 3  # off: nothing drawn


def _round_entries(run_dir: Path):
    with ReplayBuffer(run_dir / "buffer", capacity=512) as buf:
        entries = buf.entries()
        return entries, buf.load(entries)


def test_a_training_run_trains_on_extra_tasks_that_aegis_never_sees(tmp_path):
    on = Path(coevo.run(smoke(tmp_path / "on", "mode=model_only", "rollout.signal_groups=100",
                              "rollout.max_extra_tasks=4")))
    off = Path(coevo.run(smoke(tmp_path / "off", "mode=model_only")))
    env = make_env("arithmetic", SMOKE_ENV)
    batches = round_batches(env.tasks("train"), 4, 0, 2)
    pools = extra_pools(env.tasks("train"), batches, 4, 0)
    entries, traces = _round_entries(on)
    for r, rec in enumerate(records(on)):
        in_round = {e.task_id for e in entries if e.round == r}
        assert in_round == {t.task_id for t in batches[r] + pools[r]}  # 100 groups unreachable: the whole reserve
        assert rec["train"]["n_traces"] == 8  # the record's train pass is the batch's, as without extras
        assert rec["grpo"]["extra_tasks"] == 4 and rec["grpo"]["buffer_traces"] == 16
    assert all(r["grpo"]["extra_tasks"] is None for r in records(off))
    # the extras sample on a stream of their own: round 0's batch traces (same weights) are those of the run without
    _, plain = _round_entries(off)
    batch0 = {t.task_id for t in batches[0]}
    key = lambda ts: sorted((t.trace_id, t.final_answer, t.reward) for t in ts if t.task_id in batch0  # noqa: E731
                            and t.trace_id.startswith("r0000"))
    assert key(traces) == key(plain) and key(plain)


def test_extra_tasks_references_are_withheld_from_demonstrations_until_trained(tmp_path, monkeypatch):
    seen: dict[int, set[str]] = {}
    original = AEGIS.evolve

    def evolve(self, traces, *, round, withheld=(), **kwargs):
        seen[round] = set(withheld)
        assert all(t.trace_id.startswith("r") for t in traces), "AEGIS digests the batch's rollouts only"
        return original(self, traces, round=round, withheld=withheld, **kwargs)

    monkeypatch.setattr(AEGIS, "evolve", evolve)
    coevo.run(smoke(tmp_path / "run", "mode=coevolve", "rollout.signal_groups=100", "rollout.max_extra_tasks=4"))
    env = make_env("arithmetic", SMOKE_ENV)
    batches = round_batches(env.tasks("train"), 4, 0, 2)
    pools = extra_pools(env.tasks("train"), batches, 4, 0)
    assert set(seen) == {0, 1}
    for r, withheld in seen.items():
        assert {t.task_id for p in pools[r:] for t in p} <= withheld
    assert not {t.task_id for t in pools[0]} & seen[1]  # trained for good in round 0: its references are free


def test_a_round_killed_after_its_rollouts_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    args = ("mode=model_only", "rollout.signal_groups=100", "rollout.max_extra_tasks=4")
    whole = Path(coevo.run(smoke(tmp_path / "whole", *args)))
    # round 1's rollouts and extras come from the buffer
    cut = killed_in_round_1_and_resumed(tmp_path / "cut", monkeypatch, *args)
    a, b = records(whole), records(cut)
    assert [r["grpo"]["extra_tasks"] for r in b] == [4, 4]
    assert [r["train"] for r in a] == [r["train"] for r in b] and a[1]["train"]["n_traces"] == 8
    assert [r["grpo"]["loss"] for r in a] == [r["grpo"]["loss"] for r in b]
    wa, wb = weights(whole), weights(cut)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
