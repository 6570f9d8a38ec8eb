"""coevo.report.stats: the paired task bootstrap every experiment report's intervals come from."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.report.stats import bootstrap, interval, points


def test_seeds_that_agree_add_no_information_because_every_seed_draws_the_same_tasks():
    """Two seeds that scored every task alike carry the information of one: the interval must be
    the one seed's (the same task draw for every seed). Drawing each seed's tasks apart would
    average two independent draws and narrow the interval by about 1/sqrt(2), an interval that
    covers the truth far less often than it says."""
    x = (np.random.default_rng(0).random(100) < 0.3).astype(float)  # [tasks]
    one = bootstrap(x[None], np.random.default_rng(1))
    assert bootstrap(np.vstack([x, x]), np.random.default_rng(1)) == pytest.approx(one)
    lo, hi = one[1], one[2]
    assert 0.12 < hi - lo < 0.25  # ~±1.96·sqrt(0.3·0.7/100)


def test_the_interval_covers_the_true_rate_about_95_times_in_100():
    """Coverage, the property an interval exists for: 200 experiments of 100 tasks at a 30% pass rate."""
    covered = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        _, lo, hi = bootstrap((rng.random((1, 100)) < 0.3).astype(float), rng, resamples=2000)
        covered += lo <= 0.3 <= hi
    assert 0.90 <= covered / 200 <= 0.99


def test_points_and_interval_format_what_the_reports_print():
    scores = np.array([[1.0, 0.0, 1.0, 1.0]])
    v = points(scores, np.random.default_rng(0))
    assert v[0] == pytest.approx(75.0) and 0 <= v[1] <= 75 <= v[2] <= 100
    assert interval([12.0, 4.04, 20.0]) == "12.0 [4.0, 20.0]"
    assert interval([12.0, -4.0, 20.0], signed=True) == "+12.0 [-4.0, +20.0]"
