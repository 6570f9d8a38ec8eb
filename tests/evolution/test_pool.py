"""Snapshot pool selection and serialisation; patience counters."""

from __future__ import annotations

import json
import random

import pytest

from coevo.evolution.pool import Patience, SnapshotPool
from coevo.harness.defaults import base_harness
from coevo.harness.harness import Harness


def variant_harness(i: int) -> Harness:
    return base_harness().set_param("system_prompt", "template", f"You are solver number {i}.")


def filled_pool(n: int = 4) -> tuple[SnapshotPool, list[Harness]]:
    pool = SnapshotPool()
    hs = [variant_harness(i) for i in range(n)]
    for i, h in enumerate(hs):
        pool.add(h, round=i, variant="base" if i % 2 == 0 else "alt", score=0.1 * i, verdict=f"ship {i}")
    return pool, hs


def slow_best(snapshots, scores):
    best_score, best = None, None
    for s in snapshots:
        if best_score is None or scores[s.harness_id] > best_score:
            best_score, best = scores[s.harness_id], s
    return best


def test_best_picks_highest_and_earlier_on_ties(monkeypatch):
    pool, hs = filled_pool()
    scores = {hs[0].id: 0.5, hs[1].id: 0.7, hs[2].id: 0.7, hs[3].id: 0.6}
    # harness objects are never compared during selection
    monkeypatch.setattr(Harness, "__eq__", lambda self, other: pytest.fail("compared harness objects"))
    monkeypatch.setattr(Harness, "__lt__", lambda self, other: pytest.fail("compared harness objects"), raising=False)
    assert pool.best(scores).index == 1
    assert pool.best(scores, variant="base").index == 2
    assert pool.best({h.id: 0.0 for h in hs}).index == 0


def test_best_agrees_with_loop_twin():
    rng = random.Random(3)
    pool, hs = filled_pool(6)
    for _ in range(200):
        scores = {h.id: rng.choice([0.0, 0.25, 0.5, 0.75]) for h in hs}
        assert pool.best(scores) is slow_best(list(pool), scores)


def test_best_considers_scored_snapshots_only_and_errors():
    pool, hs = filled_pool(3)
    assert pool.best({hs[1].id: 0.1, hs[2].id: 0.2}).index == 2
    assert pool.best({hs[0].id: 0.9, hs[1].id: 0.1}, variant="alt").index == 1
    with pytest.raises(ValueError, match="no scored snapshot"):
        SnapshotPool().best({})
    with pytest.raises(ValueError, match="not in the pool: \\['elsewhere'\\]"):
        pool.best({hs[0].id: 0.5, "elsewhere": 0.9})
    with pytest.raises(ValueError, match="finite"):
        pool.best({hs[0].id: float("nan"), hs[1].id: 0.1})
    with pytest.raises(ValueError, match="variant 'nope'"):
        pool.best({hs[0].id: 0.5}, variant="nope")


def test_add_keeps_first_entry_of_a_harness_and_validates():
    pool, hs = filled_pool(2)
    again = pool.add(variant_harness(0), round=9, variant="base", score=0.9)
    assert again.round == 0 and len(pool) == 2
    assert hs[1].id in pool and pool.get("missing") is None
    assert [s.index for s in pool.snapshots] == [0, 1] and [s.index for s in pool.of_variant("alt")] == [1]
    with pytest.raises(ValueError, match="score"):
        pool.add(variant_harness(5), round=1, variant="base", score=float("inf"))
    with pytest.raises(TypeError, match="Harness"):
        pool.add("not a harness", round=1, variant="base", score=0.1)  # type: ignore[arg-type]


def test_pool_round_trips_through_json():
    pool, hs = filled_pool()
    data = json.loads(json.dumps(pool.to_dict()))
    loaded = SnapshotPool.from_dict(data)
    assert [(s.harness_id, s.round, s.variant, s.score, s.verdict, s.index) for s in loaded] == [
        (s.harness_id, s.round, s.variant, s.score, s.verdict, s.index) for s in pool
    ]
    assert [s.harness.parent_id for s in loaded] == [h.parent_id for h in hs]
    scores = {h.id: 0.3 for h in hs} | {hs[3].id: 0.9}
    assert loaded.best(scores).harness_id == hs[3].id


def test_pool_refuses_a_harness_that_loads_differently():
    pool, _ = filled_pool(1)
    data = pool.to_dict()
    data["snapshots"][0]["harness"]["processors"][1]["params"]["template"] = "tampered"
    with pytest.raises(ValueError, match="saved as"):
        SnapshotPool.from_dict(data)
    with pytest.raises(ValueError, match="snapshots"):
        SnapshotPool.from_dict({})


def test_patience_counts_consecutive_misses():
    p = Patience(rounds=3, batches=2, epochs=2)
    assert p.update(round_shipped=False) is None
    assert p.update(round_shipped=True) is None and p.stale_rounds == 0
    p.update(batch_accepted=False)
    assert p.update(batch_accepted=False) == "batches"
    assert p.exhausted == "batches"
    # a new epoch resets the batch counter; the first score is the baseline
    assert p.update(epoch_score=0.4) is None and p.best_val == 0.4 and p.stale_batches == 0
    assert p.update(epoch_score=0.4) is None and p.stale_epochs == 1  # equal is not an improvement
    assert p.update(epoch_score=0.5) is None and p.stale_epochs == 0
    p.update(epoch_score=0.45)
    assert p.update(epoch_score=0.5) == "epochs"
    q = Patience(rounds=2, batches=5, epochs=5)
    q.update(round_shipped=False)
    assert q.update(round_shipped=False, batch_accepted=False) == "rounds"


def test_patience_reports_stopping_levels_first():
    p = Patience(rounds=1, batches=1, epochs=1)
    p.update(batch_accepted=False)
    assert p.exhausted == "batches"
    p.update(round_shipped=False)
    assert p.exhausted == "rounds"
    p.update(epoch_score=0.1)
    p.update(epoch_score=0.1)
    assert p.exhausted == "epochs"


def test_patience_round_trips_and_validates():
    p = Patience(rounds=3, batches=4, epochs=5)
    p.update(round_shipped=False, batch_accepted=False, epoch_score=0.3)
    p.update(epoch_score=0.2)
    q = Patience.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q == p and q.to_dict() == p.to_dict()
    with pytest.raises(ValueError, match="patience batches"):
        Patience(rounds=1, batches=0, epochs=1)
    with pytest.raises(ValueError, match="unknown Patience fields"):
        Patience.from_dict({"rounds": 1, "batches": 1, "epochs": 1, "bogus": 2})
    with pytest.raises(ValueError, match="epoch_score"):
        p.update(epoch_score=float("nan"))
