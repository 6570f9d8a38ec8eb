"""The Critic: a quality gate on the edit's text, then a re-run of the candidate and the seesaw
and/or performance gate on what happened.

The order matters for cost: leakage and bloat are checked on the proposal alone, so a proposal
that quotes an answer never costs a rollout; its reason goes back to the Planner for revision.
Only a clean proposal is re-run, on the tasks it claims (its scope) plus every task that passed
before — the tasks it could break — with ``k`` attempts each, so pass@k is compared per task.

Rollouts are injected as a function (``Rollout``), which keeps this module free of models and
environments and lets the tests drive it with exact outcomes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from coevo.envs.base import Task
from coevo.evolution import gates
from coevo.evolution.evolver import BuildError, build_candidate
from coevo.evolution.types import Proposal, QualityReport, Verdict
from coevo.harness.harness import Harness

log = logging.getLogger("coevo.evolution")

Rollout = Callable[[Harness, Sequence[Task], int], dict[str, list[bool]]]
"""(harness, tasks, k) → task id → the outcomes of k attempts."""

GATES = ("seesaw", "performance", "both")


@dataclass
class RecentBatch:
    """A batch judged in an earlier round, kept for the performance gate's degradation check."""

    tasks: list[Task]
    score: float  # pass@k rate of the current harness on it when it was recorded


@dataclass
class Critic:
    """Judges proposals for one variant. Flat hyper-parameters:

    ``k`` attempts per task (pass@k; 2 in HarnessX); ``gate`` in GATES; ``eta_leak``/``eta_bloat``
    the quality thresholds; ``delta`` the improvement the performance gate needs on the current
    batch and ``epsilon`` the degradation it tolerates on each of the recent batches.
    """

    rollout: Rollout
    k: int = 2
    gate: str = "seesaw"
    eta_leak: float = gates.ETA_LEAK
    eta_bloat: float = gates.ETA_BLOAT
    delta: float = 0.0
    epsilon: float = 0.0
    reruns: int = field(default=0, init=False)  # episodes the critic has run (cost accounting)

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    def quality(self, proposal: Proposal, parent: Harness, tasks: Mapping[str, Task],
                failed: Sequence[str], allowed: Sequence[str] = ()) -> QualityReport:
        """Leakage against the answers of every task the candidate will be judged on and the texts
        of the failed tasks; bloat of what the edits inject. ``allowed``: texts an edit may quote
        (the demonstrations' own questions), whose shared phrasing is the env's template."""
        answers = {tid: str(t.answer) for tid, t in tasks.items()}
        texts = {tid: tasks[tid].instruction for tid in failed if tid in tasks}
        return gates.quality_gate(proposal.edits, parent, answers, texts, eta_leak=self.eta_leak,
                                  eta_bloat=self.eta_bloat, allowed=allowed)

    def judge(
        self,
        proposal: Proposal,
        parent: Harness,
        *,
        before: Mapping[str, Sequence[bool]],
        tasks: Mapping[str, Task],
        recent: Sequence[RecentBatch] = (),
        allowed: Sequence[str] = (),
        round: int = 0,
    ) -> tuple[Verdict, Harness | None]:
        """Build, gate and re-run ``proposal`` against ``parent``; returns the verdict and the
        candidate harness (None when it did not build).

        ``before``: outcomes of the parent on this round's batch (task id → k attempts);
        ``tasks``: those tasks by id. The re-run covers the proposal's target tasks that are in
        the batch plus every task that passed before. ``allowed``: see ``quality``.
        """
        verdict = Verdict(proposal=proposal, parent_id=parent.id, candidate_id=None, variant=proposal.variant,
                          ship=False, reason="", round=round)
        try:
            candidate = build_candidate(parent, proposal)
        except BuildError as err:
            verdict.gate, verdict.reason = "build", str(err)
            return verdict, None
        verdict.candidate_id = candidate.id
        passed_before = [tid for tid, outs in before.items() if any(outs)]
        failed_before = [tid for tid, outs in before.items() if not any(outs)]
        scope = [tid for tid in proposal.target_tasks if tid in before] or failed_before
        evaluated = sorted(set(scope) | set(passed_before))
        verdict.quality = self.quality(proposal, parent, {tid: tasks[tid] for tid in evaluated}, failed_before,
                                       allowed)
        if not verdict.quality.passed:
            verdict.gate, verdict.reason = "quality", verdict.quality.reason
            return verdict, candidate

        after = self._run(candidate, [tasks[tid] for tid in evaluated])
        verdict.before = {tid: list(before[tid]) for tid in evaluated}
        verdict.after = after
        seesaw = gates.seesaw_gate(verdict.before, after, scope=scope)
        verdict.fail_to_pass, verdict.pass_to_fail = seesaw.fail_to_pass, seesaw.pass_to_fail
        performance = self._performance(candidate, before, after, recent) if self.gate != "seesaw" else None
        decision = gates.combine(self.gate, seesaw=seesaw, performance=performance)
        verdict.ship, verdict.gate, verdict.reason = decision.ship, decision.gate, decision.reason
        log.info("critic %s %s: %s", "ships" if verdict.ship else "rejects", candidate.id, verdict.reason)
        return verdict, candidate

    def _run(self, harness: Harness, tasks: Sequence[Task]) -> dict[str, list[bool]]:
        if not tasks:
            return {}
        self.reruns += len(tasks) * self.k
        out = self.rollout(harness, tasks, self.k)
        missing = [t.task_id for t in tasks if t.task_id not in out]
        if missing:
            raise RuntimeError(f"rollout returned no outcomes for tasks {missing}")
        return {t.task_id: list(out[t.task_id]) for t in tasks}

    def _performance(self, candidate: Harness, before: Mapping[str, Sequence[bool]],
                     after: Mapping[str, Sequence[bool]], recent: Sequence[RecentBatch]) -> gates.PerformanceResult:
        """Current batch: tasks not re-run (failed before and outside scope) keep their outcomes."""
        merged = {tid: list(after.get(tid, outs)) for tid, outs in before.items()}
        cur_before = pass_rate(before)
        cur_after = pass_rate(merged)
        recent_after = [pass_rate(self._run(candidate, b.tasks)) for b in recent]
        return gates.performance_gate(cur_before, cur_after, [b.score for b in recent], recent_after,
                                      delta=self.delta, epsilon=self.epsilon)


def pass_rate(outcomes: Mapping[str, Sequence[bool]]) -> float:
    """pass@k rate: the share of tasks with at least one passing attempt."""
    return sum(any(v) for v in outcomes.values()) / len(outcomes) if outcomes else 0.0
