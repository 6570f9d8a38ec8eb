"""Listing only the tools the episodes call: the edit, the digest's record of what was called, the
rule Planner's proposal, and the Critic judging it as a removal (no gain needed, only no harm)."""

from __future__ import annotations

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.trace import ToolCallRecord, Trace
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.evolution.critic import Critic
from coevo.evolution.digest import digest
from coevo.evolution.engine import AEGIS
from coevo.evolution.meta_agent import PlanContext
from coevo.evolution.reference import gold_reference
from coevo.harness.defaults import base_harness
from coevo.harness.edit_record import Edit
from coevo.harness.library import ToolChoice
from coevo.harness.library.execution import PythonExecutor
from coevo.harness.tool_listing import lists_fewer, unlisting
from coevo.meta.rule import RuleMetaAgent
from coevo.rundir.evolve_records import Cluster, Component, Digest, ScaffoldEvidence
from tests.aegis_helpers import critic_rollout, service
from tests.evolution.test_engine import solve


def _registry(harness) -> list[str]:
    return next(p.config["enabled"] for p in harness.processors if p.kind == "tool_registry")


def test_unlisting_enables_only_the_listed_tools_that_were_called():
    h = base_harness()
    assert _registry(h) == ["*"]
    edit = unlisting(h, ["calculator", "made_up"], offered=["calculator", "python"])
    assert (edit.op, edit.param, edit.value) == ("set_param", "enabled", ["calculator"])  # an unknown name is no tool
    assert unlisting(h, ["calculator", "python"], offered=["calculator", "python"]) is None  # every tool was called
    assert unlisting(h, [], offered=["calculator", "python"]) is None  # a model that calls none is not shown fewer
    assert unlisting(h, ["calculator"], offered=["calculator"]) is None  # nothing else is listed
    narrowed = h.set_param(edit.processor, edit.param, edit.value)
    assert unlisting(narrowed, ["calculator"], offered=["calculator", "python"]) is None
    assert unlisting(h.remove(edit.processor), ["calculator"]) is None  # no registry: nothing to narrow
    # offline, the offered tools unknown: every called name counts as listed
    assert unlisting(h, ["calculator"]).value == ["calculator"]


def test_lists_fewer_holds_for_a_strict_narrowing_of_the_registry_only():
    h = base_harness()
    name = next(p.name for p in h.processors if p.kind == "tool_registry")
    assert lists_fewer(h, [Edit("set_param", name, param="enabled", value=["calculator"])])
    assert not lists_fewer(h, [Edit("set_param", name, param="enabled", value=["*"])])
    two = h.set_param(name, "enabled", ["calculator", "python"])
    assert lists_fewer(two, [Edit("set_param", name, param="enabled", value=["python"])])
    assert not lists_fewer(two, [Edit("set_param", name, param="enabled", value=["calculator", "python"])])
    assert not lists_fewer(two, [Edit("set_param", name, param="enabled", value=["calculator", "search"])])
    assert not lists_fewer(h, [Edit("set_param", "sampling", param="max_new_tokens", value=96)])
    assert not lists_fewer(h, [Edit("set_param", name, param="enabled", value=["calculator"]),
                               Edit("remove", "journal")])


def _call(name: str, error: str | None = None, blocked: bool = False) -> ToolCallRecord:
    return ToolCallRecord(step=0, name=name, arguments={}, output="", error=error, seconds=0.0, blocked=blocked)


def test_the_digest_records_the_tools_called_by_a_name_that_ran():
    calls = [_call("calculator", error="division by zero"), _call("made_up", error="unknown tool 'made_up'"),
             _call("python", blocked=True)]
    trace = Trace(trace_id="t", task_id="a", env="e", split="train", harness_id="h", variant="base",
                  model_version="0", reward=1.0, passed=True, tool_calls=calls)
    d = digest([trace], round=0, variant="base")
    assert d.tools_called == ["calculator"]  # an erring call ran; an unknown name and a blocked call did not
    assert "tools the episodes called: calculator" in d.text()
    assert Digest.from_dict(d.to_dict()).tools_called == ["calculator"]


def _digest(harness, tools_called, scaffold=None) -> Digest:
    return Digest(round=0, variant="base", harness_id=harness.id, n_traces=8, n_failed=0, pass_rate=1.0, clusters=[],
                  raw_tokens=100, digest_tokens=10, passed_task_ids=["a"], scaffold=scaffold,
                  tools_called=tools_called)


def test_the_rule_planner_proposes_the_unlisting_after_a_ready_shed_and_not_once_rejected():
    h = base_harness().insert(ToolChoice(tool="calculator"))
    agent = RuleMetaAgent()
    context = PlanContext(max_proposals=2, tools=["calculator", "python"])
    (unlist,) = agent.propose(_digest(h, ["calculator"]), h, context)
    assert [(e.op, e.param, e.value) for e in unlist.edits] == [("set_param", "enabled", ["calculator"])]
    assert "calculator" in unlist.hypothesis
    ready = ScaffoldEvidence(["tool_choice"], 8, 0.9, 0.7, 1.0, 0.75)
    shed, second = agent.propose(_digest(h, ["calculator"], ready), h, context)
    assert [e.op for e in shed.edits] == ["remove"] and second.key() == unlist.key()
    assert agent.propose(_digest(h, ["calculator"]), h, PlanContext(max_proposals=2, tools=["calculator", "python"],
                                                                     rejected={unlist.key()})) == []
    assert agent.propose(_digest(h, []), h, context) == []  # no tool called: the model is not shown fewer
    # a harness holding no scaffolding: a failure's fix comes first, the unlisting after it
    plain = base_harness()
    failing = _digest(plain, ["calculator"])
    failing.clusters = [Cluster(cause="format_error", count=3, task_ids=["a"], trace_ids=["t"], severity=1.0,
                                component=Component(hook="after_model", dimension="parsing", processors=()),
                                excerpts=[])]
    fix, later = agent.propose(failing, plain, context)
    assert fix.cluster == "format_error" and [e.param for e in later.edits] == ["enabled"]


def solve_most(messages) -> str:
    """Calls the calculator on every task and answers one task in three wrongly (the same ones
    whatever the harness lists), so the round has failures for the Planner to read."""
    reply = solve(messages)
    task = next(m["content"] for m in messages if m.get("role") == "user")
    wrong = "<answer>" in reply and sum(map(ord, task)) % 3 == 0
    return "<answer>-999</answer>" if wrong else reply


def _offering_python(solve_fn):
    """(AEGIS with the stat gate and one proposal a round, its round-0 traces) for a scripted model
    under a scaffolded harness that also offers Python: while scaffolding is held, the unlisting
    goes before the failures' fixes."""
    env = ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)
    policy = ScriptedPolicy(solve_fn)
    train = env.tasks("train")
    start = base_harness().insert(PythonExecutor(), index=0).insert(ToolChoice(tool="calculator"))
    critic = Critic(critic_rollout(policy, env, max_steps=6), k=1, gate="stat")
    aegis = AEGIS(start, RuleMetaAgent(), critic, tasks={t.task_id: t for t in train},
                  references={t.task_id: gold_reference(env, t) for t in train[-4:]}, tools=["calculator", "python"])
    aegis.max_proposals = 1
    return aegis, service(policy, env).run(start, train[:6], attempts=1, phase=None, variant="base").traces


def test_aegis_ships_the_unlisting_as_a_removal_when_nothing_is_lost():
    """A model that calls only the calculator, under a scaffolded harness that also offers Python:
    the Critic judges listing only the calculator for non-inferiority, on a shed's episodes, and
    ships it."""
    aegis, traces = _offering_python(solve_most)
    assert {c.name for t in traces for c in t.tool_calls} == {"calculator"} and not all(t.passed for t in traces)
    (verdict,) = aegis.evolve(traces, round=0)[0].verdicts
    assert [(e.param, e.value) for e in verdict.proposal.edits] == [("enabled", ["calculator"])]
    assert verdict.ship and verdict.evidence.noninferiority and verdict.evidence.losses == 0
    assert verdict.evidence.pairs > aegis.critic.budget // 2  # a shed's episodes, not an ordinary edit's
    assert _registry(aegis.harness("base")) == ["calculator"]


def needs_python_listed(messages) -> str:
    """Solves while the system prompt lists Python (which it never calls); answers wrongly once it
    does not: listing fewer tools costs this model everything."""
    listed = "python" in next((m["content"] for m in messages if m.get("role") == "system"), "")
    reply = solve_most(messages)
    return reply if listed or "<answer>" not in reply else "<answer>-999</answer>"


def test_a_rejected_unlisting_stands_for_the_weights_it_was_judged_under_only():
    """The unlisting that loses is rejected under the round's weights: proposed again under the
    same ones, it is not; under the next version it is judged again (a change that costs nothing
    ships only about half the time at a shed's 96 pairs, so one rejection must not end it)."""
    aegis, traces = _offering_python(needs_python_listed)

    def unlisting_judged(round: int, weights: int) -> list:
        report, _ = aegis.evolve(traces, round=round, weights=weights)
        return [v for v in report.verdicts if v.proposal.edits[0].param == "enabled"]

    (first,) = unlisting_judged(0, weights=0)
    assert not first.ship and not first.undecided and first.evidence.losses > 0
    assert unlisting_judged(1, weights=0) == []  # the same weights: it stands
    (again,) = unlisting_judged(2, weights=1)  # the next version: judged anew
    assert again.proposal.key() == first.proposal.key() and _registry(aegis.harness("base")) == ["*"]
