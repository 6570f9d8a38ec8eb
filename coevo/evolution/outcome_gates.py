"""The Critic's outcome gates as pure functions of per-task outcomes and accuracies: seesaw,
performance, and ``combine``, which turns their results into the Critic's ``Decision``. Every gate
says what it decided as an ``Outcome`` (ship or reject here; the statistical gate may also leave
an edit undecided), the type the ``Verdict`` stores.

Why pure functions: what the Critic decides from the outcomes of its episodes must be
reproducible from the numbers alone (a verdict can be re-derived from a run directory) and
testable against slow, obvious twins. Nothing here runs a model or builds a processor.

Seesaw gate (HarnessX §4.4): per-task pass@k before and after; ship only with at least one
fail→pass and no pass→fail among the tasks evaluated. Performance gate (HarnessEvolve eq. 1):
improvement ≥ delta on the current batch, degradation ≤ epsilon on each recent batch; both
boundaries pass (compared with a 1e-9 tolerance because accuracies are ratios of counts and
``0.3 - 0.2 < 0.1`` in floating point).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from coevo.agent.outcomes import task_pass_at_k
from coevo.rundir.evolve_records import Outcome

TOLERANCE = 1e-9
GATE_MODES = ("seesaw", "performance", "both")
EPSILON = 0.0
"""Performance gate: the pass-rate loss tolerated on each recent batch (HarnessEvolve's ε): none,
the same rule the seesaw gate applies per task (the Critic's default; no config field)."""


# ---------------------------------------------------------------------------------- seesaw gate
def shipped(ship: bool) -> Outcome:
    """A two-way gate's outcome."""
    return Outcome.SHIP if ship else Outcome.REJECT


class SeesawResult(NamedTuple):
    outcome: Outcome
    fail_to_pass: list[str]
    pass_to_fail: list[str]
    reason: str


def seesaw_gate(
    before: Mapping[str, Sequence[bool]],
    after: Mapping[str, Sequence[bool]],
    *,
    scope: Collection[str],
    need_gain: bool = True,
) -> SeesawResult:
    """Compare per-task pass@k. Evaluated tasks: ``scope`` ∪ tasks that passed before (those
    missing from ``after`` outside ``scope`` cannot be judged and are named in the reason). Ship
    only with no pass→fail flip and at least one fail→pass; one regression vetoes any number of
    gains (the seesaw constraint is per task, not an aggregate). ``need_gain=False`` (an edit
    that only removes processors: a leaner harness is worth having at equal pass rate): ship with
    no pass→fail flip, gains or not."""
    b, a = task_pass_at_k(before), task_pass_at_k(after)
    missing_before = sorted(t for t in scope if t not in b)
    if missing_before:
        raise ValueError(f"scope tasks have no outcomes in before: {missing_before}")
    missing_after = sorted(t for t in scope if t not in a)
    if missing_after:
        raise ValueError(f"after lacks scope tasks of before: {missing_after}")
    evaluated = set(scope) | {t for t, ok in b.items() if ok}
    unjudged = sorted(t for t in evaluated if t not in a)
    judged = sorted(t for t in evaluated if t in a)
    f2p = [t for t in judged if not b[t] and a[t]]
    p2f = [t for t in judged if b[t] and not a[t]]
    ship = not p2f and (bool(f2p) or not need_gain)
    if p2f:
        reason = (
            f"reject: pass→fail on {len(p2f)} task(s) {p2f} "
            f"(with {len(f2p)} fail→pass); no task that passed under pass@k may fail"
        )
    elif not f2p and need_gain:
        reason = f"reject: no fail→pass among {len(judged)} evaluated task(s)"
    elif not f2p:
        reason = f"ship: no pass→fail among {len(judged)} evaluated task(s) (a removal needs no gain)"
    else:
        reason = f"ship: {len(f2p)} fail→pass {f2p}, no pass→fail among {len(judged)} evaluated task(s)"
    if unjudged:
        reason += f"; not re-run after: {unjudged}"
    return SeesawResult(shipped(ship), f2p, p2f, reason)


# ---------------------------------------------------------------------------------- performance gate
class PerformanceResult(NamedTuple):
    outcome: Outcome
    reason: str


def _check_acc(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be an accuracy in [0, 1], got {value!r}")


def performance_gate(
    current_before: float,
    current_after: float,
    recent_before: Sequence[float],
    recent_after: Sequence[float],
    *,
    delta: float,
    epsilon: float,
) -> PerformanceResult:
    """Accept iff ``current_after - current_before >= delta`` and, for every recent batch l,
    ``recent_before[l] - recent_after[l] <= epsilon`` (HarnessEvolve eq. 1; no recent batches:
    the second condition holds). Both boundaries pass, within a 1e-9 tolerance."""
    if delta < 0 or epsilon < 0:
        raise ValueError(f"delta and epsilon must be >= 0, got delta={delta}, epsilon={epsilon}")
    if len(recent_before) != len(recent_after):
        raise ValueError(
            f"recent_before and recent_after must have one accuracy per recent batch, "
            f"got {len(recent_before)} and {len(recent_after)}"
        )
    _check_acc("current_before", current_before)
    _check_acc("current_after", current_after)
    for i, (rb, ra) in enumerate(zip(recent_before, recent_after, strict=True)):
        _check_acc(f"recent_before[{i}]", rb)
        _check_acc(f"recent_after[{i}]", ra)
    gain = current_after - current_before
    degradations = [rb - ra for rb, ra in zip(recent_before, recent_after, strict=True)]
    worst = max(degradations, default=0.0)
    problems = []
    if gain < delta - TOLERANCE:
        problems.append(f"current batch {current_before:.3f} → {current_after:.3f} "
                        f"(gain {gain:+.3f} < delta {delta:g})")
    bad = [i for i, d in enumerate(degradations) if d > epsilon + TOLERANCE]
    if bad:
        problems.append(f"recent batch(es) {bad} degrade by up to {worst:.3f} > epsilon {epsilon:g}")
    if problems:
        return PerformanceResult(Outcome.REJECT, "reject: " + "; ".join(problems))
    return PerformanceResult(
        Outcome.SHIP,
        f"ship: current batch gain {gain:+.3f} >= {delta:g}, worst recent degradation {worst:.3f} <= {epsilon:g} "
        f"over {len(degradations)} batch(es)",
    )


# ---------------------------------------------------------------------------------- combining
class Decision(NamedTuple):
    outcome: Outcome
    gate: str  # seesaw | performance | seesaw+performance (the gate(s) that decided)
    reason: str


def combine(
    mode: str,
    *,
    seesaw: SeesawResult | None = None,
    performance: PerformanceResult | None = None,
) -> Decision:
    """The Critic's decision from the gates' results. ``both`` ships only when both ship; the gate
    named is the one that rejected, or ``seesaw+performance`` when both agree."""
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode must be one of {GATE_MODES}, got {mode!r}")
    needed = {"seesaw": ("seesaw",), "performance": ("performance",), "both": ("seesaw", "performance")}[mode]
    given = {"seesaw": seesaw, "performance": performance}
    missing = [g for g in needed if given[g] is None]
    if missing:
        raise ValueError(f"gate mode {mode!r} needs the result of {missing}")
    if mode == "seesaw" and seesaw is not None:
        return Decision(seesaw.outcome, mode, seesaw.reason)
    if mode == "performance" and performance is not None:
        return Decision(performance.outcome, mode, performance.reason)
    assert seesaw is not None and performance is not None
    reason = f"seesaw: {seesaw.reason}; performance: {performance.reason}"
    if seesaw.outcome == performance.outcome:
        return Decision(seesaw.outcome, "seesaw+performance", reason)
    return Decision(Outcome.REJECT, "performance" if seesaw.outcome is Outcome.SHIP else "seesaw", reason)
