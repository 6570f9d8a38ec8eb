"""Harness-only evolution rounds: roll out a train batch on the routed variants, then AEGIS.

This is what ``coevo evolve`` runs (no weight updates); the co-evolution loop reuses
``rollout_fn`` and ``run_round`` and adds the buffer and GRPO between rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coevo.agent.policy import Policy
from coevo.agent.runtime import Job, run_episodes
from coevo.agent.trace import Trace
from coevo.envs.base import Env, Task
from coevo.evolution.critic import Rollout
from coevo.evolution.engine import AEGIS, EvolveReport
from coevo.harness.harness import Harness


def rollout_fn(policy: Policy, env: Env, *, batch_size: int = 32, max_steps: int = 32, workers: int = 8,
               on_trace: Callable[[Trace], None] | None = None) -> Rollout:
    """The Critic's re-run: ``k`` episodes per task on one harness → task id → outcomes, None for
    an episode that ended in an infrastructure failure (no evidence about the harness)."""

    def run(harness: Harness, tasks: Sequence[Task], k: int) -> dict[str, list[bool | None]]:
        jobs = [Job(task, harness, variant="critic") for task in tasks for _ in range(k)]
        traces = run_episodes(jobs, policy, env, batch_size=batch_size, workers=workers, max_steps=max_steps,
                              on_trace=on_trace)
        out: dict[str, list[bool | None]] = {t.task_id: [] for t in tasks}
        for trace in traces:
            out[trace.task_id].append(None if trace.infra_failure else bool(trace.passed))
        return out

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
                  batch_size: int = 32, max_steps: int = 32, workers: int = 8,
                  on_trace: Callable[[Trace], None] | None = None) -> list[Trace]:
    """``attempts`` episodes per task, each on the variant AEGIS routes it to."""
    routed = aegis.assign(tasks)
    jobs = [Job(task, aegis.harness(routed[task.task_id]), variant=routed[task.task_id])
            for task in tasks for _ in range(attempts)]
    return run_episodes(jobs, policy, env, batch_size=batch_size, workers=workers, max_steps=max_steps,
                        on_trace=on_trace)


def run_round(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, round: int, attempts: int,
              batch_size: int = 32, max_steps: int = 32,
              on_trace: Callable[[Trace], None] | None = None) -> tuple[list[Trace], EvolveReport]:
    """Rollout then evolution; the traces are returned for whoever else consumes them (the buffer)."""
    traces = rollout_round(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size,
                           max_steps=max_steps, on_trace=on_trace)
    return traces, aegis.evolve(traces, round=round)


def routed_outcomes(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, attempts: int = 1,
                    batch_size: int = 32, max_steps: int = 32) -> dict[str, list[bool]]:
    """task id → the outcomes of ``attempts`` episodes on its routed variant (validation or test)."""
    traces = rollout_round(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size, max_steps=max_steps)
    out: dict[str, list[bool]] = {t.task_id: [] for t in tasks}
    for t in traces:
        out[t.task_id].append(bool(t.passed))
    return out


def routed_pass_rate(aegis: AEGIS, tasks: Sequence[Task], policy: Policy, env: Env, *, attempts: int = 1,
                     batch_size: int = 32, max_steps: int = 32) -> float:
    """pass@``attempts`` of the routed variants on ``tasks``."""
    outcomes = routed_outcomes(aegis, tasks, policy, env, attempts=attempts, batch_size=batch_size,
                               max_steps=max_steps)
    return sum(any(o) for o in outcomes.values()) / len(outcomes) if outcomes else 0.0
