"""The values AEGIS passes between its stages: failures and digests, proposals, verdicts, and what
it returns to its caller: ``HarnessEvent`` records and the ``EvolveReport`` of a round.

Digester → ``Digest`` → Planner (a meta-agent) → ``Proposal`` (typed edits + change manifest) →
Evolver → candidate ``Harness`` → Critic → ``Verdict``. They are plain dataclasses with
``to_dict`` so they can be logged, cached, shown to an LLM meta-agent and written to a run
directory without a custom encoder.

``CAUSES`` is the failure taxonomy; ``IMPLICATED`` maps each cause to the harness component it
points at (the hook, the dimension and the built-in processor kinds an edit would touch). A
literal dict, so the rule meta-agent and the Digester share one source of truth.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from coevo.harness.edits import Edit
from coevo.harness.harness import Harness
from coevo.rundir.records import LINEAGE_HOWS, LineageRow

CAUSES = (
    "format_error",  # neither a parseable tool call nor an answer
    "tool_misuse",  # a tool was called with bad arguments / raised an error
    "missing_tool",  # the task needs a capability the harness does not enable
    "wrong_tool",  # called a tool that does not exist or is not enabled
    "loop",  # repeated the same action until the loop detector stopped it
    "step_budget",  # ran out of steps before answering
    "premature_answer",  # answered before using the tools the task needs
    "wrong_answer",  # answered in the right format, verifier said no
    "env_error",  # the harness's machinery failed: a processor crashed, a tool timed out
    "truncated",  # a completion cut at its own token budget
    "context_overflow",  # a completion cut by the context window (the history is too long)
)
"""Root causes a failed trace is assigned to (first match in ``coevo.evolution.digest``)."""


@dataclass(frozen=True)
class Component:
    """The part of the harness a failure implicates."""

    hook: str
    dimension: str
    processors: tuple[str, ...]  # built-in processor kinds an edit for this cause would touch


IMPLICATED: dict[str, Component] = {
    "format_error": Component("after_model", "context_assembly", ("few_shot", "system_prompt", "json_tool_parser",
                                                                   "parse_retry")),
    "tool_misuse": Component("task_start", "tools", ("tool_schema_hint", "few_shot", "argument_guard")),
    "missing_tool": Component("task_start", "tools", ("tool_registry", "python_executor")),
    "wrong_tool": Component("before_tool", "tools", ("tool_whitelist", "tool_schema_hint")),
    "loop": Component("step_end", "control_safety", ("loop_detection", "temperature_schedule")),
    "step_budget": Component("step_end", "control_safety", ("step_budget",)),
    "premature_answer": Component("after_model", "evaluation_reward", ("few_shot", "tool_choice", "self_verification",
                                                                       "system_prompt")),
    "wrong_answer": Component("task_start", "context_assembly", ("few_shot", "self_verification", "python_executor")),
    "env_error": Component("before_tool", "execution_environment", ("tool_timeout", "infra_error_filter")),
    "truncated": Component("before_model", "sampling", ("sampling",)),
    "context_overflow": Component("before_model", "memory", ("sliding_window", "summary_memory")),
}
assert set(IMPLICATED) == set(CAUSES)


@dataclass
class Failure:
    """One failed trace, classified. ``step`` is where it went wrong (the first divergence from
    the reference trajectory when there is one, else the step the cause was detected at)."""

    trace_id: str
    task_id: str
    variant: str
    cause: str
    step: int | None
    excerpt: str  # a short quote of the trace around ``step`` (what a meta-agent reads)
    detail: str = ""  # one line: what the classifier saw
    diverged_from_reference: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cluster:
    """Failures sharing a root cause. ``severity`` is the share of the round's failed traces in it."""

    cause: str
    component: Component
    count: int
    severity: float
    task_ids: list[str]
    trace_ids: list[str]
    excerpts: list[str]  # representative: at most a few, from distinct tasks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def edits_key(edits: Sequence[Edit]) -> str:
    """Identity of a change (its edits without their manifests): equal for equal changes."""
    return json.dumps([e.to_dict() | {"manifest": None} for e in edits], sort_keys=True, default=str)


RETIRE_TOOL_USE = 0.6
"""Unforced tool use at which removing a scaffold layer is worth judging: below it the Critic would
see the episodes that answer without the tool fail, and the proposal would spend its budget to be
rejected."""
RETIRE_KEEP = 0.8
"""Unforced pass rate, as a share of the scaffolded one, at which removal is worth judging (the
Critic's paired gate, not this threshold, decides whether it ships)."""


@dataclass
class ScaffoldEvidence:
    """How the model behaves on a variant's tasks with and without the harness's outermost scaffold
    layer (``coevo.harness.scaffold``), from the same round's episodes of both under the same
    weights: what a proposal to retire that layer rests on (``coevo.meta.retire``)."""

    scaffold: list[str]  # the layer's processor names (what a retirement removes)
    episodes: int  # episodes without the layer
    tool_use: float  # share of them that called a tool
    pass_rate: float
    scaffolded_tool_use: float  # the variant's own episodes, with the scaffolding
    scaffolded_pass_rate: float

    def ready(self, tool_use: float = RETIRE_TOOL_USE, keep: float = RETIRE_KEEP) -> bool:
        """Whether the episodes without the layer show the behaviour it forces: the tool called in at
        least ``tool_use`` of them and a pass rate at least ``keep`` times the scaffolded one."""
        return self.tool_use >= tool_use and self.pass_rate >= keep * self.scaffolded_pass_rate - 1e-9

    def text(self) -> str:
        return (f"without its scaffolding {', '.join(self.scaffold)} the model called a tool in "
                f"{100 * self.tool_use:.0f}% of {self.episodes} episodes and passed {100 * self.pass_rate:.0f}% "
                f"(with it: {100 * self.scaffolded_tool_use:.0f}% and {100 * self.scaffolded_pass_rate:.0f}%)")


@dataclass
class Digest:
    """A round's traces compressed for the Planner (one per harness variant)."""

    round: int
    variant: str
    harness_id: str
    n_traces: int
    n_failed: int
    pass_rate: float
    clusters: list[Cluster]
    raw_tokens: int  # estimated tokens of the raw traces the digest replaces
    digest_tokens: int  # estimated tokens of ``text()``
    passed_task_ids: list[str] = field(default_factory=list)
    failed_task_ids: list[str] = field(default_factory=list)
    n_infra: int = 0  # infrastructure failures (Trace.infra_failure): counted, in no cluster, not in n_failed
    scaffold: ScaffoldEvidence | None = None  # set when the round also ran the harness without its scaffolding

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
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"compression": self.compression}


@dataclass
class Proposal:
    """A Planner's hypothesis with the typed edits that test it and its change manifest.

    Scope: ``cluster`` (a cause) and/or ``target_tasks``; ``predicted_flips`` are tasks expected to
    go fail→pass, ``at_risk`` tasks that passed and might break. ``edits`` apply in order.
    ``code`` is set for a code-level edit (source of a processor subclass calling ``super()``).
    """

    hypothesis: str
    edits: list[Edit]
    dimension: str
    cluster: str | None = None
    target_tasks: list[str] = field(default_factory=list)
    predicted_flips: list[str] = field(default_factory=list)
    at_risk: list[str] = field(default_factory=list)
    variant: str = "base"
    source: str = "rule"  # which meta-agent backend proposed it
    revision: int = 0  # 0 for the first draft, +1 per Critic-requested revision

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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proposal:
        data = dict(data)
        data["edits"] = [Edit.from_dict(e) for e in data.get("edits", [])]
        return cls(**data)


@dataclass
class QualityReport:
    """The Critic's static gate: leakage and bloat scores against their thresholds."""

    passed: bool
    leakage: float
    bloat: float
    reason: str = ""
    leaked: list[str] = field(default_factory=list)  # the offending strings, for the revision prompt

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Verdict:
    """What the Critic decided for one candidate, and why."""

    proposal: Proposal
    parent_id: str
    candidate_id: str | None  # None when the edit did not even build
    variant: str
    ship: bool
    reason: str
    quality: QualityReport | None = None
    before: dict[str, list[bool]] = field(default_factory=dict)  # task -> outcomes of k attempts (stat: the
    after: dict[str, list[bool]] = field(default_factory=dict)  # parent's and candidate's paired attempts)
    fail_to_pass: list[str] = field(default_factory=list)  # stat gate: tasks with more wins than losses
    pass_to_fail: list[str] = field(default_factory=list)  # stat gate: confirmed regressions
    gate: str = ""  # which gate decided: build | quality | stat | seesaw | performance | seesaw+performance
    round: int = 0
    undecided: bool = False  # stat gate: not enough evidence; judged again later with its pairs pooled
    evidence: dict[str, Any] | None = None  # stat gate: counts, statistic, thresholds, budget used

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["proposal"] = self.proposal.to_dict()
        return d


LINEAGE_EVENTS = LINEAGE_HOWS
"""Events that make ``harness`` a variant's current harness (the run's lineage records each;
stated once, in ``coevo.rundir.records``)."""


@dataclass
class HarnessEvent:
    """One thing that happened to a variant's harness, as AEGIS reports it to its caller, so the
    caller records lineage without diffing harness ids or reading the engine's fields.

    ``how``: ``start`` (a variant's harness when the run began), ``shipped`` (an edit the Critic
    accepted replaced it), ``spawned`` (a rejected-for-seesaw edit became a new variant),
    ``selected`` (epoch end: a pool snapshot did better on validation), ``released`` (a stream
    stage gave it new capabilities), ``rejected`` (an edit the Critic refused; ``harness`` is the
    candidate, None when the edit did not build). ``edits`` and ``hypothesis`` are the proposal's
    change manifest; ``parent_id`` the harness it replaced or was built from.
    """

    how: str
    round: int
    variant: str
    harness: Harness | None
    parent_id: str | None
    edits: list[str] = field(default_factory=list)
    hypothesis: str = ""

    @property
    def changes_variant(self) -> bool:
        return self.how in LINEAGE_EVENTS

    def lineage_row(self) -> LineageRow:
        """The ``lineage.jsonl`` row (the harness itself is saved as ``lineage/<id>.yaml``); only
        for the events that change a variant (``changes_variant``), which all carry their harness."""
        if self.harness is None or not self.changes_variant:
            raise ValueError(f"a {self.how!r} event without a harness has no lineage row")
        return LineageRow(self.harness.id, self.parent_id, self.round, self.variant, self.how, list(self.edits),
                          self.hypothesis)

    @classmethod
    def from_verdict(cls, how: str, verdict: Verdict, candidate: Harness | None) -> HarnessEvent:
        return cls(how, verdict.round, verdict.variant, candidate, verdict.parent_id,
                   [e.describe() for e in verdict.proposal.edits], verdict.proposal.hypothesis)


@dataclass
class EvolveReport:
    """What one ``evolve`` call did, for the round table, W&B and the run directory."""

    round: int
    digests: list[Digest] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    events: list[HarnessEvent] = field(default_factory=list)  # shipped, spawned and rejected candidates
    warnings: list[str] = field(default_factory=list)
    stopped: str | None = None  # which patience ran out, when the search is over
    seconds: dict[str, float] = field(default_factory=dict)  # digest / plan / critic

    @property
    def shipped(self) -> list[str]:
        """Candidate ids that became a variant's harness."""
        return [e.harness.id for e in self.events if e.how == "shipped"]

    @property
    def spawned(self) -> list[str]:
        """Names of the variants the round created."""
        return [e.variant for e in self.events if e.how == "spawned"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "digests": [d.to_dict() for d in self.digests],
            "verdicts": [v.to_dict() for v in self.verdicts],
            "shipped": self.shipped,
            "spawned": self.spawned,
            "warnings": self.warnings,
            "stopped": self.stopped,
            "seconds": self.seconds,
        }
