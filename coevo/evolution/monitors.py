"""``Monitors``: the pathology monitors of one variant (HarnessX §4.2, §6.6) in one object.

Per-edit gates cannot see pathologies of a run: an edit can pass the seesaw gate and still
exploit the verifier's format, several edits that each pass can together forget what earlier
snapshots solved, and a Planner stuck in one dimension keeps proposing edits that pass nothing.
``Monitors`` keeps the run's history (judged proposals, pass rates per round, per-task outcomes),
calls the checks of ``coevo.evolution.pathologies`` on it, raises their ``Alert``s (logged to
``coevo.evolution``) and returns multipliers on the Planner's dimension priorities
(``PlanContext.priorities``). ``priorities()`` is derived from its state alone, so a resumed run
(``load_state_dict``) plans exactly as the uninterrupted one would. The rules and their defaults
are stated in ``coevo.evolution.pathologies``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from coevo.evolution.pathologies import (
    BOOST,
    DIMENSIONS,
    SEVERITIES,
    Alert,
    ForgettingMonitor,
    MonitorResult,
    dimension_concentration,
    prediction_accuracy,
    prediction_record,
    reward_hacking_edit,
    reward_hacking_trend,
    ship_prediction,
)
from coevo.harness.harness import Harness
from coevo.rundir.evolve_records import Verdict

LOG = logging.getLogger("coevo.evolution")


def _log(alerts: Sequence[Alert]) -> None:
    for a in alerts:
        LOG.log(SEVERITIES[a.severity], "%s: %s", a.name, a.message)


# ---------------------------------------------------------------------------------- aggregate
class Monitors:
    """All monitors for one variant: feed it verdicts and rounds, read ``priorities()``."""

    def __init__(
        self,
        *,
        window: int = 5,
        concentration: float = 0.8,
        boost: float = BOOST,
        trend_window: int = 3,
        trend_margin: float = 0.05,
        lookback: int = 3,
        min_lost: int = 1,
        prediction_window: int = 10,
        min_predictions: int = 4,
        min_accuracy: float = 0.2,
    ) -> None:
        if boost < 1.0:
            raise ValueError(f"boost must be >= 1, got {boost}")
        self.window, self.concentration, self.boost = window, concentration, boost
        self.trend_window, self.trend_margin = trend_window, trend_margin
        self.prediction_window, self.min_predictions, self.min_accuracy = (prediction_window, min_predictions,
                                                                           min_accuracy)
        self.forgetting = ForgettingMonitor(lookback=lookback, min_lost=min_lost, boost=boost)
        self.dimensions: list[str] = []
        self.predictions: list[dict[str, Any]] = []
        self.train: list[float | None] = []  # one entry per round that reported a pass rate
        self.val: list[float | None] = []
        self.alerts: list[Alert] = []
        self.priorities()  # runs every check on the empty history: bad windows/thresholds fail here

    # -- checks derived from state (pure, so priorities() can recompute them)
    def _concentration(self) -> MonitorResult:
        return dimension_concentration(self.dimensions, window=self.window, threshold=self.concentration,
                                       boost=self.boost)

    def _prediction(self) -> MonitorResult:
        return ship_prediction(self.predictions, window=self.prediction_window, min_predictions=self.min_predictions,
                               min_accuracy=self.min_accuracy, boost=self.boost)[1]

    def _trend(self) -> MonitorResult:
        """Over the rounds that measured both rates (validation may be measured less often)."""
        pairs = [(t, v) for t, v in zip(self.train, self.val, strict=True) if t is not None and v is not None]
        return reward_hacking_trend([t for t, _ in pairs], [v for _, v in pairs], window=self.trend_window,
                                    margin=self.trend_margin, boost=self.boost)

    def _emit(self, alerts: list[Alert]) -> list[Alert]:
        _log(alerts)
        self.alerts.extend(alerts)
        return alerts

    def observe_verdict(self, verdict: Verdict, harness_before: Harness | None = None) -> list[Alert]:
        """A judged proposal: its dimension, its prediction, and its edit's added text
        (compared with ``harness_before`` when given, else all text the edits carry). Alerts
        about the history (concentration, prediction accuracy) repeat while the condition holds."""
        self.dimensions.append(verdict.proposal.dimension)
        record = prediction_record(verdict)
        if record is not None:
            self.predictions.append(record)
        alerts = reward_hacking_edit(verdict.proposal.edits, harness_before).alerts
        alerts += self._concentration().alerts
        if record is not None:
            alerts += self._prediction().alerts
        return self._emit(alerts)

    def observe_round(
        self,
        round: int,
        *,
        train_pass_rate: float | None = None,
        val_pass_rate: float | None = None,
        harness_id: str | None = None,
        outcomes: Mapping[str, Sequence[bool] | bool] | None = None,
        shipped_dimension: str | None = None,
    ) -> list[Alert]:
        """End of a round: pass rates of the current harness (the trend check uses the rounds that
        give both), and its per-task outcomes on the tasks tracked for forgetting, with the
        ``harness_id`` they were measured on."""
        alerts: list[Alert] = []
        if train_pass_rate is not None or val_pass_rate is not None:
            self.train.append(None if train_pass_rate is None else float(train_pass_rate))
            self.val.append(None if val_pass_rate is None else float(val_pass_rate))
            if train_pass_rate is not None and val_pass_rate is not None:
                alerts += self._trend().alerts
        if outcomes is not None:
            if harness_id is None:
                raise ValueError("outcomes need the harness_id they were measured on")
            self.forgetting.record(round, harness_id, outcomes, dimension=shipped_dimension)
            alerts += self.forgetting.check().alerts
        return self._emit(alerts)

    def priorities(self) -> dict[str, float]:
        """Dimension → multiplier for the Planner (1.0 = neutral), the product of every monitor's
        current adjustment."""
        out = dict.fromkeys(DIMENSIONS, 1.0)
        for result in (self._concentration(), self._prediction(), self._trend(), self.forgetting.check()):
            for dim, mult in result.adjust.items():
                out[dim] = out.get(dim, 1.0) * mult
        return out

    def prediction_accuracy(self) -> float | None:
        """Ship-prediction accuracy over the last ``prediction_window`` judged proposals."""
        return prediction_accuracy(self.predictions[-self.prediction_window :])

    def state_dict(self) -> dict[str, Any]:
        return {
            "dimensions": list(self.dimensions),
            "predictions": [dict(p) for p in self.predictions],
            "train": list(self.train),
            "val": list(self.val),
            "forgetting": self.forgetting.state_dict(),
            "alerts": [a.to_dict() for a in self.alerts],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dimensions = list(state.get("dimensions", []))
        self.predictions = [dict(p) for p in state.get("predictions", [])]
        self.train = [None if x is None else float(x) for x in state.get("train", [])]
        self.val = [None if x is None else float(x) for x in state.get("val", [])]
        self.forgetting.load_state_dict(state.get("forgetting", {}))
        self.alerts = [Alert(**a) for a in state.get("alerts", [])]
