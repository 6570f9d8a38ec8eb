"""The round's side of GRPO, as pure functions over the replay buffer and traces: which buffered
traces a round reuses and trains on, which of the Critic's re-runs join the groups, and the round
record of its optimizer steps (``coevo.loop`` calls them; the trainer's step is ``coevo.trainers``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coevo.agent.trace import Trace
from coevo.records import GRPOMetrics
from coevo.trainers.advantages import group_advantages

CRITIC = "critic"
"""The buffer variant of the Critic's re-runs (``RolloutService.critic_rollout``)."""


def buffered_rollouts(buffer: Any, r: int) -> list[Trace] | None:
    """The rollouts a killed run already committed to ``buffer`` for round ``r`` (reused on resume;
    the Critic's traces of the round are not rollouts and are left out)."""
    entries = [e for e in buffer.query(round=r) if e.variant != CRITIC]
    return buffer.load(entries) if entries else None


def critic_traces_to_store(traces: Sequence[Trace], buffer: Any, r: int, withheld: set[str]) -> list[Trace]:
    """The Critic's re-runs of round ``r`` that join the groups: only tasks in ``withheld`` (no
    demonstration any harness of the round showed can hold their gold answer, so no trained prompt
    holds the answer it is scored on), none already stored (a resumed round: the critic phase is
    seeded, so the same ids are the same traces), and no more than the buffer holds beside the
    round's own rollouts (they are never evicted for them)."""
    stored = {e.trace_id for e in buffer.entries()}
    kept = [t for t in traces if t.task_id in withheld and t.trace_id not in stored]
    return kept[: max(0, buffer.capacity - len(buffer.query(round=r)))]


def critic_task_ids(buffer: Any, r: int) -> set[str]:
    """Tasks whose groups round ``r``'s Critic traces joined."""
    return {e.task_id for e in buffer.query(round=r) if e.variant == CRITIC}


def training_batch(buffer: Any, task_ids: set[str]) -> tuple[list[Trace], list[int]]:
    """Every buffered trace of ``task_ids`` (cross-harness, cross-checkpoint groups) and the model
    version that produced each."""
    entries = [e for e in buffer.entries() if e.task_id in task_ids]
    return buffer.load(entries), [e.model_version for e in entries]


def grpo_record(steps: Sequence[dict[str, Any]], traces: Sequence[Trace]) -> GRPOMetrics:
    """The round's GRPO record: the last step's ``StepMetrics`` fields, every step's scalars, the
    traces trained on, how many were the Critic's, and the zero-variance share the groups would
    have had without them (what the gate's evidence adds to the signal)."""
    last = steps[-1] if steps else {}
    rows = [{k: v for k, v in step.items() if k != "staleness"} for step in steps]  # scalars: a JSON round trip
    without = [t for t in traces if t.variant != CRITIC]
    stats = group_advantages([t.task_id for t in without], [t.reward for t in without],
                             members=[t.trainable for t in without])[2]
    return GRPOMetrics.from_dict(last | {"buffer_traces": len(traces), "steps": rows or None,
                                         "critic_traces": len(traces) - len(without),
                                         "zero_variance_without_critic": stats.zero_variance_fraction})
