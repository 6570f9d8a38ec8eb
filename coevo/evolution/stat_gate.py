"""The Critic's statistical gate (the default; ``stat_gate``) as pure functions of paired attempts.

A sequential test on *paired* attempts. The Critic runs the parent and the candidate afresh on
the same tasks; each paired attempt is a win (candidate passed, parent failed), a loss (the
reverse) or a tie. If the edit changes nothing, a discordant pair is a win or a loss with
probability 1/2 each, whatever the task's difficulty. The statistic is the likelihood ratio of
"the candidate wins a share ``win_share`` of discordant pairs" against "half":
``LR = (2·win_share)^wins · (2·(1 − win_share))^losses``. Under no effect it is a non-negative
martingale, so by Ville's inequality it ever reaches ``1/alpha`` with probability at most
``alpha`` — however the pairs were gathered: in stages, with confirmation re-runs, pooled across
rounds. Hence: ship when ``LR ≥ 1/alpha``; reject when ``LR ≤ beta/(1 − alpha)`` (Wald's lower
boundary: an edit with the designed effect is rejected with probability about ``beta``), naming
harm when the sign test on losses is significant at ``alpha``; otherwise undecided (more
evidence needed), or rejected for no effect once the pooled evidence reached its cap
(``exhausted``). A task that looked regressed is re-run (``regression_confirmed``: the exact
sign test on the fresh pairs alone at ``alpha``); a confirmed regression rejects.

Pure, like the other gates (``coevo.evolution.outcome_gates``): a verdict can be re-derived from
the numbers alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from coevo.evolution.outcome_gates import TOLERANCE
from coevo.rundir.evolve_records import Evidence, Outcome

# The gate's constants (the Critic's defaults; no config field: a run does not tune them).
STAT_ALPHA = 0.1
"""Error rate of the statistical gate: an edit with no effect ships with probability at most 0.1
over every round it is judged (half the 20% the project tolerates for neutral edits, so prompt
changes that are nearly neutral stay under it; harmful edits ship far less often)."""
STAT_BETA = 0.2
"""Miss rate at the designed effect (Wald's lower boundary): the usual 80% power."""
STAT_WIN_SHARE = 0.75
"""Designed effect: the candidate wins 3 of 4 discordant pairs (e.g. a pass rate from 0.05 to 0.15
on a small model: wins 0.14, losses 0.04 per pair)."""


Pair = tuple[bool, bool]
"""One paired attempt on a task: (the parent passed, the candidate passed)."""


class PairCounts(NamedTuple):
    wins: int  # candidate passed, parent failed
    losses: int  # parent passed, candidate failed
    both: int  # both passed
    neither: int  # both failed

    @property
    def pairs(self) -> int:
        return self.wins + self.losses + self.both + self.neither


def pair_counts(pairs: Iterable[Pair]) -> PairCounts:
    """Wins, losses and the two kinds of ties among ``pairs``."""
    c = Counter((bool(a), bool(b)) for a, b in pairs)
    return PairCounts(c[(False, True)], c[(True, False)], c[(True, True)], c[(False, False)])


def sign_test(successes: int, failures: int) -> float:
    """One-sided exact sign test: P(X ≥ successes) for X ~ Binomial(successes + failures, 1/2)
    (1.0 when there are no trials)."""
    if successes < 0 or failures < 0:
        raise ValueError(f"counts must be >= 0, got {successes} and {failures}")
    n = successes + failures
    return sum(math.comb(n, i) for i in range(successes, n + 1)) / 2**n


def log_likelihood_ratio(wins: int, losses: int, win_share: float) -> float:
    """log LR of "the candidate wins ``win_share`` of discordant pairs" against "half of them";
    ties carry no information and do not enter."""
    if not 0.5 < win_share < 1.0:
        raise ValueError(f"win_share must be in (0.5, 1), got {win_share}")
    return wins * math.log(2 * win_share) + losses * math.log(2 * (1 - win_share))


def stat_thresholds(alpha: float, beta: float) -> tuple[float, float]:
    """(ship at log LR ≥ this, reject at log LR ≤ this): log(1/alpha) and log(beta/(1 − alpha))."""
    if not 0.0 < alpha < 1.0 or not 0.0 < beta < 1.0 or alpha + beta >= 1.0:
        raise ValueError(f"alpha and beta must be in (0, 1) with alpha + beta < 1, got {alpha} and {beta}")
    return math.log(1 / alpha), math.log(beta / (1 - alpha))


def apparent_regression(pairs: Sequence[Pair]) -> bool:
    """A task looks regressed when its paired attempts hold more losses than wins."""
    c = pair_counts(pairs)
    return c.losses > c.wins


def regression_confirmed(fresh: Sequence[Pair], alpha: float) -> bool:
    """A regression is confirmed by a re-run alone (the pairs that made it look regressed are
    not used again): the sign test on the fresh pairs' losses is significant at ``alpha``."""
    c = pair_counts(fresh)
    return c.losses > 0 and sign_test(c.losses, c.wins) <= alpha


class StatResult(NamedTuple):
    outcome: Outcome
    reason: str
    evidence: Evidence  # every number the decision used


def stat_gate(
    pairs: Mapping[str, Sequence[Pair]],
    *,
    regressions: Collection[str] = (),
    alpha: float = STAT_ALPHA,
    beta: float = STAT_BETA,
    win_share: float = STAT_WIN_SHARE,
    exhausted: bool = False,
) -> StatResult:
    """The decision from the pooled paired attempts (task → pairs) and the confirmed regressions.

    Order: a confirmed regression rejects; then ``LR ≥ 1/alpha`` ships; ``LR ≤ beta/(1 − alpha)``
    rejects (harm when the sign test on losses is significant at ``alpha``, else no effect); else
    undecided, or, when ``exhausted`` (the pooled evidence reached its cap), rejected for no effect.
    The evidence holds every number the decision used."""
    ship_at, reject_at = stat_thresholds(alpha, beta)
    c = pair_counts(p for task_pairs in pairs.values() for p in task_pairs)
    llr = log_likelihood_ratio(c.wins, c.losses, win_share)
    p_gain, p_harm = sign_test(c.wins, c.losses), sign_test(c.losses, c.wins)
    evidence = Evidence(
        tasks=sum(1 for v in pairs.values() if v), pairs=c.pairs, wins=c.wins, losses=c.losses, both_pass=c.both,
        both_fail=c.neither, log_lr=llr, ship_at=ship_at, reject_at=reject_at, p_gain=p_gain, p_harm=p_harm,
        alpha=alpha, beta=beta, win_share=win_share, regressions=sorted(regressions))
    counts = f"{c.wins} wins / {c.losses} losses in {c.pairs} paired attempts on {evidence.tasks} task(s)"
    stat = f"log LR {llr:+.2f} (ship ≥ {ship_at:.2f}, reject ≤ {reject_at:.2f})"
    if regressions:
        return StatResult(Outcome.REJECT, f"reject: confirmed regression on {sorted(regressions)} "
                          f"(re-run, sign test p ≤ {alpha:g}); {counts}", evidence)
    if llr >= ship_at - TOLERANCE:
        return StatResult(Outcome.SHIP, f"ship: {counts}; {stat}, sign test p {p_gain:.3f}", evidence)
    if llr <= reject_at + TOLERANCE:
        what = (f"evidence of harm (sign test on losses p {p_harm:.3f} ≤ {alpha:g})" if p_harm <= alpha
                else "no effect at the designed size")
        return StatResult(Outcome.REJECT, f"reject: {what}; {counts}; {stat}", evidence)
    if exhausted:
        return StatResult(Outcome.REJECT, f"reject: no effect found with enough evidence (the pooled cap is spent); "
                          f"{counts}; {stat}", evidence)
    return StatResult(Outcome.UNDECIDED, f"undecided: not enough evidence yet; {counts}; {stat}", evidence)


NONINFERIORITY_MARGIN = 0.1
"""The pass rate an edit that only removes processors may cost at most, with confidence
1 − alpha, to ship: scaffolding retired at a loss of at most 10 points of pass@1 (the prompt it
saves is paid on every call)."""


def harm_upper_bound(wins: int, losses: int, pairs: int, alpha: float) -> float:
    """One-sided (1 − alpha) upper bound of the pass rate lost per paired attempt, (losses − wins) /
    pairs, given the discordant pairs: the exact Clopper–Pearson bound of the share of them that
    are losses. 0 pairs bound nothing (1.0)."""
    if pairs <= 0:
        return 1.0
    discordant = wins + losses
    if discordant == 0:
        return 0.0
    return discordant * (2 * loss_share_upper(losses, discordant, alpha) - 1) / pairs


def loss_share_upper(losses: int, n: int, alpha: float) -> float:
    """Clopper–Pearson one-sided upper bound of a binomial share: the q at which P(X ≤ losses) =
    alpha for X ~ Binomial(n, q) (bisection on the exact CDF; 1.0 when every trial is a loss)."""
    if losses >= n:
        return 1.0

    def cdf(q: float) -> float:
        return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(losses + 1))

    low, high = losses / n, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) > alpha else (low, mid)
    return high


def noninferiority_gate(
    pairs: Mapping[str, Sequence[Pair]],
    *,
    regressions: Collection[str] = (),
    alpha: float = STAT_ALPHA,
    margin: float = NONINFERIORITY_MARGIN,
    final: bool = True,
    exhausted: bool = False,
) -> StatResult:
    """The decision for an edit that only removes processors: it needs no gain, only evidence that
    it costs at most ``margin`` of pass rate. A confirmed regression rejects; so does a loss whose
    lower bound exceeds ``margin`` (evidence of harm beyond it); with the stage's budget spent
    (``final``), an upper bound of the loss (``harm_upper_bound``) within ``margin`` ships; else
    undecided, or rejected once the pooled evidence reached its cap (``exhausted``). Both bounds
    are one-sided at ``alpha``; the pooled evidence only grows, so an edit judged again is decided
    on more pairs each time."""
    c = pair_counts(p for task_pairs in pairs.values() for p in task_pairs)
    bound = harm_upper_bound(c.wins, c.losses, c.pairs, alpha)
    harm_lower = -harm_upper_bound(c.losses, c.wins, c.pairs, alpha)  # the bound on the gain, from below
    evidence = Evidence(
        tasks=sum(1 for v in pairs.values() if v), pairs=c.pairs, wins=c.wins, losses=c.losses, both_pass=c.both,
        both_fail=c.neither, harm_bound=bound, harm_lower=harm_lower, margin=margin, alpha=alpha,
        regressions=sorted(regressions), noninferiority=True)
    counts = f"{c.wins} wins / {c.losses} losses in {c.pairs} paired attempts on {evidence.tasks} task(s)"
    stat = f"pass rate lost ≤ {100 * bound:.1f} points at {100 * (1 - alpha):.0f}% (margin {100 * margin:.0f})"
    if regressions:
        return StatResult(Outcome.REJECT, f"reject: confirmed regression on {sorted(regressions)} "
                          f"(re-run, sign test p ≤ {alpha:g}); {counts}", evidence)
    if harm_lower > margin:
        return StatResult(Outcome.REJECT, f"reject: evidence that it costs more than the margin (at least "
                          f"{100 * harm_lower:.1f} points at {100 * (1 - alpha):.0f}%); {counts}", evidence)
    if final and bound <= margin + TOLERANCE:
        return StatResult(Outcome.SHIP, f"ship: a removal within the margin; {counts}; {stat}", evidence)
    if exhausted:
        return StatResult(Outcome.REJECT, f"reject: the loss is not bounded within the margin with the evidence "
                          f"the cap allows; {counts}; {stat}", evidence)
    return StatResult(Outcome.UNDECIDED, f"undecided: the loss is not bounded within the margin yet; {counts}; {stat}",
                      evidence)
