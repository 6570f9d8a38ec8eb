"""What AEGIS reports of a round, as the run directory keeps it: each variant's ``Digest`` (its
failure clusters, and how the model did without the scaffolding), each ``Proposal`` the Critic
judged with its ``Verdict`` (the quality report, the statistical gate's ``Evidence``), and the
round's ``EvolveReport``.

One type per concept: AEGIS builds these, ``RoundRecord.evolve`` holds the report as it is, and
``from_dict`` reads it back from ``rounds.jsonl`` under the checks of ``coevo.rundir.record_checks``
(a proposal's edits must be ``Edit`` dicts). They live on the run directory's floor because it reads
them back; ``coevo.evolution.types`` holds the rest of AEGIS's vocabulary (causes, failures, harness
events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator

from coevo.harness.edit_record import Edit, edits_key
from coevo.rundir.record_checks import Bool, Float, Int, JSONDict, Record, RecordError, Str

RETIRE_TOOL_USE = 0.6
"""Unforced tool use at which removing a scaffold layer is worth judging: below it the Critic would
see the episodes that answer without the tool fail, and the proposal would spend its budget to be
rejected."""
RETIRE_KEEP = 0.8
"""Unforced pass rate, as a share of the scaffolded one, at which removal is worth judging (the
Critic's paired gate, not this threshold, decides whether it ships)."""


# ------------------------------------------------------------------------------------------ digests
@dataclass(frozen=True)
class Component:
    """The part of the harness a failure implicates."""

    hook: Str
    dimension: Str
    processors: tuple[Str, ...]  # built-in processor kinds an edit for this cause would touch


@dataclass
class Cluster(Record):
    """Failures sharing a root cause. ``severity`` is the share of the round's failed traces in it."""

    cause: Str
    component: Component
    count: Int
    severity: Float
    task_ids: list[Str]
    trace_ids: list[Str]
    excerpts: list[Str]  # representative: at most a few, from distinct tasks


@dataclass
class ScaffoldEvidence(Record):
    """How the model behaves on a variant's tasks with and without the harness's outermost scaffold
    layer (``coevo.harness.scaffold``), from the same round's episodes of both under the same
    weights: what a proposal to retire that layer rests on (``coevo.meta.retire``)."""

    scaffold: list[Str]  # the layer's processor names (what a retirement removes)
    episodes: Int  # episodes without the layer
    tool_use: Float  # share of them that called a tool
    pass_rate: Float
    scaffolded_tool_use: Float  # the variant's own episodes, with the scaffolding
    scaffolded_pass_rate: Float

    def ready(self, tool_use: float = RETIRE_TOOL_USE, keep: float = RETIRE_KEEP) -> bool:
        """Whether the episodes without the layer show the behaviour it forces: the tool called in at
        least ``tool_use`` of them and a pass rate at least ``keep`` times the scaffolded one."""
        return self.tool_use >= tool_use and self.pass_rate >= keep * self.scaffolded_pass_rate - 1e-9

    def text(self) -> str:
        return (f"without its scaffolding {', '.join(self.scaffold)} the model called a tool in "
                f"{100 * self.tool_use:.0f}% of {self.episodes} episodes and passed {100 * self.pass_rate:.0f}% "
                f"(with it: {100 * self.scaffolded_tool_use:.0f}% and {100 * self.scaffolded_pass_rate:.0f}%)")


@dataclass
class Digest(Record):
    """A round's traces compressed for the Planner (one per harness variant). The record keeps
    ``compression`` beside the fields; reading it back recomputes it."""

    round: Int
    variant: Str
    harness_id: Str
    n_traces: Int
    n_failed: Int
    pass_rate: Float
    clusters: list[Cluster]
    raw_tokens: Int  # estimated tokens of the raw traces the digest replaces
    digest_tokens: Int  # estimated tokens of ``text()``
    passed_task_ids: list[Str] = field(default_factory=list)
    failed_task_ids: list[Str] = field(default_factory=list)
    n_infra: Int = 0  # infrastructure failures (Trace.infra_failure): counted, in no cluster, not in n_failed
    scaffold: ScaffoldEvidence | None = None  # set when the round also ran the harness without its scaffolding
    tools_called: list[Str] = field(default_factory=list)  # tools the episodes called by a name that ran

    @property
    def compression(self) -> float:
        """raw / digest tokens (how many times smaller the Planner's input is)."""
        return self.raw_tokens / max(self.digest_tokens, 1)

    def cluster(self, cause: str) -> Cluster | None:
        return next((c for c in self.clusters if c.cause == cause), None)

    def text(self) -> str:
        """The digest as the Planner reads it: one block per cluster, largest first."""
        judged = self.n_traces - self.n_infra
        lines = [
            (f"round {self.round}, variant {self.variant} (harness {self.harness_id}): "
             f"{judged - self.n_failed}/{judged} traces passed"
             + (f"; {self.n_infra} infrastructure failures left out" if self.n_infra else ""))
        ]
        for c in self.clusters:
            lines.append(
                f"- {c.cause}: {c.count} traces on {len(c.task_ids)} tasks (severity {c.severity:.2f}); "
                f"implicates {c.component.hook}/{c.component.dimension} ({', '.join(c.component.processors)})"
            )
            lines.extend(f"    > {e}" for e in c.excerpts)
        if self.scaffold is not None:
            lines.append(f"- {self.scaffold.text()}")
        if self.tools_called:
            lines.append(f"- tools the episodes called: {', '.join(self.tools_called)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"compression": self.compression}


# ----------------------------------------------------------------------------------------- verdicts
class Outcome(StrEnum):
    """What a gate decided about an edit, every gate alike: ship it, reject it, or (the statistical
    gate only) not yet: judged again later with its evidence pooled."""

    SHIP = "ship"
    REJECT = "reject"
    UNDECIDED = "undecided"


def _outcome_from_flags(data: object) -> object:
    """A verdict as the run directory holds it (``ship`` and ``undecided``, two booleans) with its
    ``outcome``; a verdict already holding one, or anything else, as it is."""
    if not isinstance(data, dict) or "outcome" in data:
        return data
    data = dict(data)
    ship, undecided = data.pop("ship", None), data.pop("undecided", False)
    if not isinstance(ship, bool):
        raise RecordError("ship", "is missing" if ship is None else f"must be bool, got {type(ship).__name__}")
    if not isinstance(undecided, bool):
        raise RecordError("undecided", f"must be bool, got {type(undecided).__name__}")
    if ship and undecided:
        raise RecordError("", "is both shipped and undecided")
    data["outcome"] = Outcome.SHIP if ship else Outcome.UNDECIDED if undecided else Outcome.REJECT
    return data


@dataclass
class Evidence(Record):
    """The statistical gate's evidence for one verdict: the counts and thresholds its decision used
    (``coevo.evolution.stat_gate``), then what the Critic spent and pooled (``critic``)."""

    pairs: Int
    wins: Int
    losses: Int
    episodes: Int = 0  # the Critic's episodes for this judgement
    log_lr: Float | None = None  # the sequential test's; None for a removal (judged for non-inferiority)
    tasks: Int = 0
    both_pass: Int = 0
    both_fail: Int = 0
    ship_at: Float | None = None
    reject_at: Float | None = None
    p_gain: Float | None = None
    p_harm: Float | None = None
    alpha: Float | None = None
    beta: Float | None = None
    win_share: Float | None = None
    regressions: list[Str] = field(default_factory=list)
    confirmations: JSONDict = field(default_factory=dict)  # task → wins, losses, pairs, confirmed
    decision: Str = ""  # the Outcome's value (the verdict holds the Outcome itself)
    budget: Int | None = None
    pooled_episodes: Int | None = None
    max_episodes: Int | None = None
    judged: Int | None = None
    infra_left_out: Int = 0
    noninferiority: Bool = False  # a removal: judged on the pass rate it may lose, not on a gain
    harm_bound: Float | None = None  # upper bound of the pass rate lost (a share), at 1 − alpha
    harm_lower: Float | None = None  # lower bound of it
    margin: Float | None = None  # the loss a removal may cost


@dataclass
class QualityReport(Record):
    """The Critic's static gate: leakage and bloat scores against their thresholds."""

    passed: Bool
    leakage: Float
    bloat: Float
    reason: Str = ""
    leaked: list[Str] = field(default_factory=list)  # the offending strings, for the revision prompt


def _edit(value: object) -> Edit:
    """An edit as a proposal holds it: an ``Edit``, or the dict ``Edit.to_dict`` wrote."""
    if isinstance(value, Edit):
        return value
    if not isinstance(value, dict):
        raise RecordError("", f"is not an edit (a {type(value).__name__})")
    try:
        return Edit.from_dict(dict(value))
    except (TypeError, ValueError) as e:
        raise RecordError("", f"is not an edit ({e})") from None


@dataclass
class Proposal(Record):
    """A Planner's hypothesis with the typed edits that test it and its change manifest.

    Scope: ``cluster`` (a cause) and/or ``target_tasks``; ``predicted_flips`` are tasks expected to
    go fail→pass, ``at_risk`` tasks that passed and might break. ``edits`` apply in order.
    """

    hypothesis: Str
    edits: list[Annotated[Edit, BeforeValidator(_edit)]]
    dimension: Str
    cluster: Str | None = None
    target_tasks: list[Str] = field(default_factory=list)
    predicted_flips: list[Str] = field(default_factory=list)
    at_risk: list[Str] = field(default_factory=list)
    variant: Str = "base"
    source: Str = "rule"  # which meta-agent backend proposed it
    revision: Int = 0  # 0 for the first draft, +1 per Critic-requested revision

    def manifest(self) -> dict[str, Any]:
        """What the harness lineage records with each edit (it does not affect application)."""
        return {
            "hypothesis": self.hypothesis,
            "dimension": self.dimension,
            "cluster": self.cluster,
            "target_tasks": list(self.target_tasks),
            "predicted_flips": list(self.predicted_flips),
            "at_risk": list(self.at_risk),
            "source": self.source,
            "revision": self.revision,
        }

    @property
    def removes_only(self) -> bool:
        """Whether every edit removes a processor: such an edit needs no gain to ship, only no harm
        (``seesaw_gate(need_gain=False)``, ``noninferiority_gate``), since a leaner harness costs less."""
        return bool(self.edits) and all(e.op == "remove" for e in self.edits)

    def key(self) -> str:
        """Identity of the change itself (edits only), to avoid proposing a rejected edit again."""
        return edits_key(self.edits)

    def to_dict(self) -> dict[str, Any]:
        return self.manifest() | {"edits": [e.to_dict() for e in self.edits], "variant": self.variant}


@dataclass
class Verdict(Record):
    """What the Critic decided for one candidate, and why. The run directory holds the outcome as
    two booleans, ``ship`` and ``undecided`` (``to_dict``; both read back into ``outcome``)."""

    proposal: Proposal
    parent_id: Str
    candidate_id: Str | None  # None when the edit did not even build
    variant: Str
    outcome: Outcome
    reason: Str
    quality: QualityReport | None = None
    # task -> outcomes of k attempts (stat: the parent's and candidate's paired attempts; None: an
    # infrastructure failure)
    before: dict[Str, list[Bool | None]] = field(default_factory=dict)
    after: dict[Str, list[Bool | None]] = field(default_factory=dict)
    fail_to_pass: list[Str] = field(default_factory=list)  # stat gate: tasks with more wins than losses
    pass_to_fail: list[Str] = field(default_factory=list)  # stat gate: confirmed regressions
    gate: Str = ""  # which gate decided: build | quality | stat | seesaw | performance | seesaw+performance
    round: Int = 0
    evidence: Evidence | None = None  # stat gate: counts, statistic, thresholds, budget used

    @property
    def ship(self) -> bool:
        return self.outcome is Outcome.SHIP

    @property
    def undecided(self) -> bool:
        """The statistical gate wants more evidence: judged again later with its pairs pooled."""
        return self.outcome is Outcome.UNDECIDED

    def to_dict(self) -> dict[str, Any]:
        """The fields in the order and form the run directory has always held them."""
        out: dict[str, Any] = {}
        for key, value in super().to_dict().items():
            if key == "outcome":
                out["ship"] = self.ship
            elif key == "evidence":
                out["undecided"] = self.undecided
                out[key] = value
            else:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: object, where: str | None = None) -> Verdict:
        return super().from_dict(_outcome_from_flags(data), where)

    def describe_edits(self) -> str:
        """The proposal's edits in ``Edit.describe()`` form, joined by '; '."""
        return "; ".join(e.describe() for e in self.proposal.edits)


VerdictRow = Annotated[Verdict, BeforeValidator(_outcome_from_flags)]
"""A verdict read back from the run directory's form (``Verdict.to_dict``)."""


# ------------------------------------------------------------------------------------------ a round
@dataclass
class EvolveReport(Record):
    """What one ``AEGIS.evolve`` call did: each variant's digest, every verdict, the candidate ids
    that became a variant's harness, the variants the round created, warnings, which patience
    stopped the search, and seconds per stage (digest / plan / critic)."""

    round: Int
    verdicts: list[VerdictRow] = field(default_factory=list)
    shipped: list[Str] = field(default_factory=list)
    spawned: list[Str] = field(default_factory=list)
    warnings: list[Str] = field(default_factory=list)
    digests: list[Digest] = field(default_factory=list)
    stopped: Str | None = None  # which patience ran out, when the search is over
    seconds: dict[Str, Float] = field(default_factory=dict)
