"""AEGIS's vocabulary that the run directory does not read back: the failure taxonomy, a classified
``Failure``, and the ``HarnessEvent`` records AEGIS returns to its caller.

Digester → ``Digest`` → Planner (a meta-agent) → ``Proposal`` (typed edits + change manifest) →
Evolver → candidate ``Harness`` → Critic → ``Verdict``, and a round's ``EvolveReport``: those are
defined once where the run directory reads them back (``coevo.rundir.evolve_records``).

``CAUSES`` is the failure taxonomy; ``IMPLICATED`` maps each cause to the harness component it
points at (the hook, the dimension and the built-in processor kinds an edit would touch). A
literal dict, so the rule meta-agent and the Digester share one source of truth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from coevo.harness.harness import Harness
from coevo.rundir.evolve_records import Component, Verdict
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
