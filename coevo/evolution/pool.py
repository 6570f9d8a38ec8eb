"""The snapshot pool and the patience counters (HarnessEvolve §3.5, Algorithm 2).

Every harness the Critic accepts joins the pool; at epoch end the best snapshot on the
validation split becomes the current harness. The pool keeps each snapshot's provenance (round,
variant, train-batch score, verdict summary) so a run directory shows where the winner came from,
and serialises harnesses through ``Harness.to_dict`` so an interrupted run resumes with the same
pool. Selection is by harness id and insertion order only: harness objects are never compared.

Patience ends work that has stopped paying off: consecutive rounds without a shipped edit
(HarnessX early stopping), consecutive batches without an accepted edit (HarnessEvolve's
P_batch: ends the epoch early) and consecutive epochs without a validation improvement (P_ep:
ends the run).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from coevo.harness.harness import Harness


@dataclass(frozen=True)
class Snapshot:
    """An accepted harness and where it came from. ``index`` is its position in the pool."""

    harness: Harness
    round: int
    variant: str
    score: float  # pass rate on the training batch it was accepted on
    verdict: str
    index: int

    @property
    def harness_id(self) -> str:
        return self.harness.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "harness": self.harness.to_dict(),
            "round": self.round,
            "variant": self.variant,
            "score": self.score,
            "verdict": self.verdict,
        }


class SnapshotPool:
    """Accepted snapshots in acceptance order; one entry per harness id."""

    def __init__(self) -> None:
        self._snapshots: list[Snapshot] = []

    def add(self, harness: Harness, *, round: int, variant: str, score: float, verdict: str = "") -> Snapshot:
        """Add an accepted harness. A harness already in the pool (same id: an edit that led back
        to an earlier harness) keeps its first entry, which is returned."""
        if not isinstance(harness, Harness):
            raise TypeError(f"harness must be a Harness, got {type(harness).__name__}")
        if not _finite(score):
            raise ValueError(f"score must be a finite number, got {score!r}")
        existing = self.get(harness.id)
        if existing is not None:
            return existing
        snap = Snapshot(harness, int(round), str(variant), float(score), str(verdict), len(self._snapshots))
        self._snapshots.append(snap)
        return snap

    def get(self, harness_id: str) -> Snapshot | None:
        return next((s for s in self._snapshots if s.harness_id == harness_id), None)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(self._snapshots)

    def __contains__(self, harness_id: object) -> bool:
        return any(s.harness_id == harness_id for s in self._snapshots)

    @property
    def snapshots(self) -> list[Snapshot]:
        """All snapshots in acceptance order (a copy)."""
        return list(self._snapshots)

    def of_variant(self, variant: str) -> list[Snapshot]:
        return [s for s in self._snapshots if s.variant == variant]

    def best(self, scores: Mapping[str, float], *, variant: str | None = None) -> Snapshot:
        """The snapshot with the highest validation score (``scores``: harness id → score) among
        the scored snapshots (of ``variant`` when given); on a tie the earlier snapshot wins, so
        selection never moves to an equally good newcomer.

        Every id in ``scores`` must be in the pool: a harness outside it has no place in the
        acceptance order, so add the starting harness first (HarnessEvolve's pool starts with it).
        """
        unknown = sorted(set(scores) - {s.harness_id for s in self._snapshots})
        if unknown:
            raise ValueError(f"scores name harness ids that are not in the pool: {unknown}; add them first")
        candidates = [s for s in self._snapshots
                      if (variant is None or s.variant == variant) and s.harness_id in scores]
        if not candidates:
            raise ValueError("no scored snapshot in the pool" + (f" for variant {variant!r}" if variant else ""))
        bad = {s.harness_id: scores[s.harness_id] for s in candidates if not _finite(scores[s.harness_id])}
        if bad:
            raise ValueError(f"validation scores must be finite numbers, got {bad}")
        best = candidates[0]
        for s in candidates[1:]:
            if scores[s.harness_id] > scores[best.harness_id]:
                best = s
        return best

    def to_dict(self) -> dict[str, Any]:
        return {"snapshots": [s.to_dict() for s in self._snapshots]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SnapshotPool:
        """Rebuild a pool; each harness must hash to the id it was saved with (a changed
        processor library would otherwise resume from silently different harnesses)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a snapshot pool dict must be a mapping, got {type(data).__name__}")
        if "snapshots" not in data:
            raise ValueError("a snapshot pool dict needs a 'snapshots' list")
        if not isinstance(data["snapshots"], list):
            raise TypeError(f"'snapshots' must be a list, got {type(data['snapshots']).__name__}")
        pool = cls()
        for i, item in enumerate(data["snapshots"]):
            harness = Harness.from_dict(item["harness"])
            saved = item["harness"].get("id")
            if saved is not None and saved != harness.id:
                raise ValueError(f"snapshot {i}: harness was saved as {saved} but loads as {harness.id}")
            pool.add(
                harness,
                round=item["round"],
                variant=item["variant"],
                score=item["score"],
                verdict=item.get("verdict", ""),
            )
        return pool


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


LEVELS = ("rounds", "batches", "epochs")


@dataclass
class Patience:
    """Counters of consecutive rounds without a shipped edit, batches without an accepted edit,
    and epochs without a validation improvement; each limit is ≥ 1, or None (the default): that
    level never runs out.

    ``update(epoch_score=...)`` also starts a new epoch, so the batch counter resets (HarnessEvolve
    keeps counting across epochs, which ends every epoch after the first at its first rejection
    once patience ran out). The first epoch score seen is the baseline: pass the starting
    harness's validation score once before the first epoch to make later epochs beat it.
    """

    rounds: int | None = None
    batches: int | None = None
    epochs: int | None = None
    stale_rounds: int = 0
    stale_batches: int = 0
    stale_epochs: int = 0
    best_val: float | None = None

    def __post_init__(self) -> None:
        for level in LEVELS:
            limit = getattr(self, level)
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ValueError(f"patience {level} must be an integer >= 1 or None, got {limit!r}")

    def update(
        self,
        *,
        round_shipped: bool | None = None,
        batch_accepted: bool | None = None,
        epoch_score: float | None = None,
    ) -> str | None:
        """Record the end of a round (did any edit ship?), of a batch (was an edit accepted?)
        and/or of an epoch (validation score of the selected snapshot); returns ``exhausted``."""
        if round_shipped is not None:
            self.stale_rounds = 0 if round_shipped else self.stale_rounds + 1
        if batch_accepted is not None:
            self.stale_batches = 0 if batch_accepted else self.stale_batches + 1
        if epoch_score is not None:
            if not _finite(epoch_score):
                raise ValueError(f"epoch_score must be a finite number, got {epoch_score!r}")
            if self.best_val is None or epoch_score > self.best_val:
                self.best_val = float(epoch_score)
                self.stale_epochs = 0
            else:
                self.stale_epochs += 1
            self.stale_batches = 0
        return self.exhausted

    @property
    def exhausted(self) -> str | None:
        """Which patience ran out: ``"epochs"`` or ``"rounds"`` (stop the run) before
        ``"batches"`` (end the epoch), or None."""
        for level in ("epochs", "rounds", "batches"):
            limit = getattr(self, level)
            if limit is not None and getattr(self, f"stale_{level}") >= limit:
                return level
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "batches": self.batches,
            "epochs": self.epochs,
            "stale_rounds": self.stale_rounds,
            "stale_batches": self.stale_batches,
            "stale_epochs": self.stale_epochs,
            "best_val": self.best_val,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Patience:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown Patience fields {unknown}; expected {sorted(cls.__dataclass_fields__)}")
        return cls(**data)
