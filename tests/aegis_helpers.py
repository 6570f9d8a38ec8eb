"""Rollouts around AEGIS for tests that exercise the engine without the whole loop: the
``RolloutService`` the loop uses, with the short step limit the scripted test envs need."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coevo.agent.rollouts import RolloutService
from coevo.agent.trace import Trace
from coevo.envs.base import Task
from coevo.evolution.engine import AEGIS
from coevo.rundir.evolve_records import EvolveReport


def service(policy: Any, env: Any, *, max_steps: int = 6, batch_size: int = 32, workers: int = 8,
            seed: int = 0) -> RolloutService:
    return RolloutService(policy, env, batch_size=batch_size, max_steps=max_steps, workers=workers, seed=seed)


def critic_rollout(policy: Any, env: Any, **limits: Any) -> Any:
    """The Critic's re-run over ``policy`` on ``env`` (``RolloutService.critic_rollout``)."""
    return service(policy, env, **limits).critic_rollout()


def evolve_round(aegis: AEGIS, tasks: Sequence[Task], policy: Any, env: Any, *, round: int, attempts: int = 1,
                 **limits: Any) -> tuple[list[Trace], EvolveReport]:
    """One attempt-by-attempt rollout of ``tasks`` on their routed variants, then ``aegis.evolve``."""
    harnesses, variants = aegis.routed(tasks)
    traces = service(policy, env, **limits).run(harnesses, tasks, attempts=attempts, phase=None,
                                                variant=variants).traces
    return traces, aegis.evolve(traces, round=round)[0]


def routed_pass_rate(aegis: AEGIS, tasks: Sequence[Task], policy: Any, env: Any, *, attempts: int = 1,
                     **limits: Any) -> float:
    """pass@``attempts`` of the routed variants on ``tasks``."""
    harnesses, variants = aegis.routed(tasks)
    return service(policy, env, **limits).run(harnesses, tasks, attempts=attempts, phase=None,
                                              variant=variants).pass_at_k
