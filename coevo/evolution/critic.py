"""The Critic: a quality gate on the edit's text, then re-runs and a gate on what happened.

The order matters for cost: leakage and bloat are checked on the proposal alone, so a proposal
that quotes an answer never costs a rollout; its reason goes back to the Planner for revision.

Two kinds of gate follow (``gate``):

- ``stat`` (the default), for noisy models: the parent and the candidate are both re-run, afresh,
  on the same tasks — the tasks the edit claims, the tasks that passed before, then other train
  tasks (``extra``) up to ``n_tasks`` — ``k`` attempts each, in stages until a decision or the
  per-decision ``budget`` of episodes is spent. The paired outcomes feed a sequential likelihood
  ratio test (``coevo.evolution.stat_gate``) whose false-ship rate is at most ``alpha`` however many
  rounds the edit is judged. A task that flipped pass→fail is re-run ``confirm_attempts`` more
  times before it counts as a regression; a confirmed regression rejects. An edit without
  enough evidence is *undecided*: its pairs are kept (``evidence``, keyed by parent and
  candidate) and pooled with those of its next judgement; once the pooled episodes reach
  ``max_episodes`` it is rejected for no effect. A rejected edit keeps its pairs too, so one
  proposed again continues the same test instead of restarting it. A scaffold layer's shed is the
  exception: its effect is the weights' (they are trained every round to do without the layer),
  so its pairs are pooled only under the weights that produced them (``weights``), it is judged
  on ``SHED_EPISODES`` in one go, and a rejection holds only until the weights change. Fresh
  parent runs matter: the batch's own outcomes chose the claimed tasks for failing and would
  flatter any edit by regression to the mean, so they only pick tasks here.
- ``seesaw`` / ``performance`` / ``both`` (HarnessX, HarnessEvolve): the candidate is re-run on
  the tasks it claims (its scope) plus every task that passed before, ``k`` attempts each, and
  compared with the batch's outcomes per task under pass@k.

Rollouts are injected as a function (``Rollout``), which keeps this module free of models and
environments and lets the tests drive it with exact outcomes. An attempt that failed for
infrastructure reasons (a crashed policy, environment or tool) comes back as None: it is no
evidence about the harness, so every gate leaves it out (the statistical gate drops its pair).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coevo.agent.outcomes import pass_at_k
from coevo.config.schema import EvolutionConfig
from coevo.envs.base import Task
from coevo.evolution.evolver import BuildError, build_candidate
from coevo.evolution.outcome_gates import EPSILON, PerformanceResult, combine, performance_gate, seesaw_gate
from coevo.evolution.quality_gate import ETA_BLOAT, ETA_LEAK, quality_gate
from coevo.evolution.stat_gate import (
    STAT_ALPHA,
    STAT_BETA,
    STAT_WIN_SHARE,
    Pair,
    StatResult,
    apparent_regression,
    log_likelihood_ratio,
    noninferiority_gate,
    pair_counts,
    regression_confirmed,
    stat_gate,
    stat_thresholds,
)
from coevo.harness.edit_record import Edit
from coevo.harness.harness import Harness
from coevo.harness.scaffold import without_outer_scaffold
from coevo.harness.tool_listing import lists_fewer
from coevo.rundir.evolve_records import Outcome, Proposal, QualityReport, Verdict

log = logging.getLogger("coevo.evolution")

Rollout = Callable[[Harness, Sequence[Task], int], Mapping[str, Sequence[bool | None]]]
"""(harness, tasks, k) → task id → the outcomes of k attempts; None for an attempt that failed
for infrastructure reasons (``Trace.infra_failure``)."""

GATES = {
    "stat": "parent and candidate re-run afresh on the same tasks; a sequential test on the paired outcomes ships "
            "an edit with no effect with probability at most STAT_ALPHA; confirmed regressions reject; undecided "
            "edits are judged again with their evidence pooled (for noisy models)",
    "seesaw": "the candidate re-run on the tasks it claims and those that passed before: ship with a fail→pass and "
              "no pass→fail under pass@k (HarnessX)",
    "performance": "the candidate's pass rate on the batch up by delta, on no recent batch down by more than "
                   "EPSILON (HarnessEvolve)",
    "both": "seesaw and performance",
}
"""The gates the Critic supports: name → what it decides on (``evolution.gate`` takes these names)."""

STAT_MAX_EPISODES = 256
"""Statistical gate: pooled episodes (every judgement of an edit together) after which an edit still
undecided is rejected for no effect; also the most one decision may spend (``evolution.stat_budget``)."""
SHED_EPISODES = 192
"""Statistical gate: episodes a scaffold layer's shed is judged on, under one set of weights. Its
pairs cannot pool across rounds (the weights it depends on change in between), so one judgement
must bound the loss within the margin by itself: at 96 pairs, a shed that costs nothing (about a
third of the pairs discordant, half of them losses) bounds it at ~7.5 points, inside the 10-point
margin; at the default 64 episodes (32 pairs) even an even split bounds it only at ~10.5 points,
so a shed was never decided in one round and its pooled evidence mixed weights that had not yet
learned to do without the layer with weights that had."""
STAT_CONFIRM_ATTEMPTS = 4
"""Statistical gate: paired re-runs of a task that flipped pass→fail before it counts as a
regression (which rejects); 4 is the fewest whose sign test can reach ``STAT_ALPHA`` = 0.1
(0.5^4 ≤ 0.1)."""


@dataclass
class RecentBatch:
    """A batch judged in an earlier round, kept for the performance gate's degradation check."""

    tasks: list[Task]
    score: float  # pass@k rate of the current harness on it when it was recorded


@dataclass
class PooledPairs:
    """The paired attempts of one candidate against its parent, pooled over every judgement."""

    pairs: dict[str, list[Pair]] = field(default_factory=dict)  # task id → (parent, candidate) per attempt
    episodes: int = 0  # episodes spent on it, all judgements together
    judged: int = 0  # how many times it was judged

    def add(self, pairs: Mapping[str, Sequence[Pair]]) -> None:
        for tid, task_pairs in pairs.items():
            self.pairs.setdefault(tid, []).extend((bool(a), bool(b)) for a, b in task_pairs)

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": {t: [list(p) for p in ps] for t, ps in self.pairs.items()}, "episodes": self.episodes,
                "judged": self.judged}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PooledPairs:
        pairs = {t: [(bool(a), bool(b)) for a, b in ps] for t, ps in data["pairs"].items()}
        return cls(pairs, int(data["episodes"]), int(data["judged"]))


def judged_outcomes(outcomes: Mapping[str, Sequence[bool | None]]) -> tuple[dict[str, list[bool]], int]:
    """(task id → the attempts that were not infrastructure failures, how many were); a task left
    with no attempt is absent: it cannot be judged."""
    kept = {tid: [bool(a) for a in attempts if a is not None] for tid, attempts in outcomes.items()}
    dropped = sum(sum(a is None for a in attempts) for attempts in outcomes.values())
    return {tid: attempts for tid, attempts in kept.items() if attempts}, dropped


def judged_per_weights(parent: Harness, candidate_id: str | None, edits: Sequence[Edit]) -> bool:
    """Whether a candidate is a leaner form of ``parent`` whose cost the weights decide: a scaffold
    layer shed (``coevo.harness.scaffold``) or fewer tools listed (``coevo.harness.tool_listing``).
    Such a change needs no gain, only a loss bounded within the margin on a shed's episodes
    (``SHED_EPISODES``), judged under one model version; a rejection stands for that version only
    (``AEGIS``), since the next one trains on episodes with and without it. At 96 pairs a change
    that costs nothing ships about half the time, so rejected for good it would be lost as often."""
    shed = candidate_id is not None and candidate_id == without_outer_scaffold(parent).id != parent.id
    return shed or lists_fewer(parent, edits)


@dataclass
class Critic:
    """Judges proposals for one variant. Flat hyper-parameters:

    ``k`` attempts per task and stage; ``gate`` in GATES; ``eta_leak``/``eta_bloat`` the quality
    thresholds; ``delta`` the improvement the performance gate needs on the current batch and
    ``epsilon`` the degradation it tolerates on each of the recent batches. Statistical gate:
    ``alpha`` (false-ship rate of an edit with no effect), ``beta`` (miss rate at the designed
    effect), ``win_share`` (the designed effect: share of discordant pairs the candidate wins),
    ``n_tasks`` (tasks judged per decision, at least), ``budget`` (episodes per decision, both
    harnesses), ``max_episodes`` (pooled episodes after which an undecided edit is rejected),
    ``confirm_attempts`` (paired re-runs of an apparent regression; 0: no confirmation, no veto).
    """

    rollout: Rollout
    # defaults: the schema's (coevo.config.schema.EvolutionConfig) for what a run configures, stated there only;
    # the gates' own constants for the rest (STAT_*, ETA_*, EPSILON), stated beside the code that uses them
    k: int = EvolutionConfig.critic_attempts
    gate: str = EvolutionConfig.gate
    eta_leak: float = ETA_LEAK
    eta_bloat: float = ETA_BLOAT
    delta: float = EvolutionConfig.delta
    epsilon: float = EPSILON
    alpha: float = STAT_ALPHA
    beta: float = STAT_BETA
    win_share: float = STAT_WIN_SHARE
    n_tasks: int = EvolutionConfig.stat_tasks
    budget: int = EvolutionConfig.stat_budget
    max_episodes: int = STAT_MAX_EPISODES
    confirm_attempts: int = STAT_CONFIRM_ATTEMPTS
    reruns: int = field(default=0, init=False)  # episodes the critic has run (cost accounting)
    evidence: dict[str, PooledPairs] = field(default_factory=dict, init=False)  # "parent>candidate" → pooled pairs

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {list(GATES)}, got {self.gate!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        stat_thresholds(self.alpha, self.beta)
        log_likelihood_ratio(0, 0, self.win_share)
        if self.n_tasks < 1:
            raise ValueError(f"n_tasks must be >= 1, got {self.n_tasks}")
        if self.budget < 2 * self.k:
            raise ValueError(f"budget must hold one paired attempt (2 * k = {2 * self.k} episodes), got {self.budget}")
        if self.max_episodes < self.budget:
            raise ValueError(f"max_episodes ({self.max_episodes}) must be >= budget ({self.budget})")
        if self.confirm_attempts < 0:
            raise ValueError(f"confirm_attempts must be >= 0, got {self.confirm_attempts}")
        if self.confirm_attempts and 0.5**self.confirm_attempts > self.alpha:
            raise ValueError(f"confirm_attempts={self.confirm_attempts} can never confirm a regression at "
                             f"alpha={self.alpha} (the sign test's smallest p-value is 0.5^attempts); use 0 or more")

    def quality(self, proposal: Proposal, parent: Harness, tasks: Mapping[str, Task],
                failed: Sequence[str], allowed: Sequence[str] = ()) -> QualityReport:
        """Leakage against the answers of every task the candidate will be judged on and the texts
        of the failed tasks; bloat of what the edits inject. ``allowed``: texts an edit may quote
        (the demonstrations' own questions), whose shared phrasing is the env's template."""
        answers = {tid: str(t.answer) for tid, t in tasks.items()}
        texts = {tid: tasks[tid].instruction for tid in failed if tid in tasks}
        return quality_gate(proposal.edits, parent, answers, texts, eta_leak=self.eta_leak,
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
        extra: Mapping[str, Task] | None = None,
        weights: int = 0,
    ) -> tuple[Verdict, Harness | None]:
        """Build, gate and re-run ``proposal`` against ``parent``; returns the verdict and the
        candidate harness (None when it did not build).

        ``before``: outcomes of the parent on this round's batch (task id → k attempts);
        ``tasks``: those tasks by id. ``extra``: other train tasks the statistical gate may judge
        on (never validation or test tasks, nor the tasks whose references are offered as
        demonstrations). ``allowed``: see ``quality``. ``weights``: the version of the model the
        re-runs sample from, which a shed's evidence is pooled under (``SHED_EPISODES``).
        """
        verdict = Verdict(proposal=proposal, parent_id=parent.id, candidate_id=None, variant=proposal.variant,
                          outcome=Outcome.REJECT, reason="", round=round)
        try:
            candidate = build_candidate(parent, proposal)
        except BuildError as err:
            verdict.gate, verdict.reason = "build", str(err)
            return verdict, None
        verdict.candidate_id = candidate.id
        passed_before = [tid for tid, outs in before.items() if any(outs)]
        failed_before = [tid for tid, outs in before.items() if not any(outs)]
        scope = [tid for tid in proposal.target_tasks if tid in before] or failed_before
        known = {**(extra or {}), **tasks}
        lean = judged_per_weights(parent, candidate.id, proposal.edits)
        budget = max(self.budget, min(SHED_EPISODES, self.max_episodes)) if lean else self.budget
        if self.gate == "stat":
            n_tasks = max(self.n_tasks, budget // (2 * self.k)) if lean else self.n_tasks
            evaluated = self._stat_tasks(scope, passed_before, [*before, *(extra or {})], parent, candidate, round,
                                         n_tasks)
        else:
            evaluated = sorted(set(scope) | set(passed_before))
        verdict.quality = self.quality(proposal, parent, {tid: known[tid] for tid in evaluated}, failed_before,
                                       allowed)
        if not verdict.quality.passed:
            verdict.gate, verdict.reason = "quality", verdict.quality.reason
            return verdict, candidate
        # a leaner harness needs no gain to ship, only no harm: processors removed, a scaffold layer
        # shed, or fewer tools listed
        removal = proposal.removes_only or lean
        if self.gate == "stat":
            key = f"{parent.id}>{candidate.id}" + (f"@{weights}" if lean else "")
            self._judge_stat(verdict, parent, candidate, [known[tid] for tid in evaluated], removal, key, budget,
                             cap=budget if lean else self.max_episodes)
            log.info("critic %s %s: %s", "ships" if verdict.ship else "rejects" if not verdict.undecided
                     else "keeps undecided", candidate.id, verdict.reason)
            return verdict, candidate

        after, infra = judged_outcomes(self._run(candidate, [tasks[tid] for tid in evaluated]))
        verdict.before = {tid: list(before[tid]) for tid in evaluated}
        verdict.after = after
        seesaw = seesaw_gate(verdict.before, after, scope=[tid for tid in scope if tid in after],
                             need_gain=not removal)
        verdict.fail_to_pass, verdict.pass_to_fail = seesaw.fail_to_pass, seesaw.pass_to_fail
        performance = self._performance(candidate, before, after, recent) if self.gate != "seesaw" else None
        decision = combine(self.gate, seesaw=seesaw, performance=performance)
        verdict.outcome, verdict.gate, verdict.reason = decision.outcome, decision.gate, decision.reason
        if infra:
            verdict.reason += f"; {infra} infrastructure-failed attempt(s) left out"
        log.info("critic %s %s: %s", "ships" if verdict.ship else "rejects", candidate.id, verdict.reason)
        return verdict, candidate

    # ------------------------------------------------------------------ statistical gate
    def _stat_tasks(self, scope: Sequence[str], passed_before: Sequence[str], available: Sequence[str],
                    parent: Harness, candidate: Harness, round: int, n_tasks: int) -> list[str]:
        """The claimed tasks, then those that passed before, then a seeded sample of the other
        available tasks up to ``n_tasks``; a short stage runs the head of this list."""
        core = list(dict.fromkeys([*sorted(scope), *sorted(passed_before)]))
        others = sorted(set(available) - set(core))
        seed = hashlib.sha256(f"{round}:{parent.id}:{candidate.id}".encode()).hexdigest()
        random.Random(seed).shuffle(others)
        return core + others[: max(0, n_tasks - len(core))]

    def _judge_stat(self, verdict: Verdict, parent: Harness, candidate: Harness, tasks: list[Task],
                    removal: bool, key: str, budget: int, cap: int) -> None:
        """Stages of ``k`` paired attempts per task until ``stat_gate`` decides or the
        budget is spent; apparent regressions are re-run in between. Fills ``verdict``. A
        ``removal`` (an edit that only removes processors or sheds a scaffold layer, such as the
        demonstration nearest the task) is judged by ``noninferiority_gate``,
        which ships only once this judgement's budget is spent. ``key``: what the pairs are pooled
        under (``evidence``); ``budget``: the episodes this judgement may spend; ``cap``: the pooled
        episodes after which an edit still undecided is rejected."""
        def decide(final: bool, exhausted: bool = False) -> StatResult:
            if removal:
                return noninferiority_gate(pooled.pairs, regressions=confirmed, alpha=self.alpha, final=final,
                                           exhausted=exhausted)
            return stat_gate(pooled.pairs, regressions=confirmed, alpha=self.alpha, beta=self.beta,
                             win_share=self.win_share, exhausted=exhausted)

        pooled = self.evidence.setdefault(key, PooledPairs())
        pooled.judged += 1
        by_id = {t.task_id: t for t in tasks}
        spent = infra = 0
        checked: set[str] = set()
        confirmed: list[str] = []
        confirmations: dict[str, dict[str, Any]] = {}
        result = None
        while True:
            stage = tasks[: (budget - spent) // (2 * self.k)]
            if not stage:
                break
            pairs, dropped = self._paired(parent, candidate, stage, self.k)
            spent, infra = spent + 2 * self.k * len(stage), infra + dropped
            pooled.add(pairs)
            suspects = [tid for tid in pairs if tid not in checked and apparent_regression(pairs[tid])]
            for tid in sorted(suspects, key=lambda t: -pair_counts(pairs[t]).losses):
                if not self.confirm_attempts or budget - spent < 2 * self.confirm_attempts:
                    break
                fresh, dropped = self._paired(parent, candidate, [by_id[tid]], self.confirm_attempts)
                spent, infra = spent + 2 * self.confirm_attempts, infra + dropped
                pooled.add(fresh)
                checked.add(tid)
                counts = pair_counts(fresh.get(tid, []))
                is_confirmed = regression_confirmed(fresh.get(tid, []), self.alpha)
                confirmations[tid] = {"wins": counts.wins, "losses": counts.losses, "pairs": counts.pairs,
                                      "confirmed": is_confirmed}
                if is_confirmed:
                    confirmed.append(tid)
            result = decide(final=not tasks[: (budget - spent) // (2 * self.k)])
            if result.outcome is not Outcome.UNDECIDED:
                break
        pooled.episodes += spent
        if result is None or result.outcome is Outcome.UNDECIDED:
            result = decide(final=True, exhausted=pooled.episodes >= cap)
        if result.outcome is Outcome.SHIP:  # the parent is replaced: nothing will be compared with it again
            del self.evidence[key]
        counts = {tid: pair_counts(ps) for tid, ps in pooled.pairs.items()}
        verdict.before = {tid: [a for a, _ in ps] for tid, ps in pooled.pairs.items()}
        verdict.after = {tid: [b for _, b in ps] for tid, ps in pooled.pairs.items()}
        verdict.fail_to_pass = sorted(tid for tid, c in counts.items() if c.wins > c.losses)
        verdict.pass_to_fail = sorted(confirmed)
        verdict.outcome = result.outcome
        verdict.gate = "stat"
        verdict.evidence = replace(
            result.evidence, decision=result.outcome.value, episodes=spent, budget=budget,
            pooled_episodes=pooled.episodes, max_episodes=cap, judged=pooled.judged,
            confirmations=confirmations, infra_left_out=infra)
        verdict.reason = (f"{result.reason}; {spent}/{budget} episodes this time, {pooled.episodes} pooled "
                          f"over {pooled.judged} judgement(s)"
                          + (f"; {infra} pair(s) with an infrastructure failure left out" if infra else ""))

    def _paired(self, parent: Harness, candidate: Harness, tasks: Sequence[Task],
                k: int) -> tuple[dict[str, list[Pair]], int]:
        """``k`` fresh attempts of each harness per task, paired in attempt order; a pair with an
        infrastructure failure on either side is dropped. Returns (task → pairs, pairs dropped)."""
        runs = self._run(parent, tasks, k), self._run(candidate, tasks, k)
        pairs: dict[str, list[Pair]] = {}
        dropped = 0
        for t in tasks:
            a_outs, b_outs = runs[0][t.task_id], runs[1][t.task_id]
            if len(a_outs) != k or len(b_outs) != k:
                raise RuntimeError(f"rollout returned {len(a_outs)} and {len(b_outs)} outcomes for task "
                                   f"{t.task_id!r}; {k} were asked")
            for a, b in zip(a_outs, b_outs, strict=True):
                if a is None or b is None:
                    dropped += 1
                else:
                    pairs.setdefault(t.task_id, []).append((bool(a), bool(b)))
        return pairs, dropped

    # ------------------------------------------------------------------ shared
    def _run(self, harness: Harness, tasks: Sequence[Task], k: int | None = None) -> dict[str, list[bool | None]]:
        if not tasks:
            return {}
        k = self.k if k is None else k
        self.reruns += len(tasks) * k
        out = self.rollout(harness, tasks, k)
        missing = [t.task_id for t in tasks if t.task_id not in out]
        if missing:
            raise RuntimeError(f"rollout returned no outcomes for tasks {missing}")
        return {t.task_id: list(out[t.task_id]) for t in tasks}

    def _performance(self, candidate: Harness, before: Mapping[str, Sequence[bool]],
                     after: Mapping[str, Sequence[bool]], recent: Sequence[RecentBatch]) -> PerformanceResult:
        """Current batch: tasks not re-run (failed before and outside scope) keep their outcomes."""
        merged = {tid: list(after.get(tid, outs)) for tid, outs in before.items()}
        cur_before = pass_at_k(before)
        cur_after = pass_at_k(merged)
        recent_after = [pass_at_k(judged_outcomes(self._run(candidate, b.tasks))[0]) for b in recent]
        return performance_gate(cur_before, cur_after, [b.score for b in recent], recent_after,
                                      delta=self.delta, epsilon=self.epsilon)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """The pooled evidence of edits judged before (what a resumed run must not forget)."""
        return {"evidence": {key: ev.to_dict() for key, ev in self.evidence.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.evidence = {key: PooledPairs.from_dict(ev) for key, ev in state["evidence"].items()}
