"""Confidence intervals the experiment scripts report: a paired task bootstrap.

Pass rates here are means over a fixed set of sealed test tasks, run once per seed; the noise that
matters is which tasks the set happens to hold. Resampling tasks (the same draw for every seed, and
for both sides of a difference) keeps each task paired with itself, which removes the between-task
variance that unpaired intervals would carry (scripts/ablation.py, scripts/learning_curve.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000


def bootstrap(scores: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of the mean of ``scores`` [seeds, tasks] over task resamples:
    tasks are drawn with replacement and every seed keeps its own score for each drawn task (paired
    across seeds; for a difference of two arms, or of after and before, paired across those too)."""
    n = scores.shape[1]
    idx = rng.integers(0, n, size=(resamples, n))  # [resamples, tasks]
    means = scores[:, idx].mean(axis=(0, 2))  # [seeds, resamples, tasks] -> [resamples]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(scores.mean()), float(lo), float(hi)


def points(scores: np.ndarray, rng: np.random.Generator) -> list[float]:
    """``bootstrap`` of 0/1 (or share) scores in percentage points: [mean, 2.5th, 97.5th] × 100."""
    return [100 * v for v in bootstrap(scores, rng)]


def interval(v: Sequence[float], signed: bool = False) -> str:
    """An estimate with its interval as the experiment reports print it: ``12.0 [4.0, 20.0]``, or
    for a difference (``signed``) ``+12.0 [+4.0, +20.0]``."""
    sign = "+" if signed else ""
    return f"{v[0]:{sign}.1f} [{v[1]:{sign}.1f}, {v[2]:{sign}.1f}]"


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% at z = 1.96): for rates over
    independent trials (how often a gate ships an edit), where the bootstrap above is for tasks."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
