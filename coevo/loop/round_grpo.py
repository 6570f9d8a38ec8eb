"""The round's side of GRPO, as pure functions over the replay buffer and traces: which buffered
traces a round reuses and trains on, which of the Critic's re-runs join the groups, and the round
record of its optimizer steps (``coevo.loop.coevolution`` calls them; the trainer's step is ``coevo.trainers``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from coevo.agent.trace import Trace
from coevo.envs.base import Task
from coevo.rundir.records import GRPOMetrics, StepMetrics
from coevo.trainers.advantages import group_advantages

if TYPE_CHECKING:
    from coevo.buffers import ReplayBuffer

CRITIC = "critic"
"""The buffer variant of the Critic's re-runs (``RolloutService.critic_rollout``)."""

UNSCAFFOLDED = "unscaffolded"
"""The buffer variant of the episodes run without the harness's scaffolding (``rollout.unscaffolded_attempts``)."""


def buffered_rollouts(buffer: ReplayBuffer, r: int) -> tuple[list[Trace], list[Trace]] | None:
    """The rollouts a killed run already committed to ``buffer`` for round ``r`` (reused on resume),
    and apart from them the round's episodes without the scaffolding; the Critic's traces of the
    round are not rollouts and are left out. None when the round committed none."""
    entries = [e for e in buffer.query(round=r) if e.variant != CRITIC]
    if not entries:
        return None
    return (buffer.load([e for e in entries if e.variant != UNSCAFFOLDED]),
            buffer.load([e for e in entries if e.variant == UNSCAFFOLDED]))


def critic_traces_to_store(traces: Sequence[Trace], buffer: ReplayBuffer, r: int, withheld: set[str]) -> list[Trace]:
    """The Critic's re-runs of round ``r`` that join the groups: only tasks in ``withheld`` (no
    demonstration any harness of the round showed can hold their gold answer, so no trained prompt
    holds the answer it is scored on), none already stored (a resumed round: the critic phase is
    seeded, so the same ids are the same traces), and no more than the buffer holds beside the
    round's own rollouts (they are never evicted for them)."""
    stored = {e.trace_id for e in buffer.entries()}
    kept = [t for t in traces if t.task_id in withheld and t.trace_id not in stored]
    return kept[: max(0, buffer.capacity - len(buffer.query(round=r)))]


def critic_task_ids(buffer: ReplayBuffer, r: int) -> set[str]:
    """Tasks whose groups round ``r``'s Critic traces joined."""
    return {e.task_id for e in buffer.query(round=r) if e.variant == CRITIC}


def training_batch(buffer: ReplayBuffer, task_ids: set[str]) -> tuple[list[Trace], list[int]]:
    """Every buffered trace of ``task_ids`` (cross-harness, cross-checkpoint groups) and the model
    version that produced each."""
    entries = [e for e in buffer.entries() if e.task_id in task_ids]
    return buffer.load(entries), [e.model_version for e in entries]


def step_batches(traces: Sequence[Trace], versions: Sequence[int], steps: int, max_traces: int | None,
                 seed: str) -> list[tuple[list[Trace], list[int]]]:
    """The traces (and their model versions) of each of a round's ``steps`` optimizer steps.

    Without ``max_traces`` every step takes the whole batch (passes over the same groups). With it,
    a step takes whole groups with a reward spread, at most ``max_traces`` of their traces (at least
    one group), continuing where the last step stopped and wrapping around a seeded order: PPO's
    minibatches, so a round whose Critic re-runs double its groups costs what ``max_traces`` allows
    while a small round still sees every group in every step. Groups whose rewards are all equal go
    in every step (the trainer drops them before any forward pass; they count in its figures).
    """
    if not max_traces:
        return [(list(traces), list(versions))] * steps
    groups = spread_groups(traces)
    signal = [idx for idx, spread in groups if spread]
    flat = [i for idx, spread in groups if not spread for i in idx]
    random.Random(seed).shuffle(signal)
    out, at = [], 0
    for _ in range(steps):
        chosen: list[int] = []
        for _ in range(len(signal)):
            idx = signal[at % len(signal)]
            if chosen and len(chosen) + len(idx) > max_traces:
                break
            chosen += idx
            at += 1
        chosen = sorted(chosen + flat)
        out.append(([traces[i] for i in chosen], [versions[i] for i in chosen]))
    return out


def grpo_record(steps: Sequence[StepMetrics], traces: Sequence[Trace]) -> GRPOMetrics:
    """The round's GRPO record: every step's figures, the reward mean/std and zero-variance share
    over the round's whole batch (a step may train on only part of it), the traces trained on, how
    many were the Critic's, and the zero-variance share the groups would have had without them
    (what the gate's evidence adds to the signal)."""
    members = [t for t in traces if t.trainable]
    stats = group_advantages([t.task_id for t in members], [t.reward for t in members])[2]
    rewards = [t.reward for t in members]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (sum((x - mean) ** 2 for x in rewards) / max(1, len(rewards) - 1)) ** 0.5 if mean is not None else None
    without = [t for t in traces if t.variant != CRITIC]
    alone = group_advantages([t.task_id for t in without], [t.reward for t in without],
                             members=[t.trainable for t in without])[2]
    whole = {"reward_mean": mean, "reward_std": std, "zero_variance_fraction": stats.zero_variance_fraction}
    return GRPOMetrics(buffer_traces=len(traces), steps=list(steps), **(whole if steps else {}),
                       critic_traces=len(traces) - len(without),
                       zero_variance_without_critic=alone.zero_variance_fraction)


def spread_groups(traces: Sequence[Trace]) -> list[tuple[list[int], bool]]:
    """Each task's group as (indices into ``traces``, whether its trainable members' rewards differ):
    a group whose rewards are all equal has zero advantages and teaches a GRPO step nothing."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(traces):
        groups.setdefault(t.task_id, []).append(i)
    return [(idx, len({traces[i].reward for i in idx if traces[i].trainable}) > 1) for idx in groups.values()]


def signal_groups(traces: Sequence[Trace]) -> int:
    """How many tasks' groups have a reward spread (``spread_groups``)."""
    return sum(spread for _, spread in spread_groups(traces))


def dynamic_sample(traces: Sequence[Trace], reserve: Sequence[Task], chunk: int, target: int,
                   roll_out: Callable[[list[Task], bool], list[Trace]]) -> list[Trace]:
    """DAPO's dynamic sampling: while fewer than ``target`` of the round's groups have a reward
    spread, roll out the next ``chunk`` tasks of the round's ``reserve`` (``roll_out(tasks, first)``)
    and return every extra trace. At a 6% pass rate ~70% of groups of 8 have equal rewards and
    train nothing; drawing further tasks until enough groups carry signal gives every optimizer
    step a full minibatch of them, at the price of the extra episodes."""
    extra: list[Trace] = []
    for i in range(0, len(reserve), chunk):
        if signal_groups([*traces, *extra]) >= target:
            break
        extra += roll_out(list(reserve[i : i + chunk]), i == 0)
    return extra
