"""The pathology checks (HarnessX §4.2, §6.6) behind ``coevo.evolution.monitors.Monitors``:
reward hacking, forgetting, under-exploration, each a pure function (or, for forgetting, a small
recorder) of the run's history.

Per-edit gates cannot see these: an edit can pass the seesaw gate and still exploit the
verifier's format, several edits that each pass can together forget what earlier snapshots
solved, and a Planner stuck in one dimension keeps proposing edits that pass nothing. The
checks read the run's history, raise ``Alert``s and return multipliers on the Planner's
dimension priorities (``PlanContext.priorities``).

Every check is a pure function of plain inputs returning ``MonitorResult(alerts, adjust)``;
``Monitors`` (``coevo.evolution.monitors``) keeps the histories, calls them, logs the alerts and
derives ``priorities()`` from its state alone.

Rules (defaults in parentheses):

- Reward hacking, per edit: the added text (``coevo.evolution.added_text.added_segments``) is matched against
  ``HACKING_PATTERNS``: an instruction to always give a fixed literal answer, a default literal
  guess when unsure, a concrete value inside an ``<answer>`` tag outside a demonstration's
  assistant turn (worked demos legitimately show concrete answers), and references to the
  verifier or grader. Across rounds: train pass rate up by ≥ ``margin`` (0.05) while validation
  is down by ≥ ``margin`` over the last ``window`` (3) rounds that measured both; raises the
  evaluation_reward dimension (verification edits) by ``boost``.
- Forgetting: a task that passed under one harness and later failed under a different one
  (a flip; re-runs of the same harness are sampling noise, not forgetting), and drift: tasks
  that passed in the record ``lookback`` (3) rounds back and fail now; drift of ≥ ``min_lost``
  (1) tasks lowers the dimension most of the intervening shipped edits were in by 1/``boost``.
- Under-exploration: ≥ ``threshold`` (0.8) of the last ``window`` (5) judged proposals in one
  dimension raises every other dimension by ``boost`` (1.5); ship-prediction accuracy (share of
  judged proposals, among the last ``window`` (10) that ran and predicted flips, with at least one
  predicted task actually going fail→pass) ≤ ``min_accuracy`` (0.2) over ≥ ``min_predictions`` (4)
  lowers the dimension most mispredictions came from by 1/``boost``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from coevo.agent.outcomes import task_pass_at_k
from coevo.evolution.added_text import Added, added_segments
from coevo.harness.edits import Edit
from coevo.harness.harness import Harness
from coevo.harness.hooks import Dimension
from coevo.rundir.evolve_records import Verdict

DIMENSIONS = tuple(d.value for d in Dimension)
SEVERITIES = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.CRITICAL}
BOOST = 1.5
TOL = 1e-9


@dataclass(frozen=True)
class Alert:
    """One finding: ``name`` is ``<pathology>.<check>``; ``data`` holds the evidence (task ids,
    rates, matched text)."""

    name: str
    message: str
    severity: str = "warning"
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert severity must be one of {sorted(SEVERITIES)}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MonitorResult(NamedTuple):
    alerts: list[Alert]
    adjust: dict[str, float]  # dimension -> multiplier on its Planner priority



def _check_window(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# ---------------------------------------------------------------------------------- reward hacking
_VERB = r"(?:answer|output|respond|reply|return|say|print|write|give|put)\w*"
_LITERAL = r"(?:-?\d+(?:\.\d+)?\b|[\"'`][^\"'`\n]*\d[^\"'`\n]*[\"'`])"  # a number, or a quoted string with a digit
HACKING_PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "fixed_answer": (
        # "always answer 42", "regardless of the question, output '0'"
        re.compile(
            rf"\b(?:always|regardless|no matter|in every case|for (?:every|any|all) (?:questions?|tasks?|problems?))\b"
            rf"[^.\n]{{0,40}}?\b{_VERB}\b[^.\n\d\"'`]{{0,25}}{_LITERAL}",
            re.IGNORECASE,
        ),
        # "answer 0 no matter what"
        re.compile(
            rf"\b{_VERB}\b[^.\n\d]{{0,20}}?-?\d+(?:\.\d+)?\b[^.\n]{{0,30}}?"
            r"\b(?:regardless|no matter|always|every time|whatever)\b",
            re.IGNORECASE,
        ),
    ),
    # "if unsure, answer 0"
    "default_guess": (
        re.compile(
            r"\bif\s+(?:you\s+are\s+)?(?:unsure|not sure|uncertain|stuck|(?:you\s+)?(?:can(?:not|'t)|do(?:n't| not))\s+"
            rf"(?:know|solve|find))\b[^.\n]{{0,40}}?\b(?:{_VERB}|guess\w*)\b[^.\n\d\"'`]{{0,20}}{_LITERAL}",
            re.IGNORECASE,
        ),
    ),
    # "<answer>42</answer>" in an instruction (placeholders like "..." are filtered below)
    "answer_template": (re.compile(r"<answer>\s*([^<\n]{1,60}?)\s*</answer>", re.IGNORECASE),),
    # "the grader only checks the last number"
    "verifier_probe": (
        re.compile(
            r"\b(?:verifier|grader|grading|auto-?grader|reward (?:model|function)|checker"
            r"|scoring (?:function|script))s?\b",
            re.IGNORECASE,
        ),
    ),
}
"""The regularities an edit may exploit instead of solving tasks (see the module docstring)."""

_PLACEHOLDER = re.compile(
    r"^(?:\.{2,}|…|_+|-+|\?+|[a-z]|your (?:final )?(?:answer|result)|(?:final )?answer|result|value|number"
    r"|\{[^}]*\}|\[[^\]]*\]|<[^>]*>|\([^)]*\))$",
    re.IGNORECASE,
)


def hacking_matches(segments: Sequence[Added]) -> list[tuple[str, Added, str]]:
    """(pattern name, segment, first matched text) for each pattern that matches a segment of
    added text. ``answer_template`` is skipped in demonstrations' assistant turns and for
    placeholders."""
    out = []
    for seg in segments:
        for name, patterns in HACKING_PATTERNS.items():
            if name == "answer_template" and seg.role == "assistant":
                continue
            found = next((m.group(0) for pattern in patterns for m in pattern.finditer(seg.text)
                          if name != "answer_template" or not _PLACEHOLDER.match(m.group(1).strip())), None)
            if found is not None:
                out.append((name, seg, found))
    return out


def reward_hacking_edit(edits: Sequence[Edit], harness_before: Harness | None) -> MonitorResult:
    """Alerts for an edit whose added text matches ``HACKING_PATTERNS`` (no priority change:
    the edit itself is the problem, not its dimension)."""
    alerts = [
        Alert(
            f"reward_hacking.{name}",
            f"edit to {seg.processor}.{seg.param} adds {text!r}, which games the verifier's format "
            f"instead of solving the task",
            "info" if name == "verifier_probe" else "warning",
            {"pattern": name, "processor": seg.processor, "param": seg.param, "text": text},
        )
        for name, seg, text in hacking_matches(added_segments(edits, harness_before))
    ]
    return MonitorResult(alerts, {})


def reward_hacking_trend(
    train: Sequence[float], val: Sequence[float], *, window: int = 3, margin: float = 0.05, boost: float = BOOST
) -> MonitorResult:
    """Train pass rate rising by ≥ ``margin`` while validation falls by ≥ ``margin`` between the
    first and last of the last ``window`` rounds (both series one value per round)."""
    _check_window("window", window, 2)
    if len(train) != len(val):
        raise ValueError(f"train and val need one pass rate per round, got {len(train)} and {len(val)}")
    if len(train) < window:
        return MonitorResult([], {})
    d_train = train[-1] - train[-window]
    d_val = val[-1] - val[-window]
    if d_train >= margin - TOL and d_val <= -margin + TOL:
        alert = Alert(
            "reward_hacking.divergence",
            f"over the last {window} rounds the train pass rate rose {d_train:+.3f} while validation fell "
            f"{d_val:+.3f}: edits fit the training verifier, not the tasks",
            "warning",
            {"train_change": d_train, "val_change": d_val, "window": window},
        )
        return MonitorResult([alert], {Dimension.EVALUATION.value: boost})
    return MonitorResult([], {})


# ---------------------------------------------------------------------------------- forgetting
@dataclass
class _Record:
    round: int
    harness_id: str
    passed: dict[str, bool]
    dimension: str | None = None  # dimension of the edit that shipped this round, if any


class ForgettingMonitor:
    """Per-round per-task pass@k of the current harness; reports flips and accumulated drift."""

    def __init__(self, *, lookback: int = 3, min_lost: int = 1, boost: float = BOOST) -> None:
        _check_window("lookback", lookback)
        _check_window("min_lost", min_lost)
        self.lookback, self.min_lost, self.boost = lookback, min_lost, boost
        self.records: list[_Record] = []

    def record(
        self,
        round: int,
        harness_id: str,
        outcomes: Mapping[str, Sequence[bool] | bool],
        *,
        dimension: str | None = None,
    ) -> None:
        """Outcomes of the harness current at ``round`` (attempt lists or pass@k booleans);
        ``dimension``: of the edit shipped this round (None when nothing shipped). Rounds must
        increase."""
        if self.records and round <= self.records[-1].round:
            raise ValueError(f"round must increase: got {round} after {self.records[-1].round}")
        attempts = {t: ([v] if isinstance(v, bool) else list(v)) for t, v in outcomes.items()}
        self.records.append(_Record(int(round), str(harness_id), task_pass_at_k(attempts), dimension))

    def flips(self) -> dict[str, list[tuple[int, int]]]:
        """task → (round it passed, round it then failed) whenever the harness had changed in
        between; only the last pass before each failure counts."""
        out: dict[str, list[tuple[int, int]]] = {}
        last_pass: dict[str, tuple[int, str]] = {}
        for rec in self.records:
            for task, ok in rec.passed.items():
                if ok:
                    last_pass[task] = (rec.round, rec.harness_id)
                elif task in last_pass:
                    r, h = last_pass.pop(task)
                    if h != rec.harness_id:
                        out.setdefault(task, []).append((r, rec.round))
        return out

    def drift(self) -> tuple[int | None, list[str]]:
        """(round compared with, tasks that passed then and fail now): the latest record at least
        ``lookback`` rounds before the current one, or (None, []) when there is none."""
        if not self.records:
            return None, []
        now = self.records[-1]
        then = next((r for r in reversed(self.records) if r.round <= now.round - self.lookback), None)
        if then is None:
            return None, []
        lost = sorted(t for t, ok in then.passed.items() if ok and now.passed.get(t) is False)
        return then.round, lost

    def check(self) -> MonitorResult:
        """Alerts for flips that ended at the latest record and for drift."""
        if not self.records:
            return MonitorResult([], {})
        now = self.records[-1]
        alerts: list[Alert] = []
        adjust: dict[str, float] = {}
        new = {t: [f for f in fl if f[1] == now.round] for t, fl in self.flips().items()}
        new = {t: fl for t, fl in new.items() if fl}
        if new:
            alerts.append(
                Alert(
                    "forgetting.flip",
                    f"round {now.round}: {len(new)} task(s) that passed under an earlier harness now fail: "
                    + ", ".join(f"{t} (passed round {fl[-1][0]})" for t, fl in sorted(new.items())),
                    "warning",
                    {"tasks": sorted(new), "round": now.round},
                )
            )
        then_round, lost = self.drift()
        if then_round is not None and len(lost) >= self.min_lost:
            window = [r for r in self.records if then_round < r.round <= now.round]
            shipped = [r.dimension for r in window if r.dimension is not None]
            message = (
                f"round {now.round} vs round {then_round}: {len(lost)} task(s) passed then and fail now {lost}, "
                f"after {len(shipped)} shipped edit(s) that each passed the gate"
            )
            if shipped:
                top, _ = Counter(shipped).most_common(1)[0]
                adjust[top] = 1.0 / self.boost
                message += f"; most were {top} edits"
            alerts.append(
                Alert("forgetting.drift", message, "warning",
                      {"lost": lost, "since_round": then_round, "round": now.round, "shipped_dimensions": shipped})
            )
        return MonitorResult(alerts, adjust)

    def state_dict(self) -> dict[str, Any]:
        return {"records": [asdict(r) for r in self.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.records = [_Record(**r) for r in state.get("records", [])]


# ---------------------------------------------------------------------------------- under-exploration
def dimension_concentration(
    dimensions: Sequence[str], *, window: int = 5, threshold: float = 0.8, boost: float = BOOST
) -> MonitorResult:
    """Share of the last ``window`` proposals in their most common dimension; at or above
    ``threshold`` every other dimension's priority is multiplied by ``boost``."""
    _check_window("window", window)
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if len(dimensions) < window:
        return MonitorResult([], {})
    recent = list(dimensions)[-window:]
    top, count = Counter(recent).most_common(1)[0]
    share = count / window
    if share < threshold - TOL:
        return MonitorResult([], {})
    alert = Alert(
        "under_exploration.dimension",
        f"{count} of the last {window} proposals edit {top} (share {share:.2f} >= {threshold:.2f}); "
        f"raising the other dimensions",
        "warning",
        {"dimension": top, "share": share, "window": window},
    )
    return MonitorResult([alert], {d: boost for d in DIMENSIONS if d != top})


def prediction_record(verdict: Verdict) -> dict[str, Any] | None:
    """What ship-prediction accuracy needs from a verdict: None when the candidate was never run
    (build or quality rejection) or the proposal predicted no flips."""
    predicted = sorted(set(verdict.proposal.predicted_flips))
    if not predicted or not verdict.after:
        return None
    return {"dimension": verdict.proposal.dimension, "predicted": predicted, "flipped": sorted(verdict.fail_to_pass)}


def prediction_accuracy(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Share of records whose predicted tasks include at least one that went fail→pass."""
    if not records:
        return None
    hits = sum(1 for r in records if set(r["predicted"]) & set(r["flipped"]))
    return hits / len(records)


def ship_prediction(
    records: Sequence[Mapping[str, Any]],
    *,
    window: int = 10,
    min_predictions: int = 4,
    min_accuracy: float = 0.2,
    boost: float = BOOST,
) -> tuple[float | None, MonitorResult]:
    """Ship-prediction accuracy over the last ``window`` records (``prediction_record``) and an
    alert when it is ≤ ``min_accuracy`` over at least ``min_predictions`` of them."""
    _check_window("window", window)
    _check_window("min_predictions", min_predictions)
    recent = list(records)[-window:]
    acc = prediction_accuracy(recent)
    if acc is None or len(recent) < min_predictions or acc > min_accuracy + TOL:
        return acc, MonitorResult([], {})
    missed = [r["dimension"] for r in recent if not set(r["predicted"]) & set(r["flipped"])]
    top, _ = Counter(missed).most_common(1)[0]
    alert = Alert(
        "under_exploration.prediction",
        f"ship-prediction accuracy {acc:.2f} <= {min_accuracy:.2f} over the last {len(recent)} judged proposals; "
        f"predictions fail most in {top}: that neighbourhood looks exhausted",
        "warning",
        {"accuracy": acc, "n": len(recent), "dimension": top},
    )
    return acc, MonitorResult([alert], {top: 1.0 / boost})
