"""How long a run will take: an estimate at the start and the time left after each round.

At the start the only measured cost is the start evaluation's seconds per episode; every phase is
counted in episodes' worth of that: a rollout or a Critic re-run is an episode, a GRPO step costs
``GRPO_TRACE_COST`` episodes per trace it trains (forward and backward over the trace against the
sampler's decoding of it; measured on the main job, docs/PERF.md). After a round the measured
phase times replace the guess: each phase's mean over the rounds so far (the Critic's over the
rounds that evolved) times the rounds left that run it, plus the final evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coevo.report.progress import duration
from coevo.rundir.records import RoundRecord, StartRecord

GRPO_TRACE_COST = 1.4
"""Seconds of a GRPO step per trace it trains, in units of an evaluation episode's seconds (main job:
18 s a step of 24 traces against 0.54 s an evaluation episode)."""


@dataclass(frozen=True)
class RunShape:
    """What the rounds of a run do, in units the estimate prices."""

    first: int  # the first round (0, or the round a resumed run starts from)
    end: int  # one past the last round
    rollout_episodes: int  # a round's rollouts: batch tasks x attempts
    critic_episodes: int  # the Critic's re-runs in a round that evolves, at most
    evolves: Callable[[int], bool]  # does round r evolve the harness
    grpo_steps: int  # optimizer steps a round (0: the weights are frozen)
    step_traces: int  # traces a step trains
    eval_episodes: int  # the last round's evaluation (validation and test)


def start_estimate(shape: RunShape, episode_s: float) -> dict[str, float]:
    """Seconds per phase of the rounds ahead, priced at ``episode_s`` an episode."""
    rounds = range(shape.first, shape.end)
    return {
        "rollouts": len(rounds) * shape.rollout_episodes * episode_s,
        "Critic": sum(shape.evolves(r) for r in rounds) * shape.critic_episodes * episode_s,
        "GRPO": len(rounds) * shape.grpo_steps * shape.step_traces * GRPO_TRACE_COST * episode_s,
        "evaluation": shape.eval_episodes * episode_s,
    }


def start_line(shape: RunShape, episode_s: float) -> str:
    """One line: the estimated time of the rounds ahead, by phase, and what it is priced from."""
    phases = start_estimate(shape, episode_s)
    parts = ", ".join(f"{name} {duration(s)}" for name, s in phases.items() if s > 0)
    return (f"estimate: the {shape.end - shape.first} round(s) ahead take ~{duration(sum(phases.values()))} "
            f"({parts}; the Critic's at most), priced from the start evaluation's {episode_s:.2f} s an episode")


def seconds_left(records: Sequence[RoundRecord], shape: RunShape, eval_s: float) -> float:
    """Seconds the rounds after ``records[-1]`` should take, from the phase times measured so far;
    ``eval_s``: the final evaluation's seconds (the start evaluation measured it)."""
    done = records[-1].round + 1
    left = range(done, shape.end)
    if not left:
        return 0.0

    def mean(key: str, rows: Sequence[RoundRecord]) -> float:
        return sum(r.seconds.get(key, 0.0) for r in rows) / len(rows) if rows else 0.0

    evolved = [r for r in records if r.evolve is not None]
    per_round = sum(mean(k, records) for k in ("rollout", "logprobs", "grpo", "checkpoint", "other"))
    critic = sum(mean(k, evolved) for k in ("digest", "plan", "critic"))
    return len(left) * per_round + sum(shape.evolves(r) for r in left) * critic + eval_s


def time_left_line(records: Sequence[RoundRecord], shape: RunShape, start: StartRecord | None) -> str:
    """After a round: what it took and about how long the rest will (the final evaluation priced at
    the start evaluation's time), with the clock time it should end."""
    left = seconds_left(records, shape, start.seconds if start is not None else 0.0)
    ends = time.strftime("%H:%M", time.localtime(time.time() + left))
    return (f"round {records[-1].round} took {duration(records[-1].seconds['total'])}; "
            f"about {duration(left)} left (ends ~{ends})")
