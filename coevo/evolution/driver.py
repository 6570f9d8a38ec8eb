"""Harness-only evolution rounds: roll out a train batch on the routed variants, then AEGIS.

This is what ``coevo evolve`` runs (no weight updates); the co-evolution loop reuses
``rollout_round`` (its rollouts, validation and test) and ``rollout_fn`` (the Critic's re-runs) and
adds the buffer and GRPO between rounds. Episodes run through ``coevo.agent.runtime.run_attempts``
and their outcomes come from ``coevo.agent.outcomes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coevo.agent.outcomes import pass_at_k, task_outcomes
from coevo.agent.policy import Policy
from coevo.agent.runtime import run_attempts
from coevo.agent.trace import Trace
from coevo.config import RolloutConfig
from coevo.envs.base import Env, Task
from coevo.evolution.critic import Rollout
from coevo.evolution.engine import AEGIS, EvolveReport
from coevo.harness.harness import Harness


def rollout_fn(policy: Policy, env: Env, *, batch_size: int = RolloutConfig.batch_size, max_steps: int = 32,
               workers: int = RolloutConfig.workers, on_trace: Callable[[Trace], None] | None = None) -> Rollout:
    """The Critic's re-run: ``k`` episodes per task on one harness → task id → outcomes, None for
    an episode that ended in an infrastructure failure (no evidence about the harness)."""

    def run(harness: Harness, tasks: Sequence[Task], k: int) -> dict[str, list[bool | None]]:
        groups = run_attempts(tasks, harness, policy, env, attempts=k, variant="critic", batch_size=batch_size,
                              workers=workers, max_steps=max_steps, on_trace=on_trace)
        return task_outcomes((t for g in groups for t in g), [t.task_id for t in tasks], infra="none")

    return run


def session_tools(env: Env, task: Task) -> list[str]:
    """The tool names an env session offers (envs declare tools per session, not per env)."""
    session = env.reset(task)
    try:
        return sorted(session.tools)
    finally:
        session.close()


def batches(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    """One epoch of train batches in a fixed order (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


def rollout_round(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, attempts: int,
                  batch_size: int = RolloutConfig.batch_size, max_steps: int = 32, workers: int = RolloutConfig.workers,
                  on_trace: Callable[[Trace], None] | None = None,
                  trace_id: Callable[[Task, int], str] | None = None) -> list[Trace]:
    """``attempts`` episodes per task, each on the variant AEGIS routes it to; the traces task by
    task, attempt by attempt. ``trace_id(task, attempt)``: see ``run_attempts``."""
    routed = aegis.assign(tasks)
    variants = [routed[task.task_id] for task in tasks]
    groups = run_attempts(tasks, [aegis.harness(v) for v in variants], policy, env, attempts=attempts,
                          variant=variants, trace_id=trace_id, batch_size=batch_size, workers=workers,
                          max_steps=max_steps, on_trace=on_trace)
    return [t for group in groups for t in group]


def run_round(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, round: int, attempts: int,
              batch_size: int = RolloutConfig.batch_size, max_steps: int = 32,
              on_trace: Callable[[Trace], None] | None = None) -> tuple[list[Trace], EvolveReport]:
    """Rollout then evolution; the traces are returned for whoever else consumes them (the buffer)."""
    traces = rollout_round(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size,
                           max_steps=max_steps, on_trace=on_trace)
    return traces, aegis.evolve(traces, round=round)


def routed_outcomes(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, attempts: int = 1,
                    batch_size: int = RolloutConfig.batch_size, max_steps: int = 32) -> dict[str, list[bool]]:
    """task id → the outcomes of ``attempts`` episodes on its routed variant (validation or test)."""
    traces = rollout_round(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size, max_steps=max_steps)
    return task_outcomes(traces, [t.task_id for t in tasks])


def routed_pass_rate(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, attempts: int = 1,
                     batch_size: int = RolloutConfig.batch_size, max_steps: int = 32) -> float:
    """pass@``attempts`` of the routed variants on ``tasks``."""
    return pass_at_k(routed_outcomes(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size,
                                     max_steps=max_steps))
