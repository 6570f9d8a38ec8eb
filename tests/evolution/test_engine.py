"""AEGIS end to end on the arithmetic env with scripted policies whose behaviour depends on the
harness, so the outcome of each edit is known in advance."""

from __future__ import annotations

import json
import re

import pytest

from coevo.agent.policy import ScriptedPolicy
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.evolution.critic import Critic
from coevo.evolution.driver import rollout_fn, routed_pass_rate, run_round
from coevo.evolution.engine import AEGIS
from coevo.evolution.pool import Patience
from coevo.evolution.reference import gold_reference
from coevo.evolution.types import Proposal
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.meta.base import PlanContext, TokenLedger
from coevo.meta.rule import RuleMetaAgent


def _task_expression(messages) -> str | None:
    """The expression of the real task: the last user message that asks one."""
    for m in reversed(messages):
        if m.get("role") == "user":
            found = re.search(r"What is ([-\d+*/() .]+)\?", m.get("content") or "")
            if found:
                return found.group(1).strip()
    return None


def solve(messages) -> str:
    last = messages[-1]
    if last.get("role") in ("tool", "user") and last.get("content", "").strip().lstrip("-").isdigit():
        return f"<answer>{last['content'].strip()}</answer>"
    if last.get("role") == "tool" or "[calculator result]" in (last.get("content") or ""):
        value = re.findall(r"-?\d+", last["content"])[-1]
        return f"<answer>{value}</answer>"
    expr = _task_expression(messages)
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'


def needs_demo(messages) -> str:
    """Solves the task only once a worked demonstration precedes it (what moves a small model)."""
    demo = any(m.get("role") == "assistant" and "<answer>" in (m.get("content") or "") for m in messages[:-1])
    return solve(messages) if demo else "I think the answer is probably something."


@pytest.fixture(scope="module")
def env():
    return ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)


def make_aegis(env, policy, meta, **kwargs) -> AEGIS:
    train = env.tasks("train")
    refs = {t.task_id: gold_reference(env, t) for t in train[-4:]}
    critic = Critic(rollout_fn(policy, env, max_steps=6), k=kwargs.pop("k", 1), gate=kwargs.pop("gate", "seesaw"))
    return AEGIS(base_harness(), meta, critic, tasks={t.task_id: t for t in train}, references=refs,
                 tools=["calculator"], **kwargs)


def test_rule_agent_ships_a_demonstration_that_fixes_the_format(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent())
    batch = env.tasks("train")[:6]
    traces, report = run_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
    assert not any(t.passed for t in traces)
    assert [c.cause for c in report.digests[0].clusters] == ["format_error"]
    assert len(report.shipped) == 1
    shipped = aegis.harness("base")
    assert shipped.id == report.shipped[0] and "few_shot" in {p.kind for p in shipped}
    verdict = next(v for v in report.verdicts if v.ship)
    assert verdict.fail_to_pass == sorted(t.task_id for t in batch) and verdict.pass_to_fail == []
    # the demos come from references of tasks outside the batch, never from the judged tasks
    demo_text = json.dumps(dict(shipped.get(next(p.name for p in shipped if p.kind == "few_shot")).config))
    assert not any(t.instruction in demo_text for t in batch)
    traces, report = run_round(aegis, env.tasks("train")[6:12], policy, env, round=1, attempts=1, max_steps=6)
    assert all(t.passed for t in traces) and report.verdicts == []
    assert routed_pass_rate(aegis, env.tasks("val")[:8], policy, env, max_steps=6) == 1.0


class ScriptedMeta:
    """A meta-agent test double: hands out prepared proposals, records revision requests."""

    name = "scripted"

    def __init__(self, proposals, revisions=()):
        self.proposals, self.revisions = list(proposals), list(revisions)
        self.ledger = TokenLedger()
        self.reasons: list[str] = []

    def propose(self, digest, harness, context: PlanContext):
        out = [p for p in self.proposals if p.key() not in context.rejected][: context.max_proposals]
        self.proposals = [p for p in self.proposals if p not in out]
        return out

    def revise(self, proposal, reason, digest, harness, context):
        self.reasons.append(reason)
        return self.revisions.pop(0) if self.revisions else None

    def state_dict(self):
        return {"ledger": self.ledger.as_dict()}

    def load_state_dict(self, state):
        self.ledger.load(state["ledger"])


def template_edit(text: str) -> Proposal:
    spec = {"kind": "instruction_template", "name": "instruction_template", "params": {"template": text}}
    return Proposal(hypothesis="rephrase", edits=[Edit("insert", "instruction_template", spec=spec)],
                    dimension="context_assembly", cluster="format_error")


def test_a_proposal_that_breaks_a_passing_task_is_rejected_and_kept_as_a_variant(env):
    # base harness: solves only additions; with "MULT" in the task message: only the others
    def respond(messages):
        expr = _task_expression(messages) or ""
        mult = any("MULT" in (m.get("content") or "") for m in messages if m.get("role") == "user")
        return solve(messages) if ("+" in expr) != mult else "no idea"

    policy = ScriptedPolicy(respond)
    meta = ScriptedMeta([template_edit("MULT {instruction}")])
    aegis = make_aegis(env, policy, meta, max_variants=2)
    batch = env.tasks("train")[:10]
    adds = sorted(t.task_id for t in batch if "+" in t.instruction)
    others = sorted(t.task_id for t in batch if "+" not in t.instruction)
    assert adds and others
    _, report = run_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
    (verdict,) = report.verdicts
    assert not verdict.ship and verdict.gate == "seesaw"
    assert verdict.pass_to_fail == adds and verdict.fail_to_pass == others
    assert report.spawned == ["v1"] and aegis.harness("base").id == base_harness().id
    routed = aegis.assign(batch)
    assert {tid for tid, v in routed.items() if v == "v1"} == set(others)
    # routed, every task now passes: variant isolation instead of a global compromise
    assert routed_pass_rate(aegis, batch, policy, env, max_steps=6) == 1.0


def test_quality_rejection_goes_back_for_revision(env):
    batch = env.tasks("train")[:4]
    target = next(t for t in batch if abs(t.answer) >= 100)  # short answers may occur by chance
    leaked = template_edit(f"{{instruction}} (hint: the answer is {target.answer})")
    clean = template_edit("Use the calculator tool. {instruction}")
    meta = ScriptedMeta([leaked], revisions=[clean])
    policy = ScriptedPolicy(lambda m: "no idea")
    aegis = make_aegis(env, policy, meta)
    _, report = run_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
    first, second = report.verdicts
    assert first.gate == "quality" and str(target.answer) in meta.reasons[0]
    assert second.proposal.revision == 1 and second.gate == "seesaw" and not second.ship  # nothing flipped
    assert meta.proposals == []


def test_state_dict_round_trip_restores_routing_and_harnesses(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent(), patience=Patience(rounds=3, batches=3, epochs=1))
    run_round(aegis, env.tasks("train")[:6], policy, env, round=0, attempts=1, max_steps=6)
    state = json.loads(json.dumps(aegis.state_dict()))
    fresh = make_aegis(env, policy, RuleMetaAgent(), patience=Patience(rounds=3, batches=3, epochs=1))
    fresh.load_state_dict(state)
    assert fresh.harness("base").id == aegis.harness("base").id
    assert fresh.assign(env.tasks("train")) == aegis.assign(env.tasks("train"))
    assert fresh.state_dict() == state


def test_epoch_end_selection_keeps_the_best_snapshot_on_validation(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent())
    run_round(aegis, env.tasks("train")[:6], policy, env, round=0, attempts=1, max_steps=6)
    shipped = aegis.harness("base").id
    # the pool holds the starting harness and the shipped one; selection follows the val score
    chosen = aegis.select(lambda h: 0.0 if h.id == shipped else 1.0)
    assert chosen["base"] == base_harness().id == aegis.harness("base").id
    chosen = aegis.select(lambda h: 1.0 if h.id == shipped else 0.0)
    assert chosen["base"] == shipped == aegis.harness("base").id
    assert aegis.select(lambda h: 0.5)["base"] == base_harness().id  # a tie goes to the earlier snapshot
