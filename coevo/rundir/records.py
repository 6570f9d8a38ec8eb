"""The records a co-evolution run writes: ``RoundRecord`` (a line of ``rounds.jsonl``) with the
records nested in it, and ``LineageRow`` (a line of ``lineage.jsonl``). docs/run-directory.md
describes every field.

They are plain dataclasses: the loop builds them, ``to_dict()`` is what the run directory and the
checkpoint hold, and ``from_dict()`` reads them back through pydantic (``TypeAdapter`` over these
dataclasses), strictly where a mistake would go unnoticed: a bool is not a number, a number is not
a string, an int field takes no float. A record that does not fit raises ``ValueError`` naming
where it came from (``<run>/rounds.jsonl:3``) and the field path (``infra_failures.count``,
``evolve.verdicts[0].proposal.edits[1]``). The checks that are not types live here too, in
``__post_init__``: a mode outside ``MODES``, a verdict both shipped and undecided, an edit that is
no ``Edit``, a lineage ``how`` outside ``LINEAGE_HOWS`` (``coevo.rundir.run_files`` reads the files).
Fields that records written by older versions lack have defaults, so an older run directory loads.

Imports only ``coevo.config.schema``, ``coevo.harness.edit_record`` and its checks (``record_checks``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Self

from pydantic import AfterValidator, Strict

from coevo.config.schema import MODES
from coevo.harness.edit_record import Edit
from coevo.rundir.record_checks import RecordError, validate

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # takes an int too, never a bool or a string
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Outcomes = dict[Str, list[Bool]]
"""Task id → one boolean per attempt."""

LINEAGE_HOWS = ("start", "shipped", "spawned", "selected", "released")
"""How a harness became a variant's current one: the events the lineage records (and W&B's
``harness`` artifacts carry); ``coevo.evolution.types.LINEAGE_EVENTS`` is this tuple."""


def _json(value: Any) -> Any:
    """A free-form part of a record as the run directory holds it (tuples become lists, dict keys
    strings, anything else JSON cannot hold its ``str``), so a record the loop builds equals the one
    read back."""
    return json.loads(json.dumps(value, default=str))


JSONDict = Annotated[dict[Str, Any], AfterValidator(_json)]
"""A free-form object of a record (kept as its JSON form)."""


def _check_proposal(proposal: dict[str, Any]) -> dict[str, Any]:
    """A verdict's proposal as ``Proposal.to_dict`` writes it: a dict whose ``edits`` are ``Edit`` dicts."""
    if "edits" not in proposal:
        raise RecordError("edits", "is missing")
    edits = proposal["edits"]
    if not isinstance(edits, list):
        raise RecordError("edits", f"must be list, got {type(edits).__name__}")
    for i, edit in enumerate(edits):
        try:
            Edit.from_dict(dict(edit))
        except (TypeError, ValueError) as e:
            raise RecordError(f"edits[{i}]", f"is not an edit ({e})") from None
    return _json(proposal)


ProposalDict = Annotated[dict[Str, Any], AfterValidator(_check_proposal)]


class Record:
    """``to_dict`` / ``from_dict`` of every record here."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> Self:
        """Validate ``data`` (a parsed JSON object) into this record; errors start with ``where``."""
        name = re.sub(r"(?<!^)(?=[A-Z][a-z])", " ", cls.__name__).lower()
        return validate(cls, data, where or name, f"a {name}")


# ------------------------------------------------------------------------------------- round parts
@dataclass
class TrainStats(Record):
    """The round's train batch: share of traces passed, mean reward, traces, the share of episodes
    that called a tool themselves, and task id → [passed per attempt]."""

    pass_rate: Float
    mean_reward: Float
    n_traces: Int
    outcomes: Outcomes
    tool_use_rate: Float = 0.0  # absent in records written before it existed
    tokens: Int = 0  # prompt + completion tokens of the round's episodes (0 in records written before it)


@dataclass
class Evaluation(Record):
    """pass@1 and pass@k (k attempts) of the routed variants on validation or test tasks."""

    pass_at_1: Float
    pass_at_k: Float
    k: Int
    outcomes: Outcomes
    tool_use_rate: Float = 0.0


@dataclass
class InfraFailures(Record):
    """The round's rollouts lost to infrastructure failures: how many, by source, which traces."""

    count: Int
    by_source: dict[Str, Int] = field(default_factory=dict)  # policy / env / tool → traces
    trace_ids: list[Str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise RecordError("count", "must be >= 0")


@dataclass
class VariantStats(Record):
    """One variant's share of the round's train batch."""

    pass_rate: Float
    n_traces: Int


@dataclass
class Evidence(Record):
    """The statistical gate's evidence for one verdict (``coevo.evolution.stat_gate``, ``critic``)."""

    pairs: Int
    wins: Int
    losses: Int
    episodes: Int
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
    decision: Str = ""
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
class VerdictRecord(Record):
    """A Critic verdict as ``Verdict.to_dict`` writes it. ``proposal`` stays a dict
    (``Proposal.to_dict``) whose ``edits`` must be ``Edit`` dicts."""

    proposal: ProposalDict
    parent_id: Str
    candidate_id: Str | None
    variant: Str
    ship: Bool
    reason: Str
    gate: Str
    fail_to_pass: list[Str]
    pass_to_fail: list[Str]
    quality: JSONDict | None = None
    before: dict[Str, list[Bool | None]] = field(default_factory=dict)
    after: dict[Str, list[Bool | None]] = field(default_factory=dict)
    round: Int = 0
    undecided: Bool = False  # stat gate; absent in verdicts written before it existed
    evidence: Evidence | None = None

    def __post_init__(self) -> None:
        if self.ship and self.undecided:
            raise RecordError("", "is both shipped and undecided")

    @property
    def edits(self) -> list[Edit]:
        return [Edit.from_dict(dict(e)) for e in self.proposal["edits"]]

    def describe_edits(self) -> str:
        """The proposal's edits in ``Edit.describe()`` form, joined by '; '."""
        return "; ".join(e.describe() for e in self.edits)


@dataclass
class EvolveRecord(Record):
    """``EvolveReport.to_dict()``: the round's digests (as ``Digest.to_dict``), verdicts, shipped
    candidate ids, spawned variant names, warnings, which patience stopped the search, seconds."""

    round: Int
    verdicts: list[VerdictRecord]
    shipped: list[Str]
    spawned: list[Str]
    warnings: list[Str]
    digests: list[JSONDict] = field(default_factory=list)
    stopped: Str | None = None
    seconds: dict[Str, Float] = field(default_factory=dict)


@dataclass
class StepMetrics(Record):
    """One GRPO step's figures, computed by ``coevo.trainers.step_metrics.step_metrics`` from the step's
    tensors. A round's record keeps every step's (``GRPOMetrics.steps``) and the last one's fields
    at its top level; ``GRPOMetrics`` has a field for each of these (a test holds them equal)."""

    loss: Float
    clip_fraction: Float
    kl: Float
    ratio_mean: Float
    ratio_min: Float
    ratio_max: Float
    advantage_mean: Float
    advantage_std: Float
    zero_variance_fraction: Float
    excluded_traces: Int  # left out of every group: not trainable (crashed, or excluded by the harness)
    infra_traces: Int  # of those, infrastructure failures (Trace.infra_failure)
    sequences: Int
    tokens: Int
    tokens_per_s: Float
    grad_norm: Float
    lr: Float
    staleness: dict[int, Int]  # model-version lag -> traces
    reward_mean: Float = 0.0  # over the step's trainable traces (every group, signal or not)
    reward_std: Float = 0.0
    approx_kl: Float = 0.0  # KL(behaviour || current) per token, k3 estimate from the ratio: how far reuse has moved
    entropy: Float = 0.0  # mean -log pi(token) of the sampled tokens under the current policy (an entropy estimate)
    # sampler/trainer mismatch over the step's tokens whose calls carry the sampler's log-probs (None: no such token):
    # |behaviour log-prob (the buffer's, the trainer's recomputation) - the sampler's own| per token
    sampler_mismatch_mean: Float | None = None
    sampler_mismatch_max: Float | None = None
    sampler_tokens: Int = 0  # tokens with sampler log-probs (the others are not corrected)
    tis_truncated_fraction: Float | None = None  # of those, the share whose weight trainer.tis_cap cut (None: off)


@dataclass
class GRPOMetrics(Record):
    """The round's GRPO update: ``StepMetrics`` fields of its last step (every field None when no step
    ran), each step's in ``steps``, and the buffered traces it trained on."""

    buffer_traces: Int
    loss: Float | None = None
    clip_fraction: Float | None = None
    kl: Float | None = None
    ratio_mean: Float | None = None
    ratio_min: Float | None = None
    ratio_max: Float | None = None
    advantage_mean: Float | None = None
    advantage_std: Float | None = None
    zero_variance_fraction: Float | None = None
    excluded_traces: Int | None = None
    infra_traces: Int | None = None
    sequences: Int | None = None
    tokens: Int | None = None
    tokens_per_s: Float | None = None
    grad_norm: Float | None = None
    lr: Float | None = None
    staleness: dict[int, Int] | None = None  # model-version lag → traces (JSON keys are strings: read back as ints)
    reward_mean: Float | None = None
    reward_std: Float | None = None
    approx_kl: Float | None = None  # KL(behaviour || current), k3 from the ratio
    entropy: Float | None = None  # mean -log pi of the sampled tokens
    sampler_mismatch_mean: Float | None = None  # |behaviour - sampler| log-prob per token (absent in older records)
    sampler_mismatch_max: Float | None = None
    sampler_tokens: Int | None = None
    tis_truncated_fraction: Float | None = None
    steps: list[dict[str, Any]] | None = None  # every step's scalar StepMetrics (the fields above are the last's)
    critic_traces: Int | None = None  # of buffer_traces, the Critic's paired re-runs (buffer.critic_traces)
    zero_variance_without_critic: Float | None = None  # the groups' zero-variance share had they been left out
    extra_tasks: Int | None = None  # tasks dynamic sampling added to the round's groups (rollout.signal_groups)


@dataclass
class BufferStats(Record):
    size: Int
    lag: Int  # largest model-version lag


# ------------------------------------------------------------------------------------------- rows
@dataclass(kw_only=True)
class RoundRecord(Record):
    """One completed round (a line of ``rounds.jsonl``)."""

    round: Int
    mode: Str
    model_version: Int
    seconds: dict[Str, Float]  # rollout, logprobs, digest, plan, critic, grpo, eval, checkpoint, total, other
    generation_seconds: Float = 0.0  # inside rollout, critic and eval: the policy's generate()
    train: TrainStats
    val: Evaluation | None
    test: Evaluation | None
    infra_failures: InfraFailures | None = None  # None: a record written before rounds counted them
    variants: dict[Str, Str]  # variant → harness id after the round
    by_variant: dict[Str, VariantStats]
    evolve: EvolveRecord | None
    grpo: GRPOMetrics | None
    meta_tokens: JSONDict  # TokenLedger.as_dict() (cumulative)
    buffer: BufferStats | None
    unscaffolded: TrainStats | None = None  # the episodes without the scaffolding (rollout.unscaffolded_attempts)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RecordError("mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def verdicts(self) -> list[VerdictRecord]:
        """The round's Critic verdicts (none when AEGIS did not run: model_only and static rounds)."""
        return list(self.evolve.verdicts) if self.evolve is not None else []

    @property
    def warnings(self) -> list[str]:
        """AEGIS's warnings of the round (none when AEGIS did not run)."""
        return list(self.evolve.warnings) if self.evolve is not None else []

    def verdict_status(self, verdict: VerdictRecord) -> str:
        """``shipped``, ``spawned`` (not shipped, but kept as a new variant this round), ``undecided``
        (the statistical gate wants more evidence; judged again later) or ``rejected``."""
        if verdict.ship:
            return "shipped"
        if verdict.undecided:
            return "undecided"
        spawned = {self.variants.get(name) for name in (self.evolve.spawned if self.evolve is not None else [])}
        if verdict.candidate_id is not None and verdict.candidate_id in spawned:
            return "spawned"
        return "rejected"

    def edit_counts(self, variant: str | None = None) -> dict[str, int]:
        """Verdicts of the round (of one ``variant`` when given) by status."""
        counts = {"shipped": 0, "spawned": 0, "rejected": 0, "undecided": 0}
        for v in self.verdicts:
            if variant is None or v.variant == variant:
                counts[self.verdict_status(v)] += 1
        return counts


@dataclass
class StartRecord(Record):
    """The run's starting harness (routed variants) and model on validation and, when the run
    tests, on test (``start.json``): the row every round is compared with."""

    val: Evaluation | None
    test: Evaluation | None
    variants: dict[Str, Str]
    model_version: Int
    seconds: Float = 0.0


@dataclass
class LineageRow(Record):
    """A harness a variant ran (a line of ``lineage.jsonl``; the harness is ``lineage/<id>.yaml``)."""

    id: Str
    parent_id: Str | None  # the harness it replaced (None for a starting harness)
    round: Int  # -1 for the starting harness
    variant: Str
    how: Str  # LINEAGE_HOWS
    edits: list[Str]  # Edit.describe() of the proposal's edits
    hypothesis: Str

    def __post_init__(self) -> None:
        if self.how not in LINEAGE_HOWS:
            raise RecordError("how", f"must be one of {LINEAGE_HOWS}, got {self.how!r}")
