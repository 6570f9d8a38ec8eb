"""The records a co-evolution run writes: ``RoundRecord`` (a line of ``rounds.jsonl``) with the
records nested in it, and ``LineageRow`` (a line of ``lineage.jsonl``). AEGIS's part of a round
(``EvolveReport`` with its digests and verdicts) is in ``coevo.rundir.evolve_records``.
docs/run-directory.md describes every field.

They are plain dataclasses: the loop builds them, ``to_dict()`` is what the run directory and the
checkpoint hold, and ``from_dict()`` reads them back through pydantic (``TypeAdapter`` over these
dataclasses), strictly where a mistake would go unnoticed: a bool is not a number, a number is not
a string, an int field takes no float. A record that does not fit raises ``ValueError`` naming
where it came from (``<run>/rounds.jsonl:3``) and the field path (``infra_failures.count``,
``evolve.verdicts[0].proposal.edits[1]``). The checks that are not types live here too, in
``__post_init__``: a mode outside ``MODES``, a verdict both shipped and undecided, an edit that is
no ``Edit``, a lineage ``how`` outside ``LINEAGE_HOWS`` (``coevo.rundir.run_files`` reads the files).
The base ``Record`` and the strict scalar types are in ``coevo.rundir.record_checks``.
Fields that records written by older versions lack have defaults, so an older run directory loads.

Imports only ``coevo.config.schema``, ``evolve_records`` and ``record_checks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any

from pydantic import BeforeValidator

from coevo.config.schema import MODES
from coevo.rundir.evolve_records import EvolveReport, Verdict
from coevo.rundir.record_checks import Bool, Float, Int, JSONDict, Record, RecordError, Str

Outcomes = dict[Str, list[Bool]]
"""Task id → one boolean per attempt."""

LINEAGE_HOWS = ("start", "shipped", "spawned", "selected", "released")
"""How a harness became a variant's current one: the events the lineage records (and W&B's
``harness`` artifacts carry); ``coevo.evolution.types.LINEAGE_EVENTS`` is this tuple."""


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
    prompt_tokens: Int = 0  # of them, the prompts' (0 in records written before it): what scaffolding costs


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
class StepMetrics(Record):
    """One GRPO step's figures, computed by ``coevo.trainers.step_metrics.step_metrics`` from the step's
    tensors. A round's record keeps every step's (``GRPOMetrics.steps``)."""

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
    # model-version lag -> traces; rounds.jsonl keeps the last step's only (JSON keys are strings: read back as ints)
    staleness: dict[int, Int] = field(default_factory=dict)
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


def _nest_steps(data: object) -> object:
    """A round's GRPO record as ``rounds.jsonl`` holds it (the last step's figures at the top level,
    the round's reward and zero-variance share over them, every step's but staleness in ``steps``)
    in ``GRPOMetrics``' nested form; anything else as it is."""
    if not isinstance(data, dict) or "last_step" in data:
        return data
    flat = dict(data)
    rows = flat.get("steps")
    if rows is None and flat.get("loss") is not None:  # written before rounds kept every step
        rows = [{k: v for k, v in flat.items() if k in STEP_FIELDS}]
    if isinstance(rows, list) and rows and isinstance(rows[-1], dict):
        rows = [*rows[:-1], rows[-1] | {"staleness": flat.get("staleness") or {}}]
    return {"buffer_traces": flat.get("buffer_traces"), "steps": rows or [],
            **{k: flat.get(k) for k in (*ROUND_WIDE, "critic_traces", "zero_variance_without_critic", "extra_tasks")}}


@dataclass
class GRPOMetrics(Record):
    """The round's GRPO update: every step's ``StepMetrics`` (the last is ``last_step``), the round's
    reward mean and std and zero-variance share over its whole batch (a step may train on part of
    it), and the buffered traces it trained on. ``to_dict`` writes it as ``rounds.jsonl`` always held
    it: the last step's figures at the top level, these three over them."""

    buffer_traces: Int
    steps: list[StepMetrics] = field(default_factory=list)
    reward_mean: Float | None = None  # over the round's trainable traces (every group, signal or not)
    reward_std: Float | None = None
    zero_variance_fraction: Float | None = None
    critic_traces: Int | None = None  # of buffer_traces, the Critic's paired re-runs (buffer.critic_traces)
    zero_variance_without_critic: Float | None = None  # the groups' zero-variance share had they been left out
    extra_tasks: Int | None = None  # tasks dynamic sampling added to the round's groups (rollout.signal_groups)

    @property
    def last_step(self) -> StepMetrics | None:
        return self.steps[-1] if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        last = self.last_step.to_dict() if self.last_step is not None else dict.fromkeys(STEP_FIELDS)
        if self.last_step is not None:
            last |= {k: getattr(self, k) for k in ROUND_WIDE}
        rows = [{k: v for k, v in step.to_dict().items() if k != "staleness"} for step in self.steps]
        return {"buffer_traces": self.buffer_traces, **last, "steps": rows or None, "critic_traces": self.critic_traces,
                "zero_variance_without_critic": self.zero_variance_without_critic, "extra_tasks": self.extra_tasks}

    @classmethod
    def from_dict(cls, data: object, where: str | None = None) -> GRPOMetrics:
        return super().from_dict(_nest_steps(data), where)


STEP_FIELDS = tuple(f.name for f in fields(StepMetrics))
ROUND_WIDE = ("reward_mean", "reward_std", "zero_variance_fraction")
"""The figures the round's record gives over its whole batch where a step gives them over its own."""
GRPORow = Annotated[GRPOMetrics, BeforeValidator(_nest_steps)]
"""A round's GRPO record read back from ``rounds.jsonl``'s form (``GRPOMetrics.to_dict``)."""


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
    evolve: EvolveReport | None
    grpo: GRPORow | None
    meta_tokens: JSONDict  # TokenLedger.as_dict() (cumulative)
    buffer: BufferStats | None
    unscaffolded: TrainStats | None = None  # the episodes without the scaffolding (rollout.unscaffolded_attempts)
    peak_rss_mb: dict[Str, Float] = field(default_factory=dict)  # phase → peak resident MB (PhaseClock.peak_mb)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RecordError("mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def verdicts(self) -> list[Verdict]:
        """The round's Critic verdicts (none when AEGIS did not run: model_only and static rounds)."""
        return list(self.evolve.verdicts) if self.evolve is not None else []

    @property
    def warnings(self) -> list[str]:
        """AEGIS's warnings of the round (none when AEGIS did not run)."""
        return list(self.evolve.warnings) if self.evolve is not None else []

    def verdict_status(self, verdict: Verdict) -> str:
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
