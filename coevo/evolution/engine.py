"""AEGIS: one evolution step over a round's traces (Digester → Planner → Evolver → Critic).

The loop (or ``coevo evolve``) rolls out a batch on the variants ``assign`` picked, then calls
``evolve`` with the traces. Per variant: the traces are digested, the meta-agent proposes typed
edits, each is built and judged by the Critic (quality gate first, revisions on its reason, then a
re-run under the seesaw and/or performance gate); the first proposal that ships becomes the
variant's harness and joins the snapshot pool. A proposal rejected only because it broke some
tasks while fixing others becomes a new variant when a slot is free (variant isolation). At epoch
end ``select`` keeps, per variant, the best snapshot on the validation split.

Everything a resumed run needs is in ``state_dict`` (plain JSON-able data).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coevo.agent.trace import Trace
from coevo.envs.base import Task
from coevo.evolution.critic import Critic, RecentBatch, pass_rate
from coevo.evolution.digest import digest as make_digest
from coevo.evolution.monitors import Monitors
from coevo.evolution.pool import Patience, SnapshotPool
from coevo.evolution.reference import reference_demo
from coevo.evolution.types import Digest, Proposal, Verdict
from coevo.evolution.variants import BASE, LessonStore, RouteFn, VariantSet
from coevo.harness.harness import Harness
from coevo.meta.base import MetaAgent, PlanContext

log = logging.getLogger("coevo.evolution")


@dataclass
class EvolveReport:
    """What one ``evolve`` call did, for the round table, W&B and the run directory."""

    round: int
    digests: list[Digest] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    shipped: list[str] = field(default_factory=list)  # candidate ids that became a variant's harness
    spawned: list[str] = field(default_factory=list)  # new variant names
    warnings: list[str] = field(default_factory=list)
    stopped: str | None = None  # which patience ran out, when the search is over
    seconds: dict[str, float] = field(default_factory=dict)  # digest / plan / critic

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "digests": [d.to_dict() for d in self.digests],
            "verdicts": [v.to_dict() for v in self.verdicts],
            "shipped": self.shipped,
            "spawned": self.spawned,
            "warnings": self.warnings,
            "stopped": self.stopped,
            "seconds": self.seconds,
        }


class AEGIS:
    """The harness-evolution engine. Flat arguments:

    ``tasks``: every train task by id (the Critic re-runs from these; ground truth feeds only the
    quality gate and the references); ``references``: task id → reference trajectory (first
    divergence and few-shot demos); ``tools``: tool names the env offers; ``max_variants`` K;
    ``max_proposals`` per variant per round; ``max_revisions`` T_rev; ``recent_batches`` R kept
    for the performance gate; ``patience``: stop the search after that many rounds without a
    shipped edit (None: never); ``router``/``router_threshold``: optional OO-style routing;
    ``lesson_cap``: size of the design and routing lesson stores.
    """

    def __init__(
        self,
        base: Harness,
        meta: MetaAgent,
        critic: Critic,
        *,
        tasks: Mapping[str, Task],
        references: Mapping[str, Trace] | None = None,
        tools: Sequence[str] = (),
        max_variants: int = 1,
        max_proposals: int = 2,
        max_revisions: int = 2,
        recent_batches: int = 2,
        patience: Patience | None = None,
        router: RouteFn | None = None,
        router_threshold: float = 0.5,
        lesson_cap: int = 20,
        monitors: Monitors | None = None,
    ) -> None:
        self.meta, self.critic = meta, critic
        self.tasks = dict(tasks)
        self.references = dict(references or {})
        self.tools = list(tools)
        self.variants = VariantSet(base, max_variants=max_variants)
        self.max_proposals, self.max_revisions, self.recent_batches = max_proposals, max_revisions, recent_batches
        self.patience = patience
        self.router, self.router_threshold = router, router_threshold
        self.pool = SnapshotPool()
        self.pool.add(base, round=-1, variant=BASE, score=0.0, verdict="starting harness")
        self.monitors = monitors or Monitors()
        self.design_lessons = LessonStore(lesson_cap)
        self.routing_lessons = LessonStore(lesson_cap)
        self.rejected: dict[str, set[str]] = defaultdict(set)  # variant -> Proposal.key()
        self.recent: dict[str, list[tuple[list[str], float]]] = defaultdict(list)  # variant -> (task ids, score)
        self.notes: dict[str, str] = {}  # task id -> what its last base trajectory did (for the router)
        self.history: list[dict[str, Any]] = []  # every verdict, as dicts

    # ------------------------------------------------------------------ routing
    def harness(self, variant: str = BASE) -> Harness:
        return self.variants.harnesses[variant]

    def assign(self, tasks: Sequence[Task]) -> dict[str, str]:
        """task id → the variant it runs on this round."""
        return self.variants.assign(tasks, router=self.router, threshold=self.router_threshold,
                                    lessons=self.routing_lessons.items, notes=self.notes)

    # ------------------------------------------------------------------ one round
    def evolve(self, traces: Sequence[Trace], *, round: int) -> EvolveReport:
        """Digest, propose, judge and ship, per variant, from this round's traces."""
        report = EvolveReport(round=round)
        by_variant: dict[str, list[Trace]] = defaultdict(list)
        for t in traces:
            by_variant[t.variant].append(t)
        unknown = sorted(set(by_variant) - set(self.variants.names()))
        if unknown:
            raise ValueError(f"traces from unknown variants {unknown}; known: {self.variants.names()}")
        self._learn_routing(traces)
        stopped = self.patience.exhausted if self.patience is not None else None
        for variant, vtraces in by_variant.items():
            outcomes: dict[str, list[bool]] = defaultdict(list)
            for t in vtraces:
                outcomes[t.task_id].append(bool(t.passed))
            self.variants.record(variant, outcomes)
            start = time.perf_counter()
            dig = make_digest(vtraces, round=round, variant=variant, references=self.references)
            report.seconds["digest"] = report.seconds.get("digest", 0.0) + time.perf_counter() - start
            report.digests.append(dig)
            if variant == BASE:
                self.notes.update({tid: "passed" for tid in dig.passed_task_ids})
                for c in dig.clusters:
                    self.notes.update({tid: f"failed: {c.cause}" for tid in c.task_ids})
            if stopped is None and dig.n_failed:
                self._evolve_variant(variant, dig, dict(outcomes), report)
            self._remember_batch(variant, dict(outcomes))
            shipped = next((v for v in report.verdicts if v.ship and v.variant == variant), None)
            alerts = self.monitors.observe_round(
                round, train_pass_rate=sum(t.passed for t in vtraces) / len(vtraces),
                harness_id=self.variants.harnesses[variant].id, outcomes=dict(outcomes),
                shipped_dimension=shipped.proposal.dimension if shipped else None)
            report.warnings += [a.message for a in alerts]
        if self.patience is not None:
            shipped = bool(report.shipped or report.spawned)
            report.stopped = self.patience.update(round_shipped=shipped, batch_accepted=shipped)
        return report

    def _evolve_variant(self, variant: str, dig: Digest, before: dict[str, list[bool]], report: EvolveReport) -> None:
        parent = self.variants.harnesses[variant]
        context = PlanContext(
            round=report.round, variant=variant, priorities=self.monitors.priorities(),
            rejected=set(self.rejected[variant]), demos=self._demos(exclude=set(before)), tools=self.tools,
            lessons=list(self.design_lessons.items), max_proposals=self.max_proposals,
        )
        start = time.perf_counter()
        proposals = self.meta.propose(dig, parent, context)[: self.max_proposals]
        report.seconds["plan"] = report.seconds.get("plan", 0.0) + time.perf_counter() - start
        tasks = {tid: self.tasks[tid] for tid in before}
        recent = [RecentBatch([self.tasks[t] for t in ids], score) for ids, score in self.recent[variant]]
        for proposal in proposals:
            proposal.variant = variant
            verdict, candidate = self._judge_with_revisions(proposal, parent, dig, context, before, tasks, recent, report)
            self._record_verdict(verdict, parent, report)
            if verdict.ship and candidate is not None:
                self.variants.harnesses[variant] = candidate
                self.variants.record(variant, verdict.after)
                self.pool.add(candidate, round=report.round, variant=variant, score=pass_rate(verdict.after))
                report.shipped.append(candidate.id)
                return
            if (candidate is not None and verdict.fail_to_pass and verdict.pass_to_fail
                    and self.variants.can_spawn()):
                name = self.variants.spawn(candidate, {t: verdict.after[t] for t in verdict.fail_to_pass})
                self.pool.add(candidate, round=report.round, variant=name, score=pass_rate(verdict.after))
                report.spawned.append(name)
                verdict.reason += f"; kept as variant {name} for {', '.join(verdict.fail_to_pass)}"

    def _judge_with_revisions(self, proposal: Proposal, parent: Harness, dig: Digest, context: PlanContext,
                              before: dict[str, list[bool]], tasks: dict[str, Task], recent: list[RecentBatch],
                              report: EvolveReport) -> tuple[Verdict, Harness | None]:
        """Build and quality rejections go back to the meta-agent, up to ``max_revisions`` times."""
        while True:
            start = time.perf_counter()
            verdict, candidate = self.critic.judge(proposal, parent, before=before, tasks=tasks, recent=recent,
                                                   allowed=[q for q, _ in context.demos], round=report.round)
            report.seconds["critic"] = report.seconds.get("critic", 0.0) + time.perf_counter() - start
            if verdict.gate not in ("build", "quality") or proposal.revision >= self.max_revisions:
                return verdict, candidate
            self._record_verdict(verdict, parent, report)
            reason = verdict.reason
            if verdict.quality is not None and verdict.quality.leaked:
                reason += "\nleaked: " + " | ".join(verdict.quality.leaked)
            revised = self.meta.revise(proposal, reason, dig, parent, context)
            if revised is None:
                return verdict, candidate
            revised.variant, revised.revision = proposal.variant, proposal.revision + 1
            proposal = revised

    def _record_verdict(self, verdict: Verdict, parent: Harness, report: EvolveReport) -> None:
        report.verdicts.append(verdict)
        self.history.append(verdict.to_dict())
        if not verdict.ship:
            self.rejected[verdict.variant].add(verdict.proposal.key())
        report.warnings += [a.message for a in self.monitors.observe_verdict(verdict, harness_before=parent)]
        edits = ", ".join(e.describe() for e in verdict.proposal.edits)
        outcome = "shipped" if verdict.ship else f"rejected by {verdict.gate}"
        self.design_lessons.add(f"{edits} for {verdict.proposal.cluster or 'scope'}: {outcome} ({verdict.reason[:120]})")

    def _remember_batch(self, variant: str, outcomes: dict[str, list[bool]]) -> None:
        self.recent[variant].append((sorted(outcomes), pass_rate(outcomes)))
        del self.recent[variant][: max(0, len(self.recent[variant]) - self.recent_batches)]

    def _learn_routing(self, traces: Sequence[Trace]) -> None:
        for t in traces:
            if t.variant != BASE and not t.passed and (self.variants.rate(BASE, t.task_id) or 0.0) > 0:
                text = " ".join(self.tasks[t.task_id].instruction.split()[:12]) if t.task_id in self.tasks else t.task_id
                self.routing_lessons.add(f"'{text}...' failed on {t.variant} but has passed on base")

    def _demos(self, exclude: set[str], limit: int = 2) -> list[tuple[str, str]]:
        """Worked demonstrations from references of tasks the Critic will not judge this round."""
        return [reference_demo(self.references[tid]) for tid in sorted(self.references) if tid not in exclude][:limit]

    # ------------------------------------------------------------------ epoch end
    def select(self, evaluate: Callable[[Harness], float]) -> dict[str, str]:
        """Per variant, the best of its current harness and its pool snapshots on validation
        (``evaluate`` returns a pass rate) becomes current. Returns variant → chosen harness id."""
        chosen, best_scores = {}, []
        for variant in list(self.variants.harnesses):
            scores = {s.harness_id: evaluate(s.harness) for s in self.pool.of_variant(variant)}
            best = self.pool.best(scores, variant=variant)
            self.variants.harnesses[variant] = best.harness
            chosen[variant] = best.harness_id
            best_scores.append(scores[best.harness_id])
        if self.patience is not None:
            self.patience.update(epoch_score=max(best_scores))
        return chosen

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "variants": self.variants.to_dict(),
            "pool": self.pool.to_dict(),
            "patience": self.patience.to_dict() if self.patience is not None else None,
            "monitors": self.monitors.state_dict(),
            "design_lessons": self.design_lessons.to_dict(),
            "routing_lessons": self.routing_lessons.to_dict(),
            "rejected": {v: sorted(keys) for v, keys in self.rejected.items()},
            "recent": {v: [[ids, s] for ids, s in items] for v, items in self.recent.items()},
            "notes": dict(self.notes),
            "history": list(self.history),
            "meta": self.meta.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.variants = VariantSet.from_dict(state["variants"])
        self.pool = SnapshotPool.from_dict(state["pool"])
        if state["patience"] is not None:
            self.patience = Patience.from_dict(state["patience"])
        self.monitors.load_state_dict(state["monitors"])
        self.design_lessons = LessonStore.from_dict(state["design_lessons"])
        self.routing_lessons = LessonStore.from_dict(state["routing_lessons"])
        self.rejected = defaultdict(set, {v: set(keys) for v, keys in state["rejected"].items()})
        self.recent = defaultdict(list, {v: [(list(ids), float(s)) for ids, s in items]
                                         for v, items in state["recent"].items()})
        self.notes = dict(state["notes"])
        self.history = list(state["history"])
        self.meta.load_state_dict(state["meta"])
