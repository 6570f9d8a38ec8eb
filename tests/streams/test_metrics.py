"""Every stream metric against a slow, explicit loop twin on random inputs (with undefined cells),
plus a hand-computed example and the errors."""

from __future__ import annotations

import random

import pytest

from coevo.streams.metrics import (
    backward_transfer,
    final_pass_rate,
    forward_transfer,
    pass_matrix,
    reference_rates,
    stage_tokens,
)
from coevo.streams.outcomes import Outcome


def random_matrix(rng: random.Random, n: int, holes: float = 0.2) -> list[list[float | None]]:
    return [[(None if rng.random() < holes else rng.random()) if j <= i else None for j in range(n)]
            for i in range(n)]


def fwt_twin(a, ref):
    """1/(T−1) Σ_{j=2}^{T} (a_{j,j} − ã_j), 1-based as in the paper, over defined terms."""
    total, count = 0.0, 0
    T = len(a)
    for j in range(2, T + 1):
        diag, r = a[j - 1][j - 1], ref[j - 1]
        if diag is not None and r is not None:
            total += diag - r
            count += 1
    return total / count if count else None


def bwt_twin(a):
    """1/(T−1) Σ_{j=1}^{T−1} (a_{T,j} − a_{j,j}), 1-based, over defined terms."""
    total, count = 0.0, 0
    T = len(a)
    for j in range(1, T):
        last, diag = a[T - 1][j - 1], a[j - 1][j - 1]
        if last is not None and diag is not None:
            total += last - diag
            count += 1
    return total / count if count else None


def random_outcomes(rng: random.Random, n: int) -> list[Outcome]:
    out = []
    for stage in range(n):
        for cohort in range(stage + 1):
            for k in range(rng.randint(0, 4)):
                attempts = tuple(rng.random() < 0.5 for _ in range(rng.randint(1, 3)))
                out.append(Outcome(stage, cohort, f"c{cohort}-t{k}", attempts, rng.randint(0, 500), "h"))
    rng.shuffle(out)
    return out


def matrix_twin(outcomes, n):
    a = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            rates = []
            for o in outcomes:
                if o.stage == i and o.cohort == j:
                    rates.append(sum(1 for p in o.passed if p) / len(o.passed))
            if rates:
                a[i][j] = sum(rates) / len(rates)
    return a


def close(x, y):
    if x is None or y is None:
        return x is None and y is None
    return x == pytest.approx(y, abs=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_transfer_metrics_match_their_loop_twins(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    a = random_matrix(rng, n, holes=rng.choice([0.0, 0.3]))
    ref = [None if rng.random() < 0.2 else rng.random() for _ in range(n)]
    assert close(forward_transfer(a, ref), fwt_twin(a, ref))
    assert close(backward_transfer(a), bwt_twin(a))
    last = [v for v in a[-1] if v is not None]
    assert close(final_pass_rate(a), sum(last) / len(last) if last else None)


@pytest.mark.parametrize("seed", range(20))
def test_matrix_reference_and_tokens_match_their_loop_twins(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    outcomes = random_outcomes(rng, n)
    got = pass_matrix(outcomes, n)
    want = matrix_twin(outcomes, n)
    assert all(close(g, w) for gr, wr in zip(got, want, strict=True) for g, w in zip(gr, wr, strict=True))
    assert all(got[i][j] is None for i in range(n) for j in range(i + 1, n))
    tokens = [0] * n
    for o in outcomes:
        tokens[o.stage] += o.tokens
    assert stage_tokens(outcomes, n) == tokens
    # the reference: outcomes at their own cohort's stage
    ref_outcomes = [o for o in outcomes if o.stage == o.cohort]
    ref = reference_rates(ref_outcomes, n)
    assert all(close(ref[j], matrix_twin(ref_outcomes, n)[j][j]) for j in range(n))


def test_a_hand_computed_stream():
    a = [[1.0, None, None], [0.5, 0.0, None], [0.25, 1.0, 0.5]]
    ref = [0.0, 0.5, 1.0]
    assert forward_transfer(a, ref) == pytest.approx(((0.0 - 0.5) + (0.5 - 1.0)) / 2)  # stage 0 excluded
    assert backward_transfer(a) == pytest.approx(((0.25 - 1.0) + (1.0 - 0.0)) / 2)
    assert final_pass_rate(a) == pytest.approx(1.75 / 3)
    assert forward_transfer([[0.7]], [0.1]) is None and backward_transfer([[0.7]]) is None


def test_pass_rate_is_the_mean_of_per_task_attempt_rates():
    outcomes = [Outcome(0, 0, "a", (True, False), 3, "h"), Outcome(0, 0, "b", (True, True, True, False), 4, "h")]
    assert pass_matrix(outcomes, 1) == [[pytest.approx((0.5 + 0.75) / 2)]]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="before it was introduced"):
        pass_matrix([Outcome(0, 1, "x", (True,), 0, "h")], 2)
    with pytest.raises(ValueError, match="must be in 0..1"):
        stage_tokens([Outcome(2, 0, "x", (True,), 0, "h")], 2)
    with pytest.raises(ValueError, match="square"):
        backward_transfer([[1.0, None], [1.0]])
    with pytest.raises(ValueError, match="reference has 1 cohorts"):
        forward_transfer([[1.0, None], [1.0, 1.0]], [1.0])
