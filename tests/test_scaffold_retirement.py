"""Scaffold retirement: episodes without the harness's scaffolding join their tasks' GRPO groups,
the digest reports how the model behaves without it, and AEGIS proposes removing the scaffolding
once the model does unforced what it forces (the Critic judging the removal like any edit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coevo
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.trace import ToolCallRecord, Trace
from coevo.buffers import ReplayBuffer
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.envs.load import make_env
from coevo.evolution.critic import Critic
from coevo.evolution.digest import scaffold_evidence
from coevo.evolution.engine import AEGIS
from coevo.evolution.meta_agent import PlanContext
from coevo.evolution.reference import gold_reference
from coevo.harness.defaults import base_harness
from coevo.harness.edit_record import Edit
from coevo.harness.edits import apply_edit
from coevo.harness.harness import Harness
from coevo.harness.library import FewShotDemos, ToolChoice
from coevo.harness.scaffold import (
    demonstration_count,
    outer_scaffold,
    retire_outer_scaffold,
    scaffold_layers,
    scaffold_names,
    with_one_demonstration_fewer,
    without_outer_scaffold,
    without_scaffold,
)
from coevo.loop.round_plan import round_batches
from coevo.meta.retire import ready
from coevo.meta.rule import RuleMetaAgent
from coevo.rundir.evolve_records import Digest, EvolveReport, Proposal, ScaffoldEvidence
from tests.aegis_helpers import critic_rollout, service
from tests.evolution.test_engine import solve
from tests.test_config import compose_cfg
from tests.test_loop import killed_in_round_1_and_resumed, records, smoke, weights

ROOT = Path(__file__).resolve().parents[1]
SCAFFOLDED = ROOT / "examples" / "harnesses" / "lenient_tool_choice_demos.yaml"


def _trace(task: str, passed: bool, tool: bool, variant: str = "base") -> Trace:
    call = ToolCallRecord(step=0, name="calculator", arguments={"expression": "1+1"}, output="2", error=None,
                          seconds=0.0)
    calls = [call] if tool else []
    return Trace(trace_id=f"{task}-{passed}-{tool}", task_id=task, env="e", split="train", harness_id="h",
                 variant=variant, model_version="0", reward=float(passed), passed=passed, tool_calls=calls)


def test_scaffolding_comes_off_outermost_first_each_demonstration_then_the_prefill():
    h = Harness.load(SCAFFOLDED)
    kinds = {p.kind for p in h.processors}
    assert {"tool_choice", "few_shot"} <= kinds and scaffold_layers(h) == 3  # the prefill, two demonstrations
    assert outer_scaffold(h) == ["few_shot (its last demonstration)"]
    first = without_outer_scaffold(h)
    assert {p.kind for p in first.processors} == kinds and demonstration_count(first) == 1
    assert first.parent_id == h.id and outer_scaffold(first) == ["few_shot"]
    second = without_outer_scaffold(first)
    assert {p.kind for p in second.processors} == kinds - {"few_shot"} and outer_scaffold(second) == ["tool_choice"]
    third = without_outer_scaffold(second)
    assert {p.kind for p in third.processors} == kinds - {"tool_choice", "few_shot"}
    assert without_outer_scaffold(third) is third and outer_scaffold(third) == [] and scaffold_layers(third) == 0
    assert without_scaffold(h).id == third.id and scaffold_names(third) == []
    for layer in (h, first, second):  # the retirement's edits build the same harness, layer by layer
        edited = layer
        for edit in retire_outer_scaffold(layer):
            edited = apply_edit(edited, edit)
        assert edited.processors == without_outer_scaffold(layer).processors


def test_demonstrations_come_off_one_at_a_time_the_one_nearest_the_task_first():
    h = Harness.load(SCAFFOLDED)
    turns = h.get("few_shot").config["turns"]
    assert demonstration_count(h) == 2
    one = with_one_demonstration_fewer(h)
    kept = one.get("few_shot").config["turns"]
    assert demonstration_count(one) == 1 and kept == turns[: len(kept)] and kept[0] == turns[0]
    assert [t["role"] for t in kept][0] == "user" and all(t["role"] != "user" for t in kept[1:])
    none = with_one_demonstration_fewer(one)
    assert "few_shot" not in none and demonstration_count(none) == 0
    assert with_one_demonstration_fewer(none) is none
    pairs = base_harness().insert(FewShotDemos(demos=["q1", "a1", "q2", "a2"]), index=0)
    assert with_one_demonstration_fewer(pairs).get("few_shot").config["demos"] == ["q1", "a1"]
    empty = base_harness().insert(FewShotDemos(), index=0)  # a few_shot that shows nothing is no layer
    assert outer_scaffold(empty) == [] and without_outer_scaffold(empty) is empty and retire_outer_scaffold(empty) == []


def test_evidence_counts_tool_use_and_passes_on_each_side_and_ready_needs_both():
    scaffolded = [_trace("a", True, True), _trace("b", True, True), _trace("c", False, True), _trace("d", True, True)]
    unscaffolded = [_trace("a", True, True), _trace("b", True, True), _trace("c", False, False),
                    _trace("d", False, True), _trace("e", True, True)]
    e = scaffold_evidence(scaffolded, unscaffolded, ["tool_choice"])
    assert (e.episodes, e.tool_use, e.pass_rate) == (5, 0.8, 0.6)
    assert (e.scaffolded_tool_use, e.scaffolded_pass_rate) == (1.0, 0.75)
    assert ready(e)  # 80% unforced tool use, 0.6 >= 0.8 * 0.75
    assert not ready(ScaffoldEvidence(["tool_choice"], 5, 0.8, 0.59, 1.0, 0.75))  # passes too rarely without it
    assert not ready(ScaffoldEvidence(["tool_choice"], 5, 0.4, 0.75, 1.0, 0.75))  # calls the tool too rarely
    assert scaffold_evidence(scaffolded, [], ["tool_choice"]) is None and not ready(None)


def _digest(evidence: ScaffoldEvidence | None, harness: Harness) -> Digest:
    return Digest(round=0, variant="base", harness_id=harness.id, n_traces=8, n_failed=0, pass_rate=1.0, clusters=[],
                  raw_tokens=100, digest_tokens=10, passed_task_ids=["a"], scaffold=evidence)


def test_rule_agent_proposes_the_removal_only_when_the_evidence_is_ready():
    h = base_harness().insert(ToolChoice(tool="calculator"))
    agent = RuleMetaAgent()
    context = PlanContext(max_proposals=2, tools=["calculator"])
    (retire,) = agent.propose(_digest(ScaffoldEvidence(["tool_choice"], 8, 0.9, 0.7, 1.0, 0.75), h), h, context)
    assert [(e.op, e.processor) for e in retire.edits] == [("remove", "tool_choice")]
    assert "without its scaffolding tool_choice" in retire.hypothesis
    assert agent.propose(_digest(ScaffoldEvidence(["tool_choice"], 8, 0.3, 0.7, 1.0, 0.75), h), h, context) == []
    assert "called a tool in 90% of 8 episodes" in _digest(ScaffoldEvidence(["tool_choice"], 8, 0.9, 0.7, 1.0, 0.75),
                                                           h).text()

    # demonstrations come off one at a time: the proposal drops the one nearest the task
    shown = Harness.load(SCAFFOLDED).remove("tool_choice")
    layer = outer_scaffold(shown)
    (fewer,) = agent.propose(_digest(ScaffoldEvidence(layer, 8, 0.9, 0.7, 1.0, 0.75), shown), shown, context)
    assert [(e.op, e.processor, e.param) for e in fewer.edits] == [("set_param", "few_shot", "turns")]
    assert "its last demonstration" in fewer.hypothesis
    # evidence measured without another layer than the harness's outermost proposes nothing
    other_layer = ScaffoldEvidence(["tool_choice"], 8, 0.9, 0.7, 1.0, 0.75)
    assert agent.propose(_digest(other_layer, shown), shown, context) == []


class ForcedOnly(ScriptedPolicy):
    """Calls the calculator only when the harness forces the call's opening; otherwise guesses."""

    def __init__(self):
        super().__init__(solve)

    def reply(self, request):
        if request.reply_prefix or any(m.get("role") == "tool" for m in request.messages):
            return solve(request.messages)
        return "<answer>7</answer>"


def _aegis(env, policy, gate: str = "seesaw", start: Harness | None = None) -> AEGIS:
    train = env.tasks("train")
    critic = Critic(critic_rollout(policy, env, max_steps=6), k=1, gate=gate)
    start = start if start is not None else base_harness().insert(ToolChoice(tool="calculator"))
    return AEGIS(start, RuleMetaAgent(), critic,
                 tasks={t.task_id: t for t in train},
                 references={t.task_id: gold_reference(env, t) for t in train[-4:]},
                 tools=["calculator"])


def _round(aegis: AEGIS, policy, env, tasks):
    rollouts = service(policy, env)
    harnesses, variants = aegis.routed(tasks)
    traces = rollouts.run(harnesses, tasks, attempts=1, phase=None, variant=variants).traces
    bare = rollouts.run([without_outer_scaffold(h) for h in harnesses], tasks, attempts=1, phase=None,
                        variant="unscaffolded").traces
    return aegis.evolve(traces, round=0, unscaffolded=bare)[0]


@pytest.mark.parametrize("learned", [True, False])
def test_aegis_retires_the_prefill_once_the_model_calls_the_tool_unforced(learned):
    env = ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)
    policy = ScriptedPolicy(solve) if learned else ForcedOnly()
    aegis = _aegis(env, policy)
    report = _round(aegis, policy, env, env.tasks("train")[:6])
    (dig,) = report.digests
    assert dig.scaffold is not None and dig.scaffold.scaffold == ["tool_choice"]
    assert dig.scaffold.tool_use == (1.0 if learned else 0.0) and dig.scaffold.scaffolded_pass_rate == 1.0
    if learned:  # the removal is judged like any edit and ships: nothing regressed
        (verdict,) = report.verdicts
        assert verdict.ship and [e.op for e in verdict.proposal.edits] == ["remove"]
        assert "tool_choice" not in {p.kind for p in aegis.harness("base").processors}
    else:  # nothing failed and nothing is ready: no proposal at all
        assert report.verdicts == [] and "tool_choice" in {p.kind for p in aegis.harness("base").processors}


def test_a_ready_retirement_is_judged_before_an_undecided_edit_waiting_for_its_slot():
    """With one proposal a round, an edit the Critic left undecided is judged again first, except
    when the scaffolding is ready to come off: the retirement takes the slot (the evidence is this
    round's) and the undecided edit keeps its place for the next round."""
    env = ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)
    aegis = _aegis(env, ScriptedPolicy(solve))
    aegis.max_proposals = 1
    parent = aegis.harness("base")
    waiting = Proposal(hypothesis="a longer budget", edits=[Edit("set_param", "sampling", param="max_new_tokens",
                                                                 value=96)], dimension="control")
    aegis.undecided["base"] = [(parent.id, waiting)]
    report = _round(aegis, ScriptedPolicy(solve), env, env.tasks("train")[:6])
    (verdict,) = report.verdicts
    assert [(e.op, e.processor) for e in verdict.proposal.edits] == [("remove", "tool_choice")] and verdict.ship
    assert [p.key() for _, p in aegis.undecided["base"]] == [waiting.key()]


def test_a_removal_judged_by_the_statistical_gate_is_recorded_with_its_noninferiority_evidence():
    """The stat gate judges a removal on the pass rate it may lose (no log LR): the round record
    holds that evidence, as every verdict's."""
    env = ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)
    report = _round(_aegis(env, ScriptedPolicy(solve), gate="stat"), ScriptedPolicy(solve), env, env.tasks("train")[:6])
    (verdict,) = EvolveReport.from_dict(report.to_dict()).verdicts
    assert [e.op for e in verdict.proposal.edits] == ["remove"]
    evidence = verdict.evidence
    assert evidence.noninferiority and evidence.log_lr is None and evidence.losses == 0
    assert evidence.margin == pytest.approx(0.1) and 0 <= evidence.harm_bound <= 1


def test_a_demonstration_shed_is_judged_as_a_removal_and_ships_when_nothing_is_lost():
    """With the prefill and two demonstrations the outer layer is the demonstration nearest the
    task; a model that solves without it has the edit that drops it (a set_param of the turns)
    judged for non-inferiority, like a removal, and shipped, the prefill kept."""
    env = ArithmeticEnv(n_tasks=40, max_terms=2, seed=3)
    start = Harness.load(SCAFFOLDED)
    aegis = _aegis(env, ScriptedPolicy(solve), gate="stat", start=start)
    report = _round(aegis, ScriptedPolicy(solve), env, env.tasks("train")[:6])
    (dig,) = report.digests
    assert dig.scaffold.scaffold == ["few_shot (its last demonstration)"]
    (verdict,) = report.verdicts
    assert [(e.op, e.param) for e in verdict.proposal.edits] == [("set_param", "turns")]
    assert verdict.ship and verdict.evidence.noninferiority
    assert demonstration_count(aegis.harness("base")) == 1 and "tool_choice" in aegis.harness("base")


def _buffer(run_dir: Path):
    with ReplayBuffer(run_dir / "buffer", capacity=512) as buf:
        entries = buf.entries()
        return entries, buf.load(entries)


def test_a_training_run_puts_episodes_without_the_scaffolding_in_their_tasks_groups(tmp_path, monkeypatch):
    seen: dict[int, list[Trace]] = {}
    original = AEGIS.evolve

    def evolve(self, traces, *, round, withheld=(), unscaffolded=(), weights=0):
        seen[round] = list(unscaffolded)
        assert all(t.variant != "unscaffolded" for t in traces)  # no variant's traces
        return original(self, traces, round=round, withheld=withheld, unscaffolded=unscaffolded, weights=weights)

    monkeypatch.setattr(AEGIS, "evolve", evolve)
    common = ("mode=coevolve", f"harness.start={SCAFFOLDED}")
    on = Path(coevo.run(smoke(tmp_path / "on", *common, "rollout.unscaffolded_attempts=2")))
    seen_on = dict(seen)
    off = Path(coevo.run(smoke(tmp_path / "off", *common)))
    batches = round_batches(make_env("arithmetic", {"n_tasks": 30, "max_terms": 3, "max_operand": 3,
                                                    "partial_credit": True}).tasks("train"), 4, 0, 2)
    entries, traces = _buffer(on)
    for r, rec in enumerate(records(on)):
        bare = [t for e, t in zip(entries, traces, strict=True) if e.round == r and e.variant == "unscaffolded"]
        scaffolded = [t for e, t in zip(entries, traces, strict=True) if e.round == r and e.variant == "base"]
        assert {t.task_id for t in bare} == {t.task_id for t in batches[r]} and len(bare) == 8
        assert len({t.harness_id for t in bare}) == 1 and not {t.harness_id for t in bare} & {
            t.harness_id for t in scaffolded}
        assert rec["unscaffolded"]["n_traces"] == 8 and rec["train"]["n_traces"] == 8
        assert sorted(t.trace_id for t in seen_on[r]) == sorted(t.trace_id for t in bare)
        assert rec["grpo"]["buffer_traces"] >= 16  # the batch's and the unscaffolded episodes train together
    assert all(r["unscaffolded"] is None for r in records(off)) and all(not v for v in seen.values())
    # the unscaffolded episodes sample on a stream of their own: round 0's batch is the run's without them
    _, plain = _buffer(off)
    def key(ts):
        return sorted((t.trace_id, t.final_answer, t.reward) for t in ts if t.trace_id.startswith("r0000"))

    assert key(traces) == key(plain) and key(plain)


def test_a_round_killed_after_its_rollouts_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    args = ("mode=model_only", f"harness.start={SCAFFOLDED}", "rollout.unscaffolded_attempts=2")
    whole = Path(coevo.run(smoke(tmp_path / "whole", *args)))
    # round 1's episodes, with and without, from the buffer
    cut = killed_in_round_1_and_resumed(tmp_path / "cut", monkeypatch, *args)
    a, b = records(whole), records(cut)
    assert [r["unscaffolded"] for r in a] == [r["unscaffolded"] for r in b] and b[1]["unscaffolded"]["n_traces"] == 8
    assert [r["grpo"]["loss"] for r in a] == [r["grpo"]["loss"] for r in b]
    wa, wb = weights(whole), weights(cut)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_report_draws_the_scaffold_figure_only_for_runs_with_unscaffolded_episodes(tmp_path):
    from coevo.report.summary import write_report

    args = ("mode=model_only", "rounds=1", f"harness.start={SCAFFOLDED}")
    on = Path(coevo.run(smoke(tmp_path / "on", *args, "rollout.unscaffolded_attempts=1")))
    off = Path(coevo.run(smoke(tmp_path / "off", *args)))
    assert (write_report(on) / "scaffold.png").stat().st_size > 10_000
    assert "(scaffold.png)" in (on / "report" / "summary.md").read_text()
    assert not (write_report(off) / "scaffold.png").exists()


def test_the_lineage_lanes_follow_each_layer_from_added_to_shed():
    """The scaffold lineage's lanes: the prefill and each demonstration, held or not by the harness
    at the start and after each round; shedding takes the nearest demonstration first, the prefill last."""
    from coevo.harness.scaffold import retire_outer_scaffold, without_outer_scaffold
    from coevo.report.figures import scaffold_lanes

    full = Harness.load(SCAFFOLDED)
    one_demo = without_outer_scaffold(full)
    prefill_only = without_outer_scaffold(one_demo)
    assert [e.op for e in retire_outer_scaffold(full)] == ["set_param"]
    lanes = dict(scaffold_lanes([None, full, full, one_demo, prefill_only]))
    demos = demonstration_count(full)
    assert demos >= 2 and list(lanes) == ["forced prefill", *[f"demonstration {k}" for k in range(1, demos + 1)]]
    assert lanes["forced prefill"] == [False, True, True, True, True]
    assert lanes[f"demonstration {demos}"] == [False, True, True, False, False]  # the nearest: shed first
    assert lanes["demonstration 1"] == [False, True, True, True, False]
    assert scaffold_lanes([base_harness(), None]) == []


@pytest.mark.slow
def test_the_retire_preset_runs_on_the_tiny_model(tmp_path):
    """``experiment=retire`` with only the model and the sizes shrunk (its schedule, gate and
    unscaffolded groups kept), from a scaffolded start so the episodes without a demonstration run from
    round 0: AEGIS every round, groups of scaffolded and unscaffolded episodes, the scaffold figure."""
    run_dir = Path(coevo.run(compose_cfg([
        "experiment=retire", "model=tiny", "model.lora=true", f"harness.start={SCAFFOLDED}", "rounds=2",
        "rollout.attempts=2", "rollout.unscaffolded_attempts=2", "batch_tasks=2", "test_limit=4",
        "evolution.stat_budget=16", "evolution.stat_tasks=4", "rollout.max_new_tokens=16", "rollout.max_steps=2",
        "trainer.step_traces=8", f"run_dir={tmp_path / 'run'}"])))
    recs = records(run_dir)
    assert all(r["evolve"] is not None for r in recs)  # AEGIS in every round
    assert all(r["unscaffolded"]["n_traces"] == 4 for r in recs) and len(recs[-1]["test"]["outcomes"]) == 4
    assert (run_dir / "report" / "scaffold.png").is_file()
