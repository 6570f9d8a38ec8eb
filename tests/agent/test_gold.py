"""GoldPolicy replays each task's own gold actions, as one agent or as a lead delegating by entity
(the office env: several tool owners, a state-checking verifier)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from coevo.agent.gold import GoldPolicy, segments
from coevo.agent.rollouts import RolloutService
from coevo.config.schema import RolloutConfig
from coevo.envs.office import OWNER, OfficeEnv, degraded, final_answer
from coevo.harness.defaults import base_harness
from coevo.streams.axes import agents_harness
from coevo.streams.config import StreamConfig

ENTITIES = frozenset(OWNER.values())


@pytest.fixture(scope="module")
def env() -> OfficeEnv:
    return OfficeEnv()


def every_task(env: OfficeEnv) -> list:
    return [t for split in ("train", "val", "test") for t in env.tasks(split)]


def lead(exposed: frozenset[str] = ENTITIES):
    """The agents axis's lead; longer replies (a delegation lists its calls) and steps than the defaults."""
    return (agents_harness(base_harness(), exposed, ENTITIES, owner=OWNER)
            .set_param("sampling", "max_new_tokens", 1024).set_param("step_budget", "max_steps", 10))


def run(env, policy, harness, tasks):
    return RolloutService(policy, env, batch_size=32, max_steps=10, workers=4, seed=0).run(
        harness, tasks, attempts=1, phase=None)


def test_gold_replay_as_one_agent_passes_every_task_and_a_degraded_gold_fails(env):
    tasks = every_task(env)
    h = base_harness().set_param("step_budget", "max_steps", 10)
    assert run(env, GoldPolicy(tasks, answer=final_answer), h, tasks).pass_at_1 == 1.0
    broken = [dataclasses.replace(t, gold_actions=degraded(t.gold_actions)) for t in tasks]
    assert run(env, GoldPolicy(broken, answer=final_answer), h, tasks).pass_at_1 == 0.0


def test_a_scripted_gold_lead_passes_every_task_through_delegation(env):
    tasks = every_task(env)
    done = run(env, GoldPolicy(tasks, answer=final_answer, owner=OWNER), lead(), tasks)
    assert done.pass_at_1 == 1.0
    multi = [t for t in tasks if len(t.metadata["entities"]) >= 2]
    assert len(multi) >= 20
    for trace in done.traces:
        task = next(t for t in tasks if t.task_id == trace.task_id)
        asked = [c.name for c in trace.tool_calls if not c.agent]
        assert asked == ["ask_" + e for e, _ in segments(task.gold_actions, OWNER)]  # the lead only delegates
        acted = [(c.agent, c.name) for c in trace.tool_calls if c.agent]
        assert acted == [(OWNER[c.name], c.name) for c in task.gold_actions]  # each call by its owner
        assert {c.agent for c in trace.model_calls} == {""} | {OWNER[c.name] for c in task.gold_actions}


def test_a_lead_without_the_needed_specialist_fails(env):
    tasks = [t for t in env.tasks("val") if "mail" in t.metadata["entities"]]
    done = run(env, GoldPolicy(tasks, answer=final_answer, owner=OWNER), lead(ENTITIES - {"mail"}), tasks)
    assert tasks and done.pass_at_1 == 0.0
    errors = [c.error for t in done.traces for c in t.tool_calls if c.name == "ask_mail"]
    assert errors and all("unknown tool" in e for e in errors)


def test_the_agents_axis_stream_runs_both_protocols_on_office(tmp_path, env):
    from coevo.report.progress import NullProgress
    from coevo.streams import run_stream

    tasks = every_task(env)
    config = StreamConfig(axis="agents", stages=2, adapt_limit=3, eval_limit=4,
                          rollout=RolloutConfig(attempts=1, max_steps=10))
    result = run_stream(env, GoldPolicy(tasks, answer=final_answer, owner=OWNER), tmp_path, config,
                        base=base_harness().set_param("sampling", "max_new_tokens", 1024)
                        .set_param("step_budget", "max_steps", 10), progress=NullProgress())
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["stages"] == 2 and len(result.stream.released) == 2
    for protocol in ("deployment", "self_evolving"):
        assert (tmp_path / f"matrix-{protocol}.csv").is_file()
        assert metrics[protocol]["fwt"] == pytest.approx(0.0) and metrics[protocol]["bwt"] == pytest.approx(0.0)
        # the gold lead passes every released cohort: it delegates to the specialists released so far
        assert metrics[protocol]["matrix"] == [[1.0, None], [1.0, 1.0]]
    assert metrics["self_evolving"]["adapt_tokens"][0] > 0  # adaptation rounds ran through the loop
    assert (tmp_path / "self_evolving" / "stage-0" / "rounds.jsonl").is_file()


def test_coevo_stream_agents_axis_with_the_gold_lead(tmp_path):
    from coevo.cli.main import app

    out = tmp_path / "stream"
    result = CliRunner().invoke(app, ["stream", "--env", "office", "--axis", "agents", "--stages", "2", "--model", "gold",
                                      "--rounds-per-stage", "0", "--adapt-limit", "2", "--eval-limit", "3",
                                      "--max-steps", "10", "--max-new-tokens", "1024", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "metrics.json").is_file() and (out / "matrix-self_evolving.csv").is_file()


def test_aegis_edits_a_specialist_that_runs_out_of_steps(env):
    """Specialists are harness components: a lead whose contacts specialist has one step fails the
    tasks that need two contacts calls; the rule meta-agent reads the delegation errors and raises
    that specialist's budget, and the Critic ships the edit."""
    from coevo.evolution.critic import Critic
    from coevo.evolution.engine import AEGIS
    from coevo.meta.rule import RuleMetaAgent
    from tests.aegis_helpers import critic_rollout, evolve_round

    tasks = every_task(env)
    policy = GoldPolicy(tasks, answer=final_answer, owner=OWNER)
    short = lead().set_param("specialist_contacts", "max_steps", 1)
    train = env.tasks("train")
    # tasks whose contacts part takes two calls: with one step, the second never runs (a task whose
    # second call only reads still passes)
    batch = [t for t in train if any(e == "contacts" and len(c) >= 2 for e, c in segments(t.gold_actions, OWNER))][:6]
    assert len(batch) >= 3
    aegis = AEGIS(short, RuleMetaAgent(), Critic(critic_rollout(policy, env, max_steps=10), k=1, gate="seesaw"),
                  tasks={t.task_id: t for t in train}, max_proposals=1)
    traces, report = evolve_round(aegis, batch, policy, env, round=0, attempts=1, max_steps=10)
    assert sum(not t.passed for t in traces) >= 2
    (verdict,) = report.verdicts
    assert verdict.ship and [e.describe() for e in verdict.proposal.edits] == ["set_param specialist_contacts.max_steps"]
    assert aegis.harness().get("specialist_contacts").config["max_steps"] == 3


def test_gold_replay_counts_its_own_calls_whatever_the_context_shows(env):
    """Demonstrations with tool turns before the task (and any retry prompt) do not move where the
    gold policy is in a task: it counts the calls it gave each episode."""
    from coevo.harness.library import FewShotDemos

    tasks = every_task(env)
    demo_task = next(t for t in env.tasks("train") if len(t.metadata["entities"]) > 1)
    demo = run(env, GoldPolicy(tasks, answer=final_answer, owner=OWNER), lead(), [demo_task]).traces[0]
    turns = [dict(m) for m in demo.messages if m["role"] != "system"]
    assert sum(m["role"] == "tool" for m in turns) >= 2
    val = env.tasks("val")
    shown = lead().insert(FewShotDemos(turns=turns))
    assert run(env, GoldPolicy(tasks, answer=final_answer, owner=OWNER), shown, val).pass_at_1 == 1.0


def test_a_gold_replay_is_never_cut_at_the_completion_budget_and_a_scripted_reply_is(env):
    """A reference call longer than the budget (16 bytes here; 192 by default, BFCL's calls run past
    it) replays whole: cut, it would fail as the env's own error and blame the env."""
    tasks = every_task(env)
    tight = base_harness().set_param("step_budget", "max_steps", 10).set_param("sampling", "max_new_tokens", 16)
    gold = GoldPolicy(tasks, answer=final_answer)
    assert run(env, gold, tight, tasks).pass_at_1 == 1.0 and gold.cuts == 0
    from coevo.agent.policy import ScriptedPolicy

    scripted = ScriptedPolicy(lambda messages: "<answer>" + "x" * 40 + "</answer>")
    run(env, scripted, tight, tasks[:2])
    assert scripted.cuts >= 2  # a model-like policy honours the budget
