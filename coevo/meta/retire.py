"""Retiring scaffolding: the rule meta-agent's proposal to remove what the harness had to force.

A forced tool-call prefill and worked demonstrations (``coevo.harness.scaffold``) are how AEGIS
first gets a small model to use a tool. Once GRPO has trained the weights on episodes with and
without them (the loop's ``rollout.unscaffolded_attempts``), the digest says how the model behaves
unforced (``Digest.scaffold``). When it calls the tool unforced nearly as often and passes nearly
as often, the scaffolding only costs prompt tokens on every call, so the Planner proposes removing
it; the Critic judges the removal like any edit, and it ships only if no task regresses beyond
the gate's bound.

The same holds for tools the episodes never call: each listed tool costs its line of the system
prompt on every call. Once the episodes call a tool, the Planner proposes listing only the tools
they called (``unused_tools``), judged like a shed: no gain needed, only no harm.
"""

from __future__ import annotations

from coevo.evolution.meta_agent import PlanContext
from coevo.harness.harness import Harness
from coevo.harness.hooks import Dimension
from coevo.harness.scaffold import outer_scaffold, retire_outer_scaffold
from coevo.harness.tool_listing import unlisting
from coevo.rundir.evolve_records import RETIRE_KEEP, RETIRE_TOOL_USE, Digest, Proposal, ScaffoldEvidence


def ready(evidence: ScaffoldEvidence | None, tool_use: float = RETIRE_TOOL_USE, keep: float = RETIRE_KEEP) -> bool:
    """Whether the episodes without the scaffolding show the behaviour it forces
    (``ScaffoldEvidence.ready``); False without evidence."""
    return evidence is not None and evidence.ready(tool_use, keep)


def retirement(digest: Digest, harness: Harness, context: PlanContext) -> Proposal | None:
    """The proposal that removes the scaffold layer the evidence was measured without (the forced
    prefill, or the demonstration nearest the task), when ``ready``; None otherwise, or when that
    layer is no longer the harness's outermost."""
    evidence = digest.scaffold
    if not ready(evidence) or not evidence.scaffold or evidence.scaffold != outer_scaffold(harness):
        return None
    return Proposal(
        hypothesis=f"retire the scaffolding: {evidence.text()}; without it every call's prompt is shorter",
        edits=retire_outer_scaffold(harness),
        dimension=Dimension.TOOLS.value,
        at_risk=list(digest.passed_task_ids),
        variant=context.variant,
        source="rule",
    )


def unused_tools(digest: Digest, harness: Harness, context: PlanContext) -> Proposal | None:
    """The proposal that lists only the tools the round's episodes called, when they called one
    and the harness lists others (``coevo.harness.tool_listing``); None otherwise."""
    edit = unlisting(harness, digest.tools_called, context.tools or None)
    if edit is None:
        return None
    return Proposal(
        hypothesis=(f"list only the tools the episodes called ({', '.join(edit.value)}): every other tool's line "
                    "is paid on every call and no episode of this round called it"),
        edits=[edit],
        dimension=Dimension.TOOLS.value,
        at_risk=list(digest.passed_task_ids),
        variant=context.variant,
        source="rule",
    )
