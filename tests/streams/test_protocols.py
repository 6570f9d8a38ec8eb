"""The protocols on the toolbox env, where the scripted solver makes every matrix cell known:
deployment shows harness-induced forgetting, self-evolving carries an evolved processor into later
stages, the reference exposes only a task's own tools."""

from __future__ import annotations

import pytest

from coevo.agent.policy import ScriptedPolicy
from coevo.config.schema import EvolutionConfig
from coevo.evolution.critic import Critic
from coevo.evolution.meta_agent import PlanContext, TokenLedger, demo_question
from coevo.evolution.reference import gold_reference
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.rundir.evolve_records import Proposal
from coevo.streams.axes import exposed_tools, tools_harness
from coevo.streams.construct import build_stream
from coevo.streams.metrics import backward_transfer, forward_transfer, pass_matrix, reference_rates, stage_tokens
from coevo.streams.protocols import deployment, self_evolving, task_specific_reference
from tests.aegis_helpers import critic_rollout, service
from tests.streams.toolbox import TEMPLATE, ToolboxEnv, make_tasks, solve

EVOLUTION = EvolutionConfig(gate="seesaw", critic_attempts=1)  # the stream's defaults (StreamConfig)

# add: 4 val tasks + 1 plain val task; at stage 2 five tools are listed and add tasks fail
DEPLOYMENT = [[1.0, None, None], [1.0, 0.0, None], [0.2, 0.0, 1.0]]
EVOLVED = [[1.0, None, None], [1.0, 1.0, None], [0.2, 1.0, 1.0]]  # the template fixes mul from stage 1 on
REFERENCE = [1.0, 0.0, 1.0]


class TemplateMeta:
    """Proposes the instruction template that the solver needs for mul tasks; records contexts."""

    name = "scripted"

    def __init__(self):
        self.ledger = TokenLedger()
        self.contexts: list[PlanContext] = []

    def propose(self, digest, harness, context):
        self.contexts.append(context)
        spec = {"kind": "instruction_template", "name": "instruction_template", "params": {"template": TEMPLATE}}
        if "instruction_template" in harness:
            return []
        return [Proposal(hypothesis="say a tool is expected", edits=[Edit("insert", "instruction_template", spec=spec)],
                         dimension="context_assembly", cluster=digest.clusters[0].cause)]

    def revise(self, proposal, reason, digest, harness, context):
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@pytest.fixture(scope="module")
def env():
    return ToolboxEnv()


@pytest.fixture(scope="module")
def stream():
    return build_stream(make_tasks(), prefix="tool:", stages=3)


@pytest.fixture(scope="module")
def policy():
    return ScriptedPolicy(solve)


def test_deployment_shows_harness_induced_forgetting(env, stream, policy):
    result = deployment(stream, base_harness(), tools_harness, service(policy, env), distractors_per_stage=1)
    assert pass_matrix(result.outcomes, 3) == DEPLOYMENT
    # every released cohort's evaluation tasks, and only those, at every stage
    for s in range(3):
        got = sorted(o.task_id for o in result.outcomes if o.stage == s)
        assert got == sorted(t.task_id for j in range(s + 1) for t in stream.evaluate[j])
        assert all(o.cohort == stream.stage_of(o.task_id) for o in result.outcomes)
    assert len({ids[0] for ids in result.harness_ids}) == 3
    tokens = stage_tokens(result.outcomes, 3)
    assert all(t > 0 for t in tokens) and tokens[0] < tokens[1] < tokens[2]  # more tasks, more tools listed
    assert result.adapt_tokens == [0, 0, 0]


def test_the_reference_exposes_only_each_tasks_own_tools(env, stream, policy):
    result = task_specific_reference(stream, base_harness(), tools_harness, service(policy, env))
    assert reference_rates(result.outcomes, 3) == REFERENCE
    assert all(o.stage == o.cohort for o in result.outcomes)
    universe = frozenset(stream.universe)
    own = {frozenset(n): tools_harness(base_harness(), frozenset(n), universe, 0) for n in (("add",), ("neg",), ())}
    assert sorted(result.harness_ids[0]) == sorted([own[frozenset({"add"})].id, own[frozenset()].id])  # + plain tasks
    assert result.harness_ids[2] == [own[frozenset({"neg"})].id]
    neg = stream.evaluate[2][0]
    assert exposed_tools(own[frozenset({"neg"})], env, neg) == ["neg"]
    matrix = pass_matrix(deployment(stream, base_harness(), tools_harness, service(policy, env),
                                    distractors_per_stage=1).outcomes, 3)
    assert forward_transfer(matrix, REFERENCE) == pytest.approx(0.0)
    assert backward_transfer(matrix) == pytest.approx(((0.2 - 1.0) + (0.0 - 0.0)) / 2)


def test_self_evolving_carries_the_evolved_harness_and_gains_new_tools(env, stream, policy, tmp_path):
    meta = TemplateMeta()
    critic = Critic(critic_rollout(policy, env, max_steps=6), k=1)
    train = {t.task_id: t for t in env.tasks("train")}
    # references of an add task (stage 0) and of neg tasks (stage 2): at stage 1 only the first may show
    references = {tid: gold_reference(env, train[tid]) for tid in ("add-0", "neg-0", "neg-2")}
    adapt = build_stream(make_tasks(), prefix="tool:", stages=3, adapt_limit=2)  # add-0 may be outside the batch
    result = self_evolving(adapt, base_harness(), tools_harness, service(policy, env), meta, tmp_path, EVOLUTION,
                           critic=critic, rounds_per_stage=1, references=references, distractors_per_stage=1)
    assert pass_matrix(result.outcomes, 3) == EVOLVED
    assert [ctx.round for ctx in meta.contexts] == [1]  # stage 0 passed everything: nothing to evolve
    # add-0's; neg's are not released
    assert [demo_question(d) for d in meta.contexts[0].demos] == ["What is add(2, 5)?"]
    shipped = [r for r in result.evolve_reports if r["shipped"]]
    assert [r["stage"] for r in shipped] == [1]
    final = result.harnesses[2]["base"]
    assert "instruction_template" in final  # the evolved processor survived the stage change
    assert exposed_tools(final, env, env.tasks("val")[0]) == ["add", "mul", "neg", "unit_converter", "web_search"]
    assert exposed_tools(result.harnesses[1]["base"], env, env.tasks("val")[0]) == ["add", "mul", "unit_converter"]
    assert result.adapt_tokens[0] > 0 and result.adapt_tokens[1] > 0 and result.critic_episodes[1] > 0
    # adaptation never touched an evaluation task
    judged = {tid for r in result.evolve_reports for d in r["digests"] for tid in d["passed_task_ids"]}
    judged |= {tid for r in result.evolve_reports for d in r["digests"] for c in d["clusters"] for tid in c["task_ids"]}
    assert judged and all(train.get(tid) is not None for tid in judged)
    assert forward_transfer(EVOLVED, REFERENCE) == pytest.approx(0.5)


def test_zero_rounds_is_deployment_with_a_carried_harness(env, stream, policy, tmp_path):
    critic = Critic(critic_rollout(policy, env, max_steps=6), k=1)
    result = self_evolving(stream, base_harness(), tools_harness, service(policy, env), TemplateMeta(), tmp_path,
                           EVOLUTION, critic=critic, rounds_per_stage=0, distractors_per_stage=1)
    assert pass_matrix(result.outcomes, 3) == DEPLOYMENT
    assert result.evolve_reports == [] and result.adapt_tokens == [0, 0, 0]
    with pytest.raises(ValueError, match="rounds_per_stage must be >= 0"):
        self_evolving(stream, base_harness(), tools_harness, service(policy, env), TemplateMeta(), tmp_path,
                      EVOLUTION, critic=critic, rounds_per_stage=-1)
