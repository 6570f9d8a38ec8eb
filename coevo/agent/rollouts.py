"""The rollout service: ``(harness, tasks, attempts, phase) → traces + per-task outcomes``.

Every caller that runs episodes of a list of tasks goes through ``RolloutService.run``: the loop's
rollouts, validation, test and snapshot selection, the Critic's re-runs (``critic_rollout``),
``coevo eval``, the stream protocols and policy references. It holds what those calls share (the
policy, the env, the batching and step limits, the run seed, a progress display), so a caller
names only what differs: the harness (one, or one per task: the variant AEGIS routed it to), the
tasks, the attempts, and the sampling phase.

Sampling phases: a seeded policy is reseeded from (run seed, round, phase) before a call that
names a phase, so rollouts, validation and test of a round draw from streams of their own and a
resumed run samples what the killed one did. A call without a phase (the Critic's re-runs within
a round) goes on from where the policy's generator is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from coevo.agent.episode import RESET_TIMEOUT_S, TOOL_TIMEOUT_S
from coevo.agent.outcomes import pass_rates, task_outcomes
from coevo.agent.policy import Policy
from coevo.agent.runtime import run_attempts
from coevo.agent.trace import Trace
from coevo.envs.base import Env, Task
from coevo.harness.harness import Harness
from coevo.rundir.records import InfraFailures
from coevo.safety.secrets import secret_env_values
from coevo.safety.traces import redact_trace

PHASES = {"rollout": 0, "critic": 1, "eval": 2, "test": 3, "extra": 4, "unscaffolded": 5}
"""Policy sampling streams within a round (see ``phase_seed``)."""


def phase_seed(seed: int, round: int, phase: str) -> int:
    """A distinct, reproducible sampling seed per (run seed, round, phase); round -1 is the run's start."""
    return seed * 1_000_003 + round * 1_009 + PHASES[phase] * 100_003


def tool_use_rate(traces: Sequence[Trace]) -> float:
    """Share of episodes that called at least one tool themselves (a processor answering in the
    tool's place does not count): the behaviour harness demos and GRPO are expected to raise."""
    return sum(any(not c.blocked for c in t.tool_calls) for t in traces) / len(traces) if traces else 0.0


def trace_tokens(traces: Sequence[Trace]) -> int:
    """Prompt + completion tokens of ``traces`` (what their episodes cost)."""
    return int(sum(t.cost.get("prompt_tokens", 0) + t.cost.get("completion_tokens", 0) for t in traces))


def infra_failures(traces: Sequence[Trace]) -> InfraFailures:
    """The round's infrastructure failures: how many, by source (policy, env, tool), and which
    traces. They stay in ``train`` (as failed attempts) but no GRPO group or failure cluster
    holds them, so a round that lost many episodes to the machine says so here."""
    bad = [t for t in traces if t.infra_failure]
    by_source: dict[str, int] = defaultdict(int)
    for t in bad:
        by_source[str(t.error_source)] += 1
    return InfraFailures(len(bad), dict(sorted(by_source.items())), [t.trace_id for t in bad])


@dataclass
class Rollout:
    """The episodes of one ``run`` call: ``traces`` task by task, attempt by attempt."""

    traces: list[Trace]
    task_ids: list[str]
    attempts: int

    def outcomes(self, infra: str = "fail") -> dict[str, list[bool | None]]:
        """task id → pass/fail per attempt (``coevo.agent.outcomes.task_outcomes``: an infrastructure
        failure counts as a failed attempt, as None with ``infra="none"``, or not at all)."""
        return task_outcomes(self.traces, self.task_ids, infra=infra)

    @cached_property
    def _rates(self) -> tuple[float, float]:
        return pass_rates(self.outcomes())

    @property
    def pass_at_1(self) -> float:
        return self._rates[0]

    @property
    def pass_at_k(self) -> float:
        return self._rates[1]

    @property
    def tool_use_rate(self) -> float:
        return tool_use_rate(self.traces)


class RolloutService:
    """Runs episodes with one policy on one env. ``batch_size``/``max_steps``/``workers`` and the
    timeouts: as in ``coevo.agent.runtime.run_episodes`` (``rollout.*`` of the config); ``seed``:
    the run seed the phases derive from; ``progress``: anything with ``task(description, total)``
    returning a context that yields an ``advance()`` (``coevo.report.progress``), None for no display.

    Every trace it returns is cleared of the secret values in the environment
    (``coevo.safety.traces.redact_trace``): strings, and token ids with ``tokenizer`` (default: the
    policy's; without one, a model call that showed a secret keeps no token ids), so nothing downstream (the
    buffer, AEGIS, records, the tracker) holds a secret it did not write itself."""

    def __init__(self, policy: Policy, env: Env, *, batch_size: int, max_steps: int, workers: int, seed: int,
                 progress: Any | None = None, reset_timeout_s: float = RESET_TIMEOUT_S,
                 tool_timeout_s: float = TOOL_TIMEOUT_S, tokenizer: Any | None = None) -> None:
        self.policy, self.env, self.seed, self.progress = policy, env, seed, progress
        if progress is not None:  # a long model call says how far it is
            policy.on_progress = progress.message
        self.batch_size, self.max_steps, self.workers = batch_size, max_steps, workers
        self.timeouts = {"reset_timeout_s": reset_timeout_s, "tool_timeout_s": tool_timeout_s}
        self.tokenizer = tokenizer if tokenizer is not None else policy.tokenizer
        self._critic_round, self._critic_calls = 0, 0
        self._critic_traces: list[Trace] = []  # the re-runs since the last begin_critic

    def reseed(self, round: int, phase: str) -> None:
        self.policy.reseed(phase_seed(self.seed, round, phase))

    def run(self, harness: Harness | Sequence[Harness], tasks: Sequence[Task], *, attempts: int,
            phase: str | None, round: int = 0, variant: str | Sequence[str] = "base", label: str = "episodes",
            trace_id: Callable[[Task, int], str] | None = None,
            on_trace: Callable[[Trace], None] | None = None) -> Rollout:
        """``attempts`` episodes of every task on ``harness`` (one, or one per task with ``variant``
        parallel to it); the policy reseeded for (``round``, ``phase``) first unless ``phase`` is None.
        ``label`` names the progress bar; ``trace_id(task, attempt)`` each trace; ``on_trace`` gets
        each trace as its episode ends (from the worker threads)."""
        if phase is not None:
            self.reseed(round, phase)
        bar = self.progress.task(label, len(tasks) * attempts) if self.progress is not None else nullcontext(None)
        with bar as advance:
            def finished(trace: Trace) -> None:
                if on_trace is not None:
                    on_trace(trace)
                if advance is not None:
                    advance()

            groups = run_attempts(tasks, harness, self.policy, self.env, attempts=attempts, variant=variant,
                                  trace_id=trace_id, batch_size=self.batch_size, workers=self.workers,
                                  max_steps=self.max_steps, on_trace=finished, **self.timeouts)
        secrets = secret_env_values()
        traces = [t for group in groups for t in group]
        if secrets:
            traces = [redact_trace(t, self.tokenizer, secrets) for t in traces]
        return Rollout(traces, [t.task_id for t in tasks], attempts)

    def begin_critic(self, round: int) -> None:
        """Seed round ``round``'s critic phase (once: its re-runs go on from there), restart the
        numbering of its traces (``critic<round>-<call>-<task>-<attempt>``, unique within the run) and
        forget the previous round's re-runs."""
        self.reseed(round, "critic")
        self._critic_round, self._critic_calls, self._critic_traces = round, 0, []

    def critic_traces(self) -> list[Trace]:
        """Every re-run's traces since ``begin_critic`` (parent and candidate, shipped or rejected):
        the loop turns the gate's evidence into GRPO groups."""
        return list(self._critic_traces)

    def critic_rollout(self) -> Callable[[Harness, Sequence[Task], int], dict[str, list[bool | None]]]:
        """The Critic's re-run (``coevo.evolution.critic.Rollout``): ``k`` episodes per task on one
        harness → task id → outcomes, None for an episode that ended in an infrastructure failure
        (no evidence about the harness). No reseeding: the loop seeds the round's critic phase once
        (``begin_critic``); the traces stay here until the next one (``critic_traces``)."""

        def rerun(harness: Harness, tasks: Sequence[Task], k: int) -> dict[str, list[bool | None]]:
            r, call = self._critic_round, self._critic_calls
            self._critic_calls = call + 1
            done = self.run(harness, tasks, attempts=k, phase=None, variant="critic",
                            label=f"critic: re-run {harness.id[:8]}",
                            trace_id=lambda t, a: f"critic{r:04d}-{call:03d}-{t.task_id}-{a}")
            self._critic_traces.extend(done.traces)
            return done.outcomes(infra="none")

        return rerun
