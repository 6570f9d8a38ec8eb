"""AEGIS: one evolution step over a round's traces (Digester → Planner → Evolver → Critic).

The loop (or ``coevo evolve``) rolls out a batch on the variants ``assign`` picked, then calls
``evolve`` with the traces. Per variant: the traces are digested, the meta-agent proposes typed
edits, each is built and judged by the Critic (quality gate first, revisions on its reason, then a
re-run under the statistical, seesaw and/or performance gate); the first proposal that ships
becomes the variant's harness and joins the snapshot pool. A proposal rejected only because it
broke some tasks while fixing others becomes a new variant when a slot is free (variant
isolation). A proposal the statistical gate leaves undecided is kept and judged again, first, in
the variant's next round while its parent is still the variant's harness (the Critic pools its
paired attempts); it is never added to the rejected set. At epoch end ``select`` keeps, per
variant, the best snapshot on the validation split.

The meta-agent is the one part outside the run's control (an endpoint, a model, a class of the
user's own): when a call to it fails, the variant goes without that round's proposals (or a
rejected proposal without its revision), the failure is one of the round's ``warnings``, and the
run goes on.

What happened to the harnesses comes back as ``HarnessEvent``s (``start_events``, ``evolve`` beside its
report, ``select``, ``release``): callers record lineage from them and read the engine only through its
methods (``current``, ``meta_tokens``). Rates measured outside the engine (a round's train and
validation pass rates) come back in through ``observe_rates``, so the reward-hacking monitor (train up,
validation down) sees every validation the caller runs.

Everything a resumed run needs is in ``state_dict`` (plain JSON-able data).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from coevo.agent.outcomes import pass_at_k
from coevo.agent.trace import Trace
from coevo.config.schema import EvolutionConfig
from coevo.envs.base import Task
from coevo.evolution.critic import Critic, RecentBatch, judged_per_weights
from coevo.evolution.digest import digest as make_digest
from coevo.evolution.digest import scaffold_evidence
from coevo.evolution.meta_agent import MetaAgent, MetaAgentError, PlanContext, demo_question, shown_questions
from coevo.evolution.monitors import Monitors
from coevo.evolution.pool import Patience, SnapshotPool
from coevo.evolution.reference import fresh_demos
from coevo.evolution.types import HarnessEvent
from coevo.evolution.variants import BASE, LessonStore, RouteFn, VariantSet
from coevo.harness.edit_record import edits_key
from coevo.harness.harness import Harness
from coevo.harness.scaffold import outer_scaffold, retire_outer_scaffold
from coevo.rundir.evolve_records import Digest, EvolveReport, Proposal, Verdict

log = logging.getLogger("coevo.evolution")

T = TypeVar("T")

# AEGIS's constants (no config field: a run does not tune them).
MAX_REVISIONS = 2
"""Revisions of a proposal the build or quality gate rejected, each on the gate's reason (T_rev)."""
RECENT_BATCHES = 2
"""Recent batches a variant keeps for the performance gate's degradation check (R)."""
ROUTER_THRESHOLD = 0.5
"""Router confidence below which a task goes to the base variant."""
LESSON_CAP = 20
"""Lessons each of the design and routing lesson stores keeps."""


class AEGIS:
    """The harness-evolution engine. Flat arguments:

    ``tasks``: every train task by id (the Critic re-runs from these; ground truth feeds only the
    quality gate and the references); ``references``: task id → reference trajectory (first
    divergence and few-shot demos); ``tools``: tool names the env offers; ``max_variants`` K;
    ``max_proposals`` per variant per round; ``patience``: when the search stops (its rounds level:
    that many rounds without a shipped edit; None: never); ``router``: optional OO-style routing
    (confidence below ``ROUTER_THRESHOLD`` goes to the base variant); ``critic_pool``: train tasks the
    Critic may judge an edit on besides the batch (the statistical gate widens its sample with
    them; tasks whose references may serve as demonstrations are left out), None for none.
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
        max_variants: int = EvolutionConfig.max_variants,  # defaults: the schema's, stated there only
        max_proposals: int = EvolutionConfig.max_proposals,
        patience: Patience | None = None,
        router: RouteFn | None = None,
        critic_pool: Mapping[str, Task] | None = None, inert: frozenset[str] = frozenset(),
    ) -> None:
        self.meta, self.critic, self.tasks = meta, critic, dict(tasks)
        self.critic_pool, self.references, self.tools = dict(critic_pool or {}), dict(references or {}), list(tools)
        self.variants = VariantSet(base, max_variants=max_variants)
        self.max_proposals, self.patience, self.router, self.inert = max_proposals, patience, router, inert
        self.pool = SnapshotPool()
        self.pool.add(base, round=-1, variant=BASE, score=0.0, verdict="starting harness")
        self.monitors = Monitors()
        self.design_lessons, self.routing_lessons = LessonStore(LESSON_CAP), LessonStore(LESSON_CAP)
        self.rejected: dict[str, set[str]] = defaultdict(set)  # variant -> Proposal.key()
        self.spent_demos: set[str] = set()  # task texts of demonstrations a rejected edit showed
        self.undecided: dict[str, list[tuple[str, Proposal]]] = defaultdict(list)  # variant -> (parent id, proposal)
        self.recent: dict[str, list[tuple[list[str], float]]] = defaultdict(list)  # variant -> (task ids, score)
        self.notes: dict[str, str] = {}  # task id -> what its last base trajectory did (for the router)
        self.history: list[dict[str, Any]] = []  # every verdict, as dicts

    # ------------------------------------------------------------------ routing
    def harness(self, variant: str = BASE) -> Harness:
        return self.variants.harnesses[variant]

    def current(self) -> dict[str, Harness]:
        """variant → its current harness (a copy of the mapping)."""
        return dict(self.variants.harnesses)

    def meta_tokens(self) -> dict[str, Any]:
        """The meta-agent's token ledger (prompt/completion tokens and calls so far)."""
        return self.meta.ledger.as_dict()

    def start_events(self, round: int = -1) -> list[HarnessEvent]:
        """One ``start`` event per variant: what a run records before its first round (``round``:
        the one before it)."""
        return [HarnessEvent("start", round, name, h, None) for name, h in self.variants.harnesses.items()]

    def release(self, change: Callable[[Harness], Harness], *, round: int, note: str) -> list[HarnessEvent]:
        """Every variant's harness replaced by ``change(harness)`` (a stream stage releasing new
        capabilities into the carried harnesses); a ``released`` event per variant it changed."""
        events = []
        for name, before in list(self.variants.harnesses.items()):
            after = change(before)
            self.variants.harnesses[name] = after
            if after.id != before.id:
                events.append(HarnessEvent("released", round, name, after, before.id, hypothesis=note))
        return events

    def observe_rates(self, round: int, *, train_pass_rate: float | None,
                      val_pass_rate: float | None) -> list[str]:
        """A round's pass rates measured by the caller (train on the routed batch, validation when it
        ran) for the reward-hacking trend monitor; returns the alerts' messages."""
        alerts = self.monitors.observe_round(round, train_pass_rate=train_pass_rate, val_pass_rate=val_pass_rate)
        return [a.message for a in alerts]

    def assign(self, tasks: Sequence[Task]) -> dict[str, str]:
        """task id → the variant it runs on this round."""
        return self.variants.assign(tasks, router=self.router, threshold=ROUTER_THRESHOLD,
                                    lessons=self.routing_lessons.items, notes=self.notes)

    def routed(self, tasks: Sequence[Task]) -> tuple[list[Harness], list[str]]:
        """Per task (parallel to ``tasks``), the harness of the variant it runs on, and that variant."""
        routed = self.assign(tasks)
        variants = [routed[t.task_id] for t in tasks]
        return [self.variants.harnesses[v] for v in variants], variants

    # ------------------------------------------------------------------ one round
    def evolve(self, traces: Sequence[Trace], *, round: int, withheld: Collection[str] = (),
               unscaffolded: Sequence[Trace] = (), weights: int = 0) -> tuple[EvolveReport, list[HarnessEvent]]:
        """Digest, propose, judge and ship, per variant, from this round's traces: the round's report
        (what the run directory records) and the harness events (shipped, spawned, rejected).

        ``withheld``: task ids whose references must not become demonstrations this round besides
        the judged ones (the loop passes every task a remaining round trains on, and the
        validation and test tasks), so no gold answer of a task the run will still train, validate
        or test on enters a harness edit. Infrastructure failures (``Trace.infra_failure``) are
        no evidence about a harness: they are left out of the variant records, the Critic's
        outcomes, routing lessons and monitors (the digest counts them). ``unscaffolded``: the
        round's episodes of the same tasks under each variant's harness without its scaffolding
        (``coevo.harness.scaffold``); each variant's digest reports them (``Digest.scaffold``), and
        the Planner may propose retiring the scaffolding from them. They are no variant's traces.
        ``weights``: the model version the round sampled from; a scaffold layer's shed is judged
        under it, and a shed rejected under one version is proposed again under the next
        (``coevo.evolution.critic.SHED_EPISODES``).
        """
        report, events = EvolveReport(round=round), []
        by_variant: dict[str, list[Trace]] = defaultdict(list)
        for t in traces:
            by_variant[t.variant].append(t)
        unknown = sorted(set(by_variant) - set(self.variants.names()))
        if unknown:
            raise ValueError(f"traces from unknown variants {unknown}; known: {self.variants.names()}")
        self._learn_routing([t for t in traces if not t.infra_failure])
        stopped = self.patience.exhausted if self.patience is not None else None
        for variant, vtraces in by_variant.items():
            judged = [t for t in vtraces if not t.infra_failure]
            outcomes: dict[str, list[bool]] = defaultdict(list)
            for t in judged:
                outcomes[t.task_id].append(bool(t.passed))
            self.variants.record(variant, outcomes)
            start = time.perf_counter()
            tasks = {t.task_id for t in vtraces}  # the same tasks' episodes without the outer scaffold layer
            evidence = scaffold_evidence(vtraces, [t for t in unscaffolded if t.task_id in tasks],
                                         outer_scaffold(self.variants.harnesses[variant]))
            dig = make_digest(vtraces, round=round, variant=variant, references=self.references, scaffold=evidence)
            report.seconds["digest"] = report.seconds.get("digest", 0.0) + time.perf_counter() - start
            report.digests.append(dig)
            if variant == BASE:
                self.notes.update({tid: "passed" for tid in dig.passed_task_ids})
                for c in dig.clusters:
                    self.notes.update({tid: f"failed: {c.cause}" for tid in c.task_ids})
            if not judged:  # every episode of the variant hit an infrastructure failure: nothing to learn
                report.warnings.append(f"variant {variant}: all {len(vtraces)} traces are infrastructure failures")
                continue
            if stopped is None and (dig.n_failed or dig.scaffold is not None):
                events += self._evolve_variant(variant, dig, dict(outcomes), report, set(withheld), weights)
            self._remember_batch(variant, dict(outcomes))
            shipped = next((v for v in report.verdicts if v.ship and v.variant == variant), None)
            alerts = self.monitors.observe_round(
                round, harness_id=self.variants.harnesses[variant].id, outcomes=dict(outcomes),
                shipped_dimension=shipped.proposal.dimension if shipped else None)
            report.warnings += [a.message for a in alerts]
        if self.patience is not None:
            shipped = bool(report.shipped or report.spawned)
            report.stopped = self.patience.update(round_shipped=shipped, batch_accepted=shipped)
        return report, events

    def _evolve_variant(self, variant: str, dig: Digest, before: dict[str, list[bool]], report: EvolveReport,
                        withheld: set[str], weights: int) -> list[HarnessEvent]:
        parent = self.variants.harnesses[variant]
        exclude = set(before) | withheld
        context = PlanContext(
            round=report.round, variant=variant, priorities=self.monitors.priorities(), tools=self.tools,
            rejected=self._rejected_under(variant, weights),
            demos=fresh_demos(self.references, exclude, self.spent_demos),
            lessons=list(self.design_lessons.items), max_proposals=self.max_proposals, inert=self.inert,
        )
        # undecided edits of this parent are judged again first; those of a replaced parent are dropped
        self.undecided[variant] = [(pid, p) for pid, p in self.undecided[variant] if pid == parent.id]
        retry = [p for _, p in self.undecided[variant]][: self.max_proposals]
        fresh: list[Proposal] = []
        # a ready scaffold retirement goes before re-judgements (an undecided edit keeps its place)
        shed = edits_key(retire_outer_scaffold(parent)) if dig.scaffold is not None and dig.scaffold.ready() else None
        if len(retry) < self.max_proposals or shed:
            start = time.perf_counter()
            fresh = self._ask_meta("plan", variant, report, self.meta.propose, dig, parent, context) or []
            report.seconds["plan"] = report.seconds.get("plan", 0.0) + time.perf_counter() - start
        sheds = [p for p in fresh if p.key() == shed]
        keys = {p.key() for p in retry + sheds}
        proposals = (sheds + retry + [p for p in fresh if p.key() not in keys])[: self.max_proposals]
        tasks = {tid: self.tasks[tid] for tid in before}
        # never a task whose reference may be (or, for a retried edit, may have been) a demonstration
        extra = {tid: t for tid, t in self.critic_pool.items()
                 if tid not in before and (tid not in self.references or tid in exclude)}
        recent = [RecentBatch([self.tasks[t] for t in ids], score) for ids, score in self.recent[variant]]
        events: list[HarnessEvent] = []
        for proposal in proposals:
            proposal.variant = variant
            verdict, candidate = self._judge_with_revisions(proposal, parent, dig, context, before, tasks, recent,
                                                            report, extra, weights)
            self._record_verdict(verdict, parent, report, weights)
            self._keep_if_undecided(variant, parent.id, proposal, verdict)
            if verdict.ship and candidate is not None:
                self.variants.harnesses[variant] = candidate
                self.variants.record(variant, verdict.after)
                self.pool.add(candidate, round=report.round, variant=variant, score=pass_at_k(verdict.after))
                report.shipped.append(candidate.id)
                return events + [HarnessEvent.from_verdict("shipped", verdict, candidate)]
            if (candidate is not None and verdict.fail_to_pass and verdict.pass_to_fail
                    and self.variants.can_spawn()):
                name = self.variants.spawn(candidate, {t: verdict.after[t] for t in verdict.fail_to_pass})
                self.pool.add(candidate, round=report.round, variant=name, score=pass_at_k(verdict.after))
                events.append(replace(HarnessEvent.from_verdict("spawned", verdict, candidate), variant=name))
                report.spawned.append(name)
                verdict.reason += f"; kept as variant {name} for {', '.join(verdict.fail_to_pass)}"
            elif not verdict.undecided:
                events.append(HarnessEvent.from_verdict("rejected", verdict, candidate))
        return events

    def _judge_with_revisions(self, proposal: Proposal, parent: Harness, dig: Digest, context: PlanContext,
                              before: dict[str, list[bool]], tasks: dict[str, Task], recent: list[RecentBatch],
                              report: EvolveReport, extra: dict[str, Task], weights: int
                              ) -> tuple[Verdict, Harness | None]:
        """Build and quality rejections go back to the meta-agent, up to ``max_revisions`` times."""
        while True:
            start = time.perf_counter()
            verdict, candidate = self.critic.judge(proposal, parent, before=before, tasks=tasks, recent=recent,
                                                   allowed=[demo_question(d) for d in context.demos],
                                                   round=report.round, extra=extra, weights=weights)
            report.seconds["critic"] = report.seconds.get("critic", 0.0) + time.perf_counter() - start
            if verdict.gate not in ("build", "quality") or proposal.revision >= MAX_REVISIONS:
                return verdict, candidate
            reason = verdict.reason
            if verdict.quality is not None and verdict.quality.leaked:
                reason += "\nleaked: " + " | ".join(verdict.quality.leaked)
            revised = self._ask_meta("revise", proposal.variant, report, self.meta.revise, proposal, reason, dig,
                                     parent, context)
            if revised is None:  # the caller records the verdict that stands
                return verdict, candidate
            self._record_verdict(verdict, parent, report, weights)
            revised.variant, revised.revision = proposal.variant, proposal.revision + 1
            proposal = revised

    def _ask_meta(self, stage: str, variant: str, report: EvolveReport, call: Callable[..., T],
                  *args: Any) -> T | None:
        """``call(*args)``, or None when the meta-agent fails: any exception, since a backend of the user's
        own may raise anything, and a failure in a round must not end the run. The round records
        why; the log also has the traceback of what is not a ``MetaAgentError`` (a bug, not an outage)."""
        try:
            return call(*args)
        except Exception as err:  # noqa: BLE001
            message = (f"variant {variant}: the meta-agent's {stage} call failed, so the round goes on without "
                       f"{'its proposals' if stage == 'plan' else 'a revision'}: {type(err).__name__}: {err}")
            log.warning("%s", message, exc_info=not isinstance(err, MetaAgentError))
            report.warnings.append(message)
            return None

    def _rejected_under(self, variant: str, weights: int) -> set[str]:
        """The variant's rejected proposal keys that stand under ``weights``: every edit's, and a
        shed's (``judged_per_weights``) only when it was rejected under these weights."""
        held, mark = self.rejected[variant], f"@{weights} "  # a key is JSON: "[..."; a shed's "@<weights> [..."
        return {k for k in held if not k.startswith("@")} | {k[len(mark):] for k in held if k.startswith(mark)}

    def _record_verdict(self, verdict: Verdict, parent: Harness, report: EvolveReport, weights: int) -> None:
        """The verdict in the round's report and the history; a rejection is remembered, a shed's
        (``judged_per_weights``) only under the weights it was judged with (another version may
        have learned the layer)."""
        report.verdicts.append(verdict)
        self.history.append(verdict.to_dict())
        if not verdict.ship and not verdict.undecided:
            shed = judged_per_weights(parent, verdict.candidate_id, verdict.proposal.edits)
            key = verdict.proposal.key()
            self.rejected[verdict.variant].add(f"@{weights} {key}" if shed else key)
            self.spent_demos |= shown_questions(verdict.proposal)
        report.warnings += [a.message for a in self.monitors.observe_verdict(verdict, harness_before=parent)]
        edits = ", ".join(e.describe() for e in verdict.proposal.edits)
        outcome = ("shipped" if verdict.ship else "undecided, to be judged again" if verdict.undecided
                   else f"rejected by {verdict.gate}")
        scope = verdict.proposal.cluster or "scope"
        self.design_lessons.add(f"{edits} for {scope}: {outcome} ({verdict.reason[:120]})")

    def _keep_if_undecided(self, variant: str, parent_id: str, proposal: Proposal, verdict: Verdict) -> None:
        """An undecided proposal (the judged revision of ``proposal``) waits for the variant's next
        round, once; a decided one leaves the queue."""
        keys = {proposal.key(), verdict.proposal.key()}
        waiting = [(pid, p) for pid, p in self.undecided[variant] if p.key() not in keys]
        if verdict.undecided:
            waiting.append((parent_id, verdict.proposal))
        self.undecided[variant] = waiting

    def _remember_batch(self, variant: str, outcomes: dict[str, list[bool]]) -> None:
        self.recent[variant].append((sorted(outcomes), pass_at_k(outcomes)))
        del self.recent[variant][: max(0, len(self.recent[variant]) - RECENT_BATCHES)]

    def _learn_routing(self, traces: Sequence[Trace]) -> None:
        for t in traces:
            if t.variant != BASE and not t.passed and (self.variants.rate(BASE, t.task_id) or 0.0) > 0:
                task = self.tasks.get(t.task_id)
                text = " ".join(task.instruction.split()[:12]) if task is not None else t.task_id
                self.routing_lessons.add(f"'{text}...' failed on {t.variant} but has passed on base")

    # ------------------------------------------------------------------ epoch end
    def select(self, evaluate: Callable[[Harness], float], *, round: int) -> list[HarnessEvent]:
        """Per variant, the best of its current harness and its pool snapshots on validation
        (``evaluate`` returns a pass rate) becomes current. Returns a ``selected`` event for each
        variant whose harness changed."""
        events, best_scores = [], []
        for variant in list(self.variants.harnesses):
            scores = {s.harness_id: evaluate(s.harness) for s in self.pool.of_variant(variant)}
            best = self.pool.best(scores, variant=variant)
            before = self.variants.harnesses[variant]
            self.variants.harnesses[variant] = best.harness
            if best.harness_id != before.id:
                events.append(HarnessEvent("selected", round, variant, best.harness, before.id,
                                           hypothesis="best snapshot on validation at epoch end"))
            best_scores.append(scores[best.harness_id])
        if self.patience is not None:
            self.patience.update(epoch_score=max(best_scores))
        return events

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
            "spent_demos": sorted(self.spent_demos),
            "undecided": {v: [{"parent_id": pid, "proposal": p.to_dict()} for pid, p in items]
                          for v, items in self.undecided.items() if items},
            "critic": self.critic.state_dict(),
            "recent": {v: [[ids, s] for ids, s in items] for v, items in self.recent.items()},
            "notes": dict(self.notes),
            "history": list(self.history),
            "meta": self.meta.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict``'s state; one written by an earlier version that lacks a part is a
        ValueError naming it (such a run cannot be resumed: start a new one)."""
        missing = sorted(set(self.state_dict()) - set(state))
        if missing:
            raise ValueError(f"the AEGIS state lacks {missing}: it was saved by an earlier version of coevo, whose "
                             "runs cannot be resumed by this one; start a new run")
        self.variants = VariantSet.from_dict(state["variants"])
        self.pool = SnapshotPool.from_dict(state["pool"])
        if state["patience"] is not None:
            self.patience = Patience.from_dict(state["patience"])
        self.monitors.load_state_dict(state["monitors"])
        self.design_lessons = LessonStore.from_dict(state["design_lessons"])
        self.routing_lessons = LessonStore.from_dict(state["routing_lessons"])
        self.rejected = defaultdict(set, {v: set(keys) for v, keys in state["rejected"].items()})
        self.spent_demos = set(state["spent_demos"])
        self.undecided = defaultdict(list, {v: [(i["parent_id"], Proposal.from_dict(i["proposal"])) for i in items]
                                            for v, items in state["undecided"].items()})
        self.critic.load_state_dict(state["critic"])
        self.recent = defaultdict(list, {v: [(list(ids), float(s)) for ids, s in items]
                                         for v, items in state["recent"].items()})
        self.notes = dict(state["notes"])
        self.history = list(state["history"])
        self.meta.load_state_dict(state["meta"])
