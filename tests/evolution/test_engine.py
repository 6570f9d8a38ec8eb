"""AEGIS end to end on the arithmetic env with scripted policies whose behaviour depends on the
harness, so the outcome of each edit is known in advance."""

from __future__ import annotations

import json
import re

import pytest

from coevo.agent.policy import Policy, ScriptedPolicy
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.evolution.critic import Critic
from coevo.evolution.engine import AEGIS
from coevo.evolution.meta_agent import PlanContext, TokenLedger
from coevo.evolution.pool import Patience
from coevo.evolution.reference import fresh_demos, gold_reference
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.meta.rule import RuleMetaAgent
from coevo.rundir.evolve_records import Proposal
from tests.aegis_helpers import critic_rollout, evolve_round, routed_pass_rate


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
    critic = Critic(critic_rollout(policy, env, max_steps=6), k=kwargs.pop("k", 1), gate=kwargs.pop("gate", "seesaw"))
    return AEGIS(base_harness(), meta, critic, tasks={t.task_id: t for t in train}, references=refs,
                 tools=["calculator"], **kwargs)


def test_rule_agent_ships_a_demonstration_that_fixes_the_format(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent())
    batch = env.tasks("train")[:6]
    traces, report = evolve_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
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
    traces, report = evolve_round(aegis, env.tasks("train")[6:12], policy, env, round=1, attempts=1, max_steps=6)
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
    _, report = evolve_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
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
    _, report = evolve_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=6)
    first, second = report.verdicts
    assert first.gate == "quality" and str(target.answer) in meta.reasons[0]
    assert second.proposal.revision == 1 and second.gate == "seesaw" and not second.ship  # nothing flipped
    assert meta.proposals == []


def test_state_dict_round_trip_restores_routing_and_harnesses(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent(), patience=Patience(rounds=3, batches=3, epochs=1))
    evolve_round(aegis, env.tasks("train")[:6], policy, env, round=0, attempts=1, max_steps=6)
    state = json.loads(json.dumps(aegis.state_dict()))
    fresh = make_aegis(env, policy, RuleMetaAgent(), patience=Patience(rounds=3, batches=3, epochs=1))
    fresh.load_state_dict(state)
    assert fresh.harness("base").id == aegis.harness("base").id
    assert fresh.assign(env.tasks("train")) == aegis.assign(env.tasks("train"))
    assert fresh.state_dict() == state


def test_epoch_end_selection_keeps_the_best_snapshot_on_validation(env):
    policy = ScriptedPolicy(needs_demo)
    aegis = make_aegis(env, policy, RuleMetaAgent())
    evolve_round(aegis, env.tasks("train")[:6], policy, env, round=0, attempts=1, max_steps=6)
    shipped = aegis.harness("base").id
    # the pool holds the starting harness and the shipped one; selection follows the val score
    (event,) = aegis.select(lambda h: 0.0 if h.id == shipped else 1.0, round=1)
    assert (event.how, event.variant, event.parent_id, event.round) == ("selected", "base", shipped, 1)
    assert event.harness.id == base_harness().id == aegis.harness("base").id
    (event,) = aegis.select(lambda h: 1.0 if h.id == shipped else 0.0, round=2)
    assert event.harness.id == shipped == aegis.harness("base").id and event.parent_id == base_harness().id
    assert aegis.select(lambda h: 1.0 if h.id == shipped else 0.0, round=3) == []  # unchanged: no event
    aegis.select(lambda h: 0.5, round=4)
    assert aegis.harness("base").id == base_harness().id  # a tie goes to the earlier snapshot


def test_infrastructure_failures_give_the_planner_nothing(env):
    """The policy runs out of memory on two tasks of a batch the model otherwise solves: those
    crashes form no failure cluster, draw no proposal, and are no evidence in the variant's records
    (no harness edit can fix the machine)."""
    batch = env.tasks("train")[:4]
    crash = {batch[1].task_id, batch[3].task_id}
    expressions = {t.instruction for t in batch if t.task_id in crash}

    class OutOfMemoryOn(Policy):
        model_version = "oom"

        def __init__(self) -> None:
            self.solver = ScriptedPolicy(solve)

        def generate(self, requests):
            if any(m.get("content") in expressions for r in requests for m in r.messages):
                raise MemoryError("CUDA out of memory")
            return self.solver.generate(requests)

    meta = ScriptedMeta([template_edit("Task: {instruction}")])
    aegis = make_aegis(env, OutOfMemoryOn(), meta)
    traces, report = evolve_round(aegis, batch, OutOfMemoryOn(), env, round=0, attempts=1, batch_size=1, max_steps=6)
    crashed = [t for t in traces if t.task_id in crash]
    assert all(t.infra_failure and t.error_source == "policy" for t in crashed)
    assert all(t.passed for t in traces if t.task_id not in crash)
    (dig,) = report.digests
    assert dig.clusters == [] and (dig.n_infra, dig.n_failed, dig.pass_rate) == (2, 0, 1.0)
    assert report.verdicts == [] and len(meta.proposals) == 1  # nothing was proposed or judged
    assert all(aegis.variants.rate("base", tid) is None for tid in crash)
    assert all(aegis.variants.rate("base", t.task_id) == 1.0 for t in batch if t.task_id not in crash)


def candidate_passes(parent_id: str, judged_ids: list[list[str]] | None = None):
    """A Critic rollout with a known effect: the parent fails every task, any candidate passes it."""

    def run(harness, tasks, k):
        if judged_ids is not None and harness.id == parent_id:
            judged_ids.append([t.task_id for t in tasks])
        return {t.task_id: [harness.id != parent_id] * k for t in tasks}

    return run


def test_an_undecided_edit_is_judged_again_next_round_with_its_evidence_pooled(env):
    """2 wins per judgement (2 tasks, 1 paired attempt each): undecided twice, shipped on the third
    judgement's pooled 6 wins; the meta-agent proposed it once, and it never counted as rejected.
    A resumed AEGIS continues the same evidence."""
    policy = ScriptedPolicy(lambda m: "no idea")
    train = env.tasks("train")

    def make(meta):
        critic = Critic(candidate_passes(base_harness().id), k=1, n_tasks=2, budget=4, max_episodes=40)
        return AEGIS(base_harness(), meta, critic, tasks={t.task_id: t for t in train}, tools=["calculator"])

    edit = template_edit("Use the calculator tool. {instruction}")
    meta = ScriptedMeta([edit])
    aegis = make(meta)
    _, first = evolve_round(aegis, train[:4], policy, env, round=0, attempts=1, max_steps=6)
    (verdict,) = first.verdicts
    assert verdict.undecided and not verdict.ship and verdict.gate == "stat" and first.shipped == []
    assert verdict.evidence.wins == 2 and edit.key() not in aegis.rejected["base"]
    assert "undecided" in aegis.design_lessons.items[-1]
    state = json.loads(json.dumps(aegis.state_dict()))
    resumed = make(ScriptedMeta([]))
    resumed.load_state_dict(state)
    for engine in (aegis, resumed):
        _, second = evolve_round(engine, train[4:8], policy, env, round=1, attempts=1, max_steps=6)
        (again,) = second.verdicts
        assert again.proposal.key() == edit.key() and again.undecided
        assert (again.evidence.wins, again.evidence.judged, again.evidence.pooled_episodes) == (4, 2, 8)
    _, third = evolve_round(aegis, train[8:12], policy, env, round=2, attempts=1, max_steps=6)
    (last,) = third.verdicts
    assert last.ship and third.shipped == [aegis.harness("base").id] and aegis.undecided["base"] == []
    assert meta.proposals == []  # proposed once, in round 0


def test_a_state_saved_by_an_earlier_version_is_refused_naming_what_it_lacks(env):
    """States saved before undecided edits, pooled evidence and spent demonstrations existed are no
    longer filled in with empty ones: resuming such a run would judge its edits afresh."""
    aegis = make_aegis(env, ScriptedPolicy(needs_demo), RuleMetaAgent())
    state = json.loads(json.dumps(aegis.state_dict()))
    aegis.load_state_dict(state)  # a state of this version loads
    del state["undecided"], state["critic"], state["spent_demos"]
    with pytest.raises(ValueError, match=r"^the AEGIS state lacks \['critic', 'spent_demos', 'undecided'\]: it was "
                                         r"saved by an earlier version of coevo"):
        aegis.load_state_dict(state)


def test_the_critic_widens_its_sample_with_train_tasks_that_are_no_demonstration_source(env):
    train = env.tasks("train")
    refs = {t.task_id: gold_reference(env, t) for t in train[-4:]}
    judged: list[list[str]] = []
    critic = Critic(candidate_passes(base_harness().id, judged), k=1, n_tasks=12, budget=24)
    meta = ScriptedMeta([template_edit("Use the calculator tool. {instruction}")])
    pool = {t.task_id: t for t in train}
    aegis = AEGIS(base_harness(), meta, critic, tasks=pool, critic_pool=pool, references=refs, tools=["calculator"])
    batch = train[:4]
    evolve_round(aegis, batch, ScriptedPolicy(lambda m: "no idea"), env, round=0, attempts=1, max_steps=6)
    first = judged[0]
    assert len(first) == 12 and first[:4] == sorted(t.task_id for t in batch)
    assert not set(first) & set(refs)  # a reference may be a demonstration: never judged on



def test_the_critic_rollout_reports_infrastructure_failures_as_none(env):
    """``rollout_fn`` gives None for an episode whose policy call crashed, so the Critic's gates
    leave it out instead of counting a failed attempt against the harness."""
    batch = env.tasks("train")[:3]
    crashing = batch[1].instruction

    class CrashesOn(Policy):
        model_version = "crash"

        def generate(self, requests):
            if any(m.get("content") == crashing for r in requests for m in r.messages):
                raise MemoryError("CUDA out of memory")
            return ScriptedPolicy(solve).generate(requests)

    out = critic_rollout(CrashesOn(), env, batch_size=1, max_steps=6)(base_harness(), batch, 2)
    assert out == {batch[0].task_id: [True, True], batch[1].task_id: [None, None], batch[2].task_id: [True, True]}


def test_a_rejected_edit_spends_its_demonstrations_and_the_next_draws_other_references(env):
    """The rule agent's tool-path edit shows the first two references; when the Critic rejects it,
    the next plan shows two others (the same kind of edit is not blocked), and the spent pair
    survives a checkpoint."""
    train = env.tasks("train")
    refs = {t.task_id: gold_reference(env, t) for t in train[-6:]}
    critic = Critic(critic_rollout(ScriptedPolicy(lambda m: "no idea"), env, max_steps=6), k=1, gate="seesaw")
    aegis = AEGIS(base_harness(), RuleMetaAgent(), critic, tasks={t.task_id: t for t in train}, references=refs,
                  tools=["calculator"])
    first = [d[0]["content"] for d in fresh_demos(aegis.references, set(), aegis.spent_demos)]
    _, report = evolve_round(aegis, train[:4], ScriptedPolicy(lambda m: "no idea"), env, round=0, attempts=1,
                             max_steps=6)
    shown = [v for v in report.verdicts if "few_shot" in [e.processor for e in v.proposal.edits]]
    assert shown and not any(v.ship for v in shown)  # a policy that never answers: every edit is rejected
    assert set(first) <= aegis.spent_demos
    second = [d[0]["content"] for d in fresh_demos(aegis.references, set(), aegis.spent_demos)]
    assert len(second) == 2 and not set(second) & set(first)
    restored = AEGIS(base_harness(), RuleMetaAgent(), critic, tasks={t.task_id: t for t in train}, references=refs,
                     tools=["calculator"])
    restored.load_state_dict(json.loads(json.dumps(aegis.state_dict())))
    assert restored.spent_demos == aegis.spent_demos
