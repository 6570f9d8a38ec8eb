"""Stream construction: the paper's guarantees on random annotated task sets, frequency-ranked
release, determinism, splits and limits, and clear errors."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter

import pytest

from coevo.envs.base import Task
from coevo.streams.construct import StreamError, build_stream, check_stream, release_schedule
from tests.streams.toolbox import make_tasks

TOOLS = [f"t{k}" for k in range(9)]


def random_tasks(seed: int, n: int = 80) -> list[Task]:
    """Tasks needing 0–3 tools drawn with skewed weights (a core and a long tail), random splits,
    and capabilities of another axis mixed in."""
    rng = random.Random(seed)
    weights = [2.0**-k for k in range(len(TOOLS))]
    tasks = []
    for i in range(n):
        k = rng.choice([0, 1, 1, 2, 2, 3])
        tools = {rng.choices(TOOLS, weights)[0] for _ in range(k)}
        caps = tuple(f"tool:{t}" for t in sorted(tools)) + (f"skill:s{rng.randint(0, 3)}",)
        tasks.append(Task(f"task-{seed}-{i}", "rand", "q", rng.choice(["train", "val", "test"]), i, capabilities=caps))
    return tasks


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stages", [1, 2, 3, 5, 20])
def test_guarantees_hold_on_random_task_sets(seed, stages):
    tasks = random_tasks(seed)
    s = build_stream(tasks, prefix="tool:", stages=stages, seed=seed)
    needs = {t.task_id: frozenset(c[5:] for c in t.capabilities if c.startswith("tool:")) for t in tasks}
    universe = set().union(*needs.values())
    assert s.n_stages == min(stages, len(universe))
    # every capability released exactly once; bucket sizes differ by at most one
    assert sorted(c for b in s.released for c in b) == sorted(universe)
    assert max(map(len, s.released)) - min(map(len, s.released)) <= 1
    # frequency order: counts never increase along the release order, ties by name
    freq = Counter(c for caps in needs.values() for c in caps)
    assert dict(s.frequency) == dict(freq)
    order = list(s.universe)
    assert all((-freq[a], a) < (-freq[b], b) for a, b in itertools.pairwise(order))
    # cumulative sets: nested, the running union, nothing removed
    for k in range(s.n_stages):
        assert s.cumulative[k] == frozenset(c for b in s.released[: k + 1] for c in b)
        if k:
            assert s.cumulative[k - 1] < s.cumulative[k]
    # every task in exactly one cohort, at the earliest feasible stage, with pressure
    placed = [t.task_id for c in s.cohorts for t in c]
    assert sorted(placed) == sorted(t.task_id for t in tasks)
    for k, cohort in enumerate(s.cohorts):
        for t in cohort:
            caps = needs[t.task_id]
            assert caps <= s.cumulative[k]  # feasibility
            if caps:
                assert caps & set(s.released[k])  # new-capability pressure
                assert k == 0 or not caps <= s.cumulative[k - 1]  # earliest
            else:
                assert k == 0
    # splits: the tasks' own, disjoint, nothing dropped without limits
    for k in range(s.n_stages):
        assert {t.task_id for t in s.adapt[k]} == {t.task_id for t in s.cohorts[k] if t.split == "train"}
        assert {t.task_id for t in s.evaluate[k]} == {t.task_id for t in s.cohorts[k] if t.split == "val"}


def test_release_is_frequency_ranked_with_name_ties():
    assert release_schedule({"a": 1, "b": 5, "c": 5, "d": 2}, 2) == (("b", "c"), ("d", "a"))
    assert release_schedule({"a": 1, "b": 5, "c": 5, "d": 2}, 3) == (("b", "c"), ("d",), ("a",))
    assert release_schedule({"x": 3, "y": 1}, 9) == (("x",), ("y",))  # clipped to |U|


def test_toolbox_stream_releases_core_tools_first():
    s = build_stream(make_tasks(), prefix="tool:", stages=3)
    assert s.released == (("add",), ("mul",), ("neg",))
    assert [sorted(t.task_id for t in c) for c in s.cohorts][1:] == [[f"mul-{i}" for i in range(6)],
                                                                     [f"neg-{i}" for i in range(4)]]
    assert {t.task_id for t in s.cohorts[0]} == {f"add-{i}" for i in range(8)} | {"plain-0", "plain-1"}
    two = build_stream(make_tasks(), prefix="tool:", stages=2)
    assert two.released == (("add", "mul"), ("neg",))


def test_a_task_needing_core_and_tail_tools_waits_for_the_tail():
    tasks = make_tasks() + [Task("both", "toolbox", "q", "val", 0, capabilities=("tool:add", "tool:neg"))]
    s = build_stream(tasks, prefix="tool:", stages=3)
    assert s.stage_of("both") == 2 and s.stage_of("add-0") == 0


def test_construction_is_deterministic_and_independent_of_input_order():
    tasks = random_tasks(7, n=60)
    a = build_stream(tasks, prefix="tool:", stages=4, adapt_limit=3, eval_limit=2, seed=5)
    shuffled = list(tasks)
    random.Random(1).shuffle(shuffled)
    b = build_stream(shuffled, prefix="tool:", stages=4, adapt_limit=3, eval_limit=2, seed=5)
    assert a.released == b.released and a.cumulative == b.cumulative
    assert [[t.task_id for t in c] for c in a.adapt] == [[t.task_id for t in c] for c in b.adapt]
    assert [[t.task_id for t in c] for c in a.evaluate] == [[t.task_id for t in c] for c in b.evaluate]
    assert a == build_stream(tasks, prefix="tool:", stages=4, adapt_limit=3, eval_limit=2, seed=5)
    other = build_stream(tasks, prefix="tool:", stages=4, adapt_limit=3, eval_limit=2, seed=6)
    assert [[t.task_id for t in c] for c in other.adapt] != [[t.task_id for t in c] for c in a.adapt]


def test_limits_and_eval_splits():
    tasks = random_tasks(3, n=120)
    s = build_stream(tasks, prefix="tool:", stages=3, eval_splits=("val", "test"), adapt_limit=2, eval_limit=4)
    for k in range(s.n_stages):
        assert len(s.adapt[k]) <= 2 and all(t.split == "train" for t in s.adapt[k])
        assert len(s.evaluate[k]) <= 4 and all(t.split in ("val", "test") for t in s.evaluate[k])
    assert any(t.split == "test" for c in s.evaluate for t in c)
    assert any(len(c) == 4 for c in s.evaluate)


@pytest.mark.parametrize("stages", [0, -2, 1.5, "3", True])
def test_bad_stage_counts_are_refused(stages):
    with pytest.raises(ValueError, match="stages must be an integer >= 1"):
        build_stream(make_tasks(), prefix="tool:", stages=stages)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="no task has a capability with prefix 'agent:'"):
        build_stream(make_tasks(), prefix="agent:", stages=2)
    with pytest.raises(ValueError, match="no task has a capability"):
        build_stream([], prefix="tool:", stages=2)
    with pytest.raises(ValueError, match="eval_splits must be a non-empty subset of"):
        build_stream(make_tasks(), prefix="tool:", stages=2, eval_splits=("train",))
    with pytest.raises(ValueError, match="not the string"):
        build_stream(make_tasks(), prefix="tool:", stages=2, eval_splits="val")
    with pytest.raises(ValueError, match="adapt_limit must be"):
        build_stream(make_tasks(), prefix="tool:", stages=2, adapt_limit=-1)
    with pytest.raises(ValueError, match="unique ids"):
        build_stream(make_tasks() + make_tasks()[:1], prefix="tool:", stages=2)


def _move(stream, task_id, to):
    cohorts = [[t for t in c if t.task_id != task_id] for c in stream.cohorts]
    task = next(t for c in stream.cohorts for t in c if t.task_id == task_id)
    cohorts[to].append(task)
    return dataclasses.replace(stream, cohorts=tuple(map(tuple, cohorts)),
                               adapt=tuple(() for _ in cohorts), evaluate=tuple(() for _ in cohorts))


def test_check_stream_catches_every_broken_guarantee():
    s = build_stream(make_tasks(), prefix="tool:", stages=3)
    check_stream(s)
    with pytest.raises(StreamError, match="new-capability pressure"):
        check_stream(_move(s, "add-0", 1))
    with pytest.raises(StreamError, match="feasibility"):
        check_stream(_move(s, "neg-0", 1))
    with pytest.raises(StreamError, match="needs nothing on the axis"):
        check_stream(_move(s, "plain-0", 2))
    with pytest.raises(StreamError, match="cumulative"):
        check_stream(dataclasses.replace(s, cumulative=(s.cumulative[0], s.cumulative[0], s.cumulative[2])))
    with pytest.raises(StreamError, match="in cohorts"):
        check_stream(dataclasses.replace(s, cohorts=(s.cohorts[0], s.cohorts[1] + s.cohorts[0][:1], s.cohorts[2])))
    with pytest.raises(StreamError, match="disjoint"):
        check_stream(dataclasses.replace(s, evaluate=(s.adapt[0], s.evaluate[1], s.evaluate[2])))
