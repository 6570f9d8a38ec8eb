"""Stream metrics as pure functions: the pass-rate matrix, token cost per stage, FWT and BWT.

Notation (EvoHarnessBench §3.4, after Wang et al., 2024): stages j = 1 … T (stored 0-based),
a_{i,j} the pass rate of cohort j (the tasks introduced at stage j) on its evaluation split under
the system of stage i, defined for j ≤ i; ã_j the pass rate of cohort j under the task-specific
reference, where every task sees only its own annotated capabilities.

The paper puts its exact formulas in its Appendix C, which the seed text does not contain. It
cites Wang et al. (2024) for them and describes FWT as adaptation to the current-stage cohort
relative to the task-specific reference and BWT as the change of earlier cohorts as the harness
expands, so the formulas here are Wang et al.'s with ã_j as the reference:

    FWT = 1/(T−1) · Σ_{j=2}^{T} (a_{j,j} − ã_j)
    BWT = 1/(T−1) · Σ_{j=1}^{T−1} (a_{T,j} − a_{j,j})

Cells can be undefined (a cohort with no evaluation task); a sum then runs over the defined terms
and divides by their count, and a metric with no defined term (e.g. T = 1) is None.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from coevo.streams.outcomes import Outcome

Matrix = list[list[float | None]]
"""[stage i][cohort j] → a_{i,j}; None above the diagonal (j > i) and where no task was evaluated."""


def _check(o: Outcome, n_stages: int) -> None:
    if not (0 <= o.cohort < n_stages and 0 <= o.stage < n_stages):
        raise ValueError(f"outcome of {o.task_id!r} has stage {o.stage}, cohort {o.cohort}; "
                         f"both must be in 0..{n_stages - 1}")
    if o.cohort > o.stage:
        raise ValueError(f"outcome of {o.task_id!r}: cohort {o.cohort} is evaluated at stage {o.stage}, "
                         "before it was introduced")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pass_matrix(outcomes: Iterable[Outcome], n_stages: int) -> Matrix:
    """a_{i,j}: the mean over cohort j's tasks evaluated at stage i of each task's pass@1."""
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    for o in outcomes:
        _check(o, n_stages)
        cells[o.stage, o.cohort].append(o.rate)
    return [[_mean(cells.get((i, j), [])) if j <= i else None for j in range(n_stages)] for i in range(n_stages)]


def reference_rates(outcomes: Iterable[Outcome], n_stages: int) -> list[float | None]:
    """ã_j: the mean pass@1 of cohort j's tasks under the task-specific reference."""
    cells: dict[int, list[float]] = defaultdict(list)
    for o in outcomes:
        _check(o, n_stages)
        cells[o.cohort].append(o.rate)
    return [_mean(cells.get(j, [])) for j in range(n_stages)]


def stage_tokens(outcomes: Iterable[Outcome], n_stages: int) -> list[int]:
    """Tokens (prompt + completion, every attempt) spent evaluating at each stage."""
    totals = [0] * n_stages
    for o in outcomes:
        _check(o, n_stages)
        totals[o.stage] += o.tokens
    return totals


def _square(matrix: Matrix) -> int:
    n = len(matrix)
    if any(len(row) != n for row in matrix):
        raise ValueError(f"the pass matrix must be square (stages x cohorts), got rows of {[len(r) for r in matrix]}")
    return n


def forward_transfer(matrix: Matrix, reference: Sequence[float | None]) -> float | None:
    """FWT = 1/(T−1) Σ_{j=2}^{T} (a_{j,j} − ã_j): how each new cohort fares on the cumulative
    harness of its stage, against each task seeing only its own capabilities (see module)."""
    n = _square(matrix)
    if len(reference) != n:
        raise ValueError(f"reference has {len(reference)} cohorts, the matrix {n}")
    terms = [matrix[j][j] - reference[j] for j in range(1, n)  # type: ignore[operator]
             if matrix[j][j] is not None and reference[j] is not None]
    return _mean(terms)


def backward_transfer(matrix: Matrix) -> float | None:
    """BWT = 1/(T−1) Σ_{j=1}^{T−1} (a_{T,j} − a_{j,j}): how earlier cohorts fare at the last stage
    against when they were introduced; negative is forgetting."""
    n = _square(matrix)
    last = n - 1
    terms = [matrix[last][j] - matrix[j][j] for j in range(last)  # type: ignore[operator]
             if matrix[last][j] is not None and matrix[j][j] is not None]
    return _mean(terms)


def final_pass_rate(matrix: Matrix) -> float | None:
    """The mean of the last row over defined cohorts: how every cohort fares at the last stage."""
    n = _square(matrix)
    return _mean([v for v in matrix[n - 1] if v is not None]) if n else None
