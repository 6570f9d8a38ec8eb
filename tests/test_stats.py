"""coevo.report.stats and coevo.report.experiment: the paired task bootstrap every experiment report's
intervals come from, and the arm differences and tables built on it."""

from __future__ import annotations

import numpy as np
import pytest

from coevo.report.experiment import markdown_table, paired_differences
from coevo.report.stats import bootstrap, interval, points, wilson


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


def test_a_difference_of_arms_pairs_each_task_with_itself():
    """Arm b passes what arm a passes plus 10 of 100 tasks: paired, b - a is tight around +10 and
    excludes 0, though the two arms' own intervals overlap. Shuffling b's tasks breaks the pairing
    and the interval of the difference widens past 0."""
    rng = np.random.default_rng(1)
    base = rng.random(100) < 0.4
    extra = np.zeros(100, bool)
    extra[np.flatnonzero(~base)[:10]] = True
    a, b = base[None].astype(float), (base | extra)[None].astype(float)  # [seeds, tasks]
    d = paired_differences({"a": a, "b": b}, [("b", "a")], np.random.default_rng(0))["b - a"]
    assert d["seeds"] == 1 and d["points"][0] == pytest.approx(10.0) and 0 < d["points"][1] < 10 < d["points"][2] < 20
    assert points(a, rng)[2] > points(b, rng)[1]  # unpaired: the arms' intervals overlap
    shuffled = {"a": a, "b": b[:, np.random.default_rng(2).permutation(100)]}
    assert paired_differences(shuffled, [("b", "a")], np.random.default_rng(0))["b - a"]["points"][1] < 0


def test_differences_use_the_seeds_both_arms_hold_and_need_the_same_tasks():
    scores = {"a": np.zeros((3, 4)), "b": np.ones((2, 4)), "c": np.ones((1, 5))}
    out = paired_differences(scores, [("b", "a"), ("a", "missing")], np.random.default_rng(0))
    assert list(out) == ["b - a"] and out["b - a"]["seeds"] == 2 and out["b - a"]["points"][0] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="different numbers of tasks"):
        paired_differences(scores, [("c", "a")], np.random.default_rng(0))


def test_markdown_table_rows_match_the_header():
    assert markdown_table(["arm", "pass"], [["a", 1], ["b", "2.0"]]) == "| arm | pass |\n|---|---|\n| a | 1 |\n| b | 2.0 |"
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["arm", "pass"], [["a"]])


def test_wilson_interval_hand_computed():
    assert tuple(round(v, 3) for v in wilson(16, 20)) == (0.584, 0.919)
    assert tuple(round(v, 3) for v in wilson(8, 10)) == (0.490, 0.943)
    assert wilson(0, 20)[0] == 0.0 and round(wilson(0, 20)[1], 3) == 0.161
    assert wilson(0, 0) == (0.0, 1.0)  # no trials: nothing is known
