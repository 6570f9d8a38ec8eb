"""A processor of your own: written, type-checked by the algebra, run, and proposed by the rule meta-agent.

The worked example of docs/processors.md. ``ToolCallBudget`` is a control/safety processor at the
``before_tool`` hook: after ``max_calls`` tool calls in an episode it answers further calls itself
with a reminder to give the final answer, instead of running them. A model that keeps calling a tool
it has already got the answer from (a ``loop`` failure) is told to stop and answer.

Run it from the repository root (the processor's kind is its import path, so ``examples`` must be
importable):

    python -m examples.my_processor
"""

from __future__ import annotations

import re
from typing import Any

from coevo.agent.evaluate import evaluate
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs import ArithmeticEnv
from coevo.evolution.critic import Critic
from coevo.evolution.digest import digest
from coevo.evolution.engine import AEGIS
from coevo.evolution.meta_agent import PlanContext
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.errors import CompositionError
from coevo.harness.events import Message, ParsedOutputEvent, ToolCallEvent, ToolResult
from coevo.harness.harness import Harness
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library import ArgumentGuard
from coevo.harness.processor import Param, Processor
from coevo.meta.drafts import Draft, Template, find_kind, insert_edit
from coevo.meta.rule import RuleMetaAgent
from coevo.meta.templates import CATALOGUE, TEMPLATES
from coevo.rundir.evolve_records import Cluster

REMINDER = "You have used your tool calls for this task. Give your final answer now as <answer>...</answer>."


class ToolCallBudget(Processor):
    """Answers tool calls beyond ``max_calls`` per episode with ``message`` instead of running them."""

    # A processor defined outside coevo is named in specs (harness YAML, lineage, edits) by its import
    # path, so any process can load it back: the kind must be exactly "module:ClassName".
    kind = "examples.my_processor:ToolCallBudget"
    description = "After max_calls tool calls in an episode, answers further calls with a reminder to give the answer."
    hook = Hook.BEFORE_TOOL
    dimension = Dimension.CONTROL
    consumes = produces = ToolCallEvent  # before_tool receives a ToolCallEvent and must hand one on
    group = "tool_call_budget"  # singleton: a harness holds at most one budget
    runs_after = frozenset({"argument_guard"})  # a call a guard already blocked does not use up the budget
    params = (
        Param("max_calls", "int", 4, "tool calls an episode may run"),
        Param("message", "prompt", REMINDER, "what a call over the budget returns, as a tool error"),
    )
    COUNT = "tool_call_budget_used"  # state.memory key: processors are immutable, episode state lives there

    def process(self, event: ToolCallEvent) -> ToolCallEvent:
        if event.result is not None:  # another processor answered the call already
            return event
        used = event.state.memory.get(self.COUNT, 0)
        if used >= self.config["max_calls"]:
            event.result = ToolResult("", error=self.config["message"])  # setting result skips the tool
        else:
            event.state.memory[self.COUNT] = used + 1
        return event


class MisTyped(ToolCallBudget):
    """A mistake the algebra catches: it claims to consume a ParsedOutputEvent at before_tool."""

    consumes = produces = ParsedOutputEvent


# --------------------------------------------------------------------- the rule meta-agent's template
def propose_budget(cluster: Cluster, harness: Harness, context: PlanContext) -> Draft | None:
    """The catalogue template: insert a budget, unless the harness has one. It reads the harness like the
    built-in templates do: the reminder must come before the loop detector ends the episode, so at most
    window - 2 calls run (the blocked call is the window - 1-th identical action, the answer the next)."""
    if find_kind(harness, ToolCallBudget.kind) is not None:
        return None
    loop = find_kind(harness, "loop_detection")
    budget = ToolCallBudget(name="tool_call_budget", max_calls=max(1, (loop.config["window"] if loop else 3) - 2))
    edit = insert_edit(harness, budget)  # the latest position of its hook that the algebra accepts
    why = f"{cluster.count} failed traces ({cluster.cause}): the model repeats tool calls; ask for the answer"
    return (why, [edit]) if edit else None


BUDGET_TEMPLATE = Template("tool_call_budget", (ToolCallBudget.kind,), propose_budget)


def budget_agent() -> RuleMetaAgent:
    """The rule meta-agent with the template first in line for ``loop`` and ``step_budget`` failures."""
    catalogue = {**CATALOGUE, "loop": ("tool_call_budget", *CATALOGUE["loop"]),
                 "step_budget": ("tool_call_budget", *CATALOGUE["step_budget"])}
    return RuleMetaAgent(templates={**TEMPLATES, "tool_call_budget": BUDGET_TEMPLATE}, catalogue=catalogue)


# ------------------------------------------------------------------------------------------ the demo
def stubborn(messages: list[Message]) -> str:
    """A scripted model that keeps calling the calculator on the task's expression and answers only
    when a tool tells it to, with the last result it got."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool" and "final answer now" in last.get("content", ""):
        results = [m["content"] for m in messages if m.get("role") == "tool" and not m["content"].startswith("Error")]
        return f"<answer>{results[-1] if results else '0'}</answer>"
    task = next((m["content"] for m in messages if m.get("role") == "user"), "")
    expression = re.search(r"What is ([-\d+*/() .]+)\?", task)
    arguments = '{"expression": "%s"}' % (expression.group(1).strip() if expression else "0")
    return f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'


def refusal(make: Any) -> str:
    """The algebra's error for a composition, as the meta-agent would read it."""
    try:
        make()
    except CompositionError as err:
        return str(err)
    raise AssertionError("the algebra accepted a composition it must refuse")


def main() -> dict[str, Any]:
    base = base_harness()
    budget = ToolCallBudget(name="tool_call_budget", max_calls=1)
    print("manifest:", budget.manifest())
    with_budget = base.insert(budget)
    print(f"inserted: {base.id} -> {with_budget.id}; before_tool:", [p.name for p in with_budget.at("before_tool")])

    refusals = {
        "same_hook": refusal(lambda: base.insert(budget, hook="after_model")),
        "ordering": refusal(lambda: base.insert(ArgumentGuard()).insert(budget, index=0)),
        "singleton_group": refusal(lambda: with_budget.insert(ToolCallBudget(name="second_budget"))),
        "event_type": refusal(lambda: base.insert(MisTyped(name="mistyped"))),
        "unknown_processor": refusal(lambda: apply_edit(base, Edit(
            "insert", "x", spec={"kind": "examples.my_processor:NoSuchProcessor"}))),
    }
    for rule, message in refusals.items():
        print(f"refused ({rule}): {message}")

    env, policy = ArithmeticEnv(n_tasks=12, max_terms=2, seed=1), ScriptedPolicy(stubborn)
    rollouts = RolloutService(policy, env, batch_size=32, max_steps=32, workers=8, seed=0)
    before, traces = evaluate(base, rollouts, "train")
    found = digest(traces, round=0, variant="base")
    print("digest:", [(c.cause, c.count) for c in found.clusters])
    (proposal,) = budget_agent().propose(found, base, PlanContext(tools=["calculator"], max_proposals=1))
    print("proposal:", proposal.hypothesis, [e.describe() for e in proposal.edits])
    evolved = base
    for edit in proposal.edits:
        evolved = apply_edit(evolved, edit)  # the spec's import-path kind is resolved here
    reloaded = Harness.from_yaml(evolved.to_yaml())
    after, evolved_traces = evaluate(evolved, rollouts, "train")
    blocked = sum(e.get("blocked", False) for t in evolved_traces for e in t.events if e.get("hook") == "before_tool")
    print(f"train pass@1: base {before.pass_at_1:.2f} -> with the budget {after.pass_at_1:.2f}; "
          f"blocked tool calls: {blocked}; YAML round trip keeps the id: {reloaded.id == evolved.id}")

    # The whole AEGIS round, as `coevo evolve --meta examples.my_processor:budget_agent` runs it: digest, the
    # agent's proposal, the Critic's re-run and seesaw gate (no task may flip to fail), then ship.
    train = env.tasks("train")
    critic = Critic(rollouts.critic_rollout(), k=1, gate="seesaw")
    aegis = AEGIS(base, budget_agent(), critic, tasks={t.task_id: t for t in train}, tools=["calculator"],
                  max_proposals=1)
    harnesses, variants = aegis.routed(train)
    round_traces = rollouts.run(harnesses, train, attempts=1, phase=None, variant=variants).traces
    report, _ = aegis.evolve(round_traces, round=0)
    print("AEGIS verdict:", [(v.gate, v.reason) for v in report.verdicts], "-> shipped", report.shipped)
    return {"refusals": refusals, "causes": [c.cause for c in found.clusters], "proposal": proposal,
            "evolved": evolved, "reloaded": reloaded, "before": before, "after": after, "blocked": blocked,
            "base_traces": traces, "evolved_traces": evolved_traces, "aegis": aegis, "report": report}


if __name__ == "__main__":
    main()
