"""The rule meta-agent: every template builds, the order is exact, revisions are deterministic."""

from __future__ import annotations

import random
import re

import pytest

from coevo.evolution.meta_agent import PlanContext
from coevo.evolution.types import CAUSES, IMPLICATED
from coevo.harness.defaults import base_harness
from coevo.harness.edits import apply_edit
from coevo.harness.harness import Harness
from coevo.harness.library import (
    PROCESSORS,
    FewShotDemos,
    PythonExecutor,
    SelfVerification,
    Specialist,
    SystemPrompt,
    ToolChoice,
)
from coevo.meta.rule import RuleMetaAgent, leaked_strings, order_clusters, quotes
from coevo.meta.templates import CATALOGUE, FORMAT_PROMPT, TEMPLATES, states_numbers
from coevo.rundir.evolve_records import Cluster, Digest, Proposal

DEMOS = [("What is 2 + 3?", "<answer>5</answer>"), ("What is 10 - 4?", "<answer>6</answer>")]
TOOL_DEMO = [{"role": "user", "content": "What is 17 * 23?"},
             {"role": "assistant",
              "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'},
             {"role": "tool", "name": "calculator", "content": "391"},
             {"role": "assistant", "content": "<answer>391</answer>"}]
PYTHON_DEMO = [{"role": "user", "content": "How many r in 'error'?"},
               {"role": "assistant",
                "content": '<tool_call>{"name": "python", "arguments": {"code": "print(3)"}}</tool_call>'},
               {"role": "tool", "name": "python", "content": "3"},
               {"role": "assistant", "content": "<answer>3</answer>"}]


def turns(*pairs: tuple[str, str]) -> list[dict]:
    """(question, reply) demonstrations as the few_shot ``turns`` the rule agent writes."""
    return [t for q, a in pairs for t in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]


def cluster(cause: str, severity: float = 0.5, tasks: tuple[str, ...] = ("t1", "t2")) -> Cluster:
    return Cluster(cause=cause, component=IMPLICATED[cause], count=len(tasks), severity=severity,
                   task_ids=list(tasks), trace_ids=[f"tr-{t}" for t in tasks], excerpts=[])


def digest(*clusters: Cluster, passed: tuple[str, ...] = ("p1", "p2")) -> Digest:
    failed = sorted({t for c in clusters for t in c.task_ids})
    return Digest(round=1, variant="base", harness_id="h", n_traces=len(failed) + len(passed), n_failed=len(failed),
                  pass_rate=len(passed) / (len(failed) + len(passed)), clusters=list(clusters), raw_tokens=1000,
                  digest_tokens=100, passed_task_ids=list(passed), failed_task_ids=failed)


def context(**kw) -> PlanContext:
    return PlanContext(**{"demos": list(DEMOS), "tools": ["calculator"], "max_proposals": 20, **kw})


def build(harness: Harness, proposal: Proposal) -> Harness:
    for e in proposal.edits:
        harness = apply_edit(harness, e)
    return harness


def template_of(proposal: Proposal, harness: Harness) -> str:
    kinds = set()
    for e in proposal.edits:
        kinds.add(e.spec["kind"] if e.spec else harness.get(e.processor).kind)
    names = [n for n in CATALOGUE[proposal.cluster] if TEMPLATES[n].made(kinds)]
    assert len(names) == 1, (kinds, names)
    return names[0]


# Templates that have nothing to do on the base harness, and a harness on which they do.
NOT_ON_BASE = {
    "lenient_parser": lambda h: h.set_param("json_tool_parser", "lenient", False),
    "enable_all_tools": lambda h: h.set_param("tool_registry", "enabled", ["calculator"]),
    "python_timeout_up": lambda h: h.insert(PythonExecutor(), index=2),
    "specialist_budget_up": lambda h: h.insert(Specialist(agent="notes", tools=["calculator"]), index=0),
}
EXCERPTS = {"specialist_budget_up": ["step 1: <tool_call>... || ask_notes → error: specialist 'notes' gave no answer "
                                     "(stopped: step_cap)"]}
"""What a template reads in a cluster's excerpts, where it needs more than the cause."""


def test_catalogue_covers_every_cause_with_builtin_kinds():
    assert set(CATALOGUE) == set(CAUSES)
    for name, template in TEMPLATES.items():
        assert template.name == name
        assert template.kinds and all(k in PROCESSORS and k != "code" for k in template.kinds)


@pytest.mark.parametrize("cause", ["format_error", "wrong_answer"])
def test_a_format_failure_first_gets_a_worked_demonstration(cause):
    """On SmolLM2 a worked demonstration of the answer format moved arithmetic where instructions
    alone did nothing (coevo/meta/templates.py): the first thing the rule agent proposes for
    format or wrong-answer failures on the base harness is demonstrations, not machinery."""
    (first,) = RuleMetaAgent().propose(digest(cluster(cause)), base_harness(), context(max_proposals=1))
    assert [(e.op, e.spec["kind"]) for e in first.edits] == [("insert", "few_shot")]


def test_answers_stated_in_prose_first_get_the_last_number_read():
    """When the failures' excerpts state the answer in prose ("The answer is 10."), reading the last
    number is the edit that can turn them into passes, so it comes before demonstrations."""
    failures = cluster("wrong_answer")
    failures.excerpts = ["step 0: 6 + 4 = 10. The answer is 10.", "step 0: So the total is 12."]
    (first,) = RuleMetaAgent().propose(digest(failures), base_harness(), context(max_proposals=1))
    assert [(e.op, e.processor, e.param, e.value) for e in first.edits] == [
        ("set_param", "answer_extraction", "last_number_fallback", True)]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_applies_to_base_harness(name):
    base = base_harness()
    harness = NOT_ON_BASE[name](base) if name in NOT_ON_BASE else base
    if name in NOT_ON_BASE:
        assert TEMPLATES[name].build(cluster("env_error"), base, context()) is None
    cause = next(c for c, names in CATALOGUE.items() if name in names)
    failures = cluster(cause)
    failures.excerpts = EXCERPTS.get(name, [])
    draft = TEMPLATES[name].build(failures, harness, context(demos=[*DEMOS, TOOL_DEMO]))
    assert draft is not None
    hypothesis, edits = draft
    assert hypothesis and edits
    result = harness
    for e in edits:
        result = apply_edit(result, e)
    assert result.id != harness.id
    touched = {e.spec["kind"] if e.spec else harness.get(e.processor).kind for e in edits}
    assert touched == set(TEMPLATES[name].kinds)


@pytest.mark.parametrize("cause", CAUSES)
def test_agent_proposals_for_each_cause_build_and_carry_scope(cause):
    harness = base_harness()
    c = cluster(cause, tasks=("a", "b", "c"))
    proposals = RuleMetaAgent().propose(digest(c, passed=("p",)), harness, context(demos=[*DEMOS, TOOL_DEMO]))
    expected = [n for n in CATALOGUE[cause] if n not in NOT_ON_BASE]
    assert [template_of(p, harness) for p in proposals] == expected
    for p in proposals:
        assert build(harness, p).id != harness.id
        assert (p.cluster, p.target_tasks, p.predicted_flips, p.at_risk) == (cause, ["a", "b", "c"], ["a", "b", "c"],
                                                                             ["p"])
        assert p.dimension == PROCESSORS[TEMPLATES[template_of(p, harness)].kinds[0]].dimension.value
        assert (p.source, p.variant, p.revision) == ("rule", "base", 0)


def test_set_param_values_are_exact():
    h = base_harness()
    got = {}
    for p in RuleMetaAgent().propose(digest(*(cluster(c) for c in CAUSES)), h, context(max_proposals=50)):
        for e in p.edits:
            if e.op == "set_param":
                got[(e.processor, e.param)] = e.value
    assert got[("step_budget", "max_steps")] == 9  # 6 + max(2, 6 // 2)
    assert got[("sampling", "max_new_tokens")] == 384
    assert got[("tool_timeout", "default_s")] == 20.0
    assert got[("parse_retry", "max_retries")] == 2
    assert got[("answer_extraction", "last_number_fallback")] is True
    assert got[("loop_detection", "action")] == "warn"
    assert got[("system_prompt", "template")] == FORMAT_PROMPT + "\nTools you can call: calculator."


def test_templates_read_the_harness():
    # the system prompt instance has another name: set_param must address it by that name
    h = base_harness().replace("system_prompt", SystemPrompt(name="sys"))
    h = h.insert(FewShotDemos(name="demos", demos=list(DEMOS[0])), index=4)
    h = h.insert(SelfVerification(), index=3)
    agent = RuleMetaAgent()
    proposals = agent.propose(digest(cluster("wrong_answer")), h, context())
    by_template = {template_of(p, h): p for p in proposals}
    few = by_template["few_shot_demos"].edits
    assert [(e.op, e.processor, e.param, e.value) for e in few] == [
        ("set_param", "demos", "turns", turns(DEMOS[1]))]  # only the demonstration not shown yet is added
    assert [(e.op, e.processor) for e in by_template["format_system_prompt"].edits] == [("set_param", "sys")]
    assert "self_verification" not in by_template  # present already: never inserted twice
    for p in proposals:
        assert build(h, p).id != h.id


def test_few_shot_skipped_without_demos():
    proposals = RuleMetaAgent().propose(digest(cluster("format_error")), base_harness(), context(demos=[]))
    assert [template_of(p, base_harness()) for p in proposals][:2] == ["format_system_prompt", "last_number_fallback"]


def slow_order(clusters: list[Cluster], priorities: dict[str, float]) -> list[Cluster]:
    """Selection sort: repeatedly take the heaviest remaining cluster, the smallest cause on ties."""
    left, out = list(clusters), []
    while left:
        best = left[0]
        for c in left[1:]:
            wc = c.severity * priorities.get(c.component.dimension, 1.0)
            wb = best.severity * priorities.get(best.component.dimension, 1.0)
            if wc > wb or (wc == wb and c.cause < best.cause):
                best = c
        left.remove(best)
        out.append(best)
    return out


def test_cluster_order_exact():
    clusters = [cluster("format_error", 0.5), cluster("env_error", 0.2), cluster("step_budget", 0.3),
                cluster("loop", 0.3)]
    prio = {"control_safety": 2.0}
    assert [c.cause for c in order_clusters(clusters, prio)] == ["loop", "step_budget", "format_error", "env_error"]
    assert [c.cause for c in order_clusters(clusters, {})] == ["format_error", "loop", "step_budget", "env_error"]
    proposals = RuleMetaAgent().propose(digest(*clusters), base_harness(), context(max_proposals=4, priorities=prio))
    assert [p.cluster for p in proposals] == ["loop", "step_budget", "format_error", "env_error"]


def test_cluster_order_matches_loop_twin():
    rng = random.Random(0)
    dims = sorted({c.dimension for c in IMPLICATED.values()})
    for _ in range(200):
        causes = rng.sample(CAUSES, rng.randint(1, len(CAUSES)))
        clusters = [cluster(c, rng.choice([0.1, 0.2, 0.25, 0.5])) for c in causes]
        prio = {d: rng.choice([0.5, 1.0, 2.0]) for d in rng.sample(dims, rng.randint(0, len(dims)))}
        assert order_clusters(clusters, prio) == slow_order(clusters, prio)


def test_round_robin_gives_each_cluster_a_distinct_edit():
    d = digest(cluster("format_error", 0.6, ("a",)), cluster("wrong_answer", 0.4, ("b",)))
    h = base_harness()
    proposals = RuleMetaAgent().propose(d, h, context(max_proposals=4))
    assert [(p.cluster, template_of(p, h)) for p in proposals] == [
        ("format_error", "few_shot_demos"), ("wrong_answer", "format_system_prompt"),
        ("format_error", "last_number_fallback"), ("wrong_answer", "parse_retry_up")]
    assert len({p.key() for p in proposals}) == 4


@pytest.mark.parametrize(("excerpts", "prose"), [
    (["step 0: The answer is 9.", "step 0: 6 + 1 = 7", "step 1: I am not sure"], True),
    (["step 0: The answer is -3.5!", "step 0: <tool_call>{...}"], True),  # half is enough
    (["step 1: You're right. The integer result of 2 is 2. I will be precise…", "step 1: sure"], True),
    (["step 0: I think so", "step 0: <answer>9</answer> is 9", "step 1: version 3.1.x"], False),
    (["step 0: Let me compute 3 + 4", "step 0: it is seven"], False),
    ([], False),
])
def test_prose_answers_put_the_last_number_fallback_first(excerpts, prose):
    c = Cluster(cause="format_error", component=IMPLICATED["format_error"], count=2, severity=0.5,
                task_ids=["t1", "t2"], trace_ids=["a", "b"], excerpts=excerpts)
    assert states_numbers(c) is prose
    h = base_harness()
    agent = RuleMetaAgent()
    proposals = agent.propose(digest(c), h, context(max_proposals=3))
    expected = (["last_number_fallback", "few_shot_demos", "format_system_prompt"] if prose
                else ["few_shot_demos", "format_system_prompt", "last_number_fallback"])
    assert [template_of(p, h) for p in proposals] == expected
    # a revision continues in the same evidence-driven order
    revised = RuleMetaAgent().revise(proposals[0], "reject: no fail→pass", digest(c), h, context())
    assert template_of(revised, h) == expected[1]


def test_rejected_keys_are_skipped():
    d, h = digest(cluster("format_error")), base_harness()
    first = RuleMetaAgent().propose(d, h, context(max_proposals=2))
    assert [template_of(p, h) for p in first] == ["few_shot_demos", "format_system_prompt"]
    again = RuleMetaAgent().propose(d, h, context(max_proposals=2, rejected={first[0].key()}))
    assert [template_of(p, h) for p in again] == ["format_system_prompt", "last_number_fallback"]
    assert RuleMetaAgent().propose(digest(cluster("step_budget")), h, context(
        rejected={RuleMetaAgent().propose(digest(cluster("step_budget")), h, context())[0].key()})) == []


def test_max_proposals_validated_and_zero_gives_nothing():
    with pytest.raises(ValueError, match="max_proposals"):
        RuleMetaAgent().propose(digest(cluster("loop")), base_harness(), context(max_proposals=-1))
    assert RuleMetaAgent().propose(digest(cluster("loop")), base_harness(), context(max_proposals=0)) == []


def few_shot_demos_of(p: Proposal) -> list[dict]:
    (e,) = p.edits
    return list(e.spec["params"]["turns"] if e.op == "insert" else e.value)


def test_revise_leakage_drops_exactly_the_leaked_demo():
    demos = [*DEMOS, ("What is 7 * 8?", "<answer>56</answer>")]
    d, h, ctx = digest(cluster("format_error")), base_harness(), context(demos=demos)
    agent = RuleMetaAgent()
    (p,) = agent.propose(d, h, PlanContext(demos=demos, max_proposals=1))
    reason = "leakage 0.33 > 0.2\nleaked: 6"  # the engine's format: verdict.reason + "\nleaked: a | b"
    revised = agent.revise(p, reason, d, h, ctx)
    # "6" is the answer of the second demo; "56" merely contains the digit and is kept
    assert few_shot_demos_of(revised) == turns(DEMOS[0], ("What is 7 * 8?", "<answer>56</answer>"))
    assert revised.revision == 1 and revised.cluster == "format_error" and build(h, revised).id != h.id
    # two leaked strings: both demos that quote them go, the other stays
    revised2 = RuleMetaAgent().revise(p, "leakage 0.66 > 0.2\nleaked: 6 | What is 2 + 3?", d, h, ctx)
    assert few_shot_demos_of(revised2) == turns(("What is 7 * 8?", "<answer>56</answer>"))


def test_revise_leakage_of_every_demo_moves_to_the_next_template():
    d, h = digest(cluster("format_error")), base_harness()
    agent = RuleMetaAgent()
    (p,) = agent.propose(d, h, context(max_proposals=1))
    revised = agent.revise(p, "leakage 1.0\nleaked: 5 | 6", d, h, context())
    assert template_of(revised, h) == "format_system_prompt" and revised.revision == 1


def test_revise_bloat_keeps_one_demo():
    d, h = digest(cluster("format_error")), base_harness()
    agent = RuleMetaAgent()
    (p,) = agent.propose(d, h, context(max_proposals=1))
    revised = agent.revise(p, "bloat 0.8 > 0.5: the edits add 900 tokens", d, h, context())
    assert few_shot_demos_of(revised) == turns(DEMOS[0])
    # one demo already: bloat cannot be answered by trimming, so the next template comes
    again = agent.revise(revised, "bloat 0.6 > 0.5", d, h, context())
    assert template_of(again, h) == "format_system_prompt"


def test_revise_walks_the_catalogue_then_gives_up():
    d, h = digest(cluster("context_overflow")), base_harness()
    agent = RuleMetaAgent()
    (p,) = agent.propose(d, h, context(max_proposals=1))
    seen = [template_of(p, h)]
    while p is not None:
        p = agent.revise(p, "edit 0 does not apply: [ordering] ...", d, h, context())
        if p is not None:
            seen.append(template_of(p, h))
    assert seen == ["summary_memory", "sliding_window"]  # a longer completion budget would overflow sooner
    assert agent.ledger.stages["plan"].calls == 1 and agent.ledger.stages["revise"].calls == 2
    assert agent.ledger.total() == 0


def test_revise_skips_what_this_agent_already_proposed():
    d, h = digest(cluster("format_error")), base_harness()
    agent = RuleMetaAgent()
    first, second = agent.propose(d, h, context(max_proposals=2))
    revised = agent.revise(first, "the seesaw gate rejected it", d, h, context())
    assert template_of(second, h) == "format_system_prompt"
    assert template_of(revised, h) == "last_number_fallback"


def test_leaked_string_helpers():
    assert leaked_strings("quality: leakage 0.5 > 0.2\nleaked: 42 | What is 6 * 7?") == ["42", "What is 6 * 7?"]
    assert leaked_strings("leakage: the edit quotes '42' and \"x = 3\"") == ["42", "x = 3"]
    for text, s, want in [("<answer>4</answer>", "4", True), ("<answer>42</answer>", "4", False),
                          ("3.4", "4", False), ("x4", "4", False), ("4 apples", "4", True), ("a-4", "4", True)]:
        assert quotes(text, s) is want
        assert slow_quotes(text, s) is want


def slow_quotes(text: str, s: str) -> bool:
    """Every occurrence, boundary characters checked one by one."""
    for i in range(len(text) - len(s) + 1):
        if text[i:i + len(s)] != s:
            continue
        before = text[i - 1] if i > 0 else ""
        after = text[i + len(s)] if i + len(s) < len(text) else ""
        if not (before and (before.isalnum() or before in "_.")) and not (after and (after.isalnum() or after == "_")):
            return True
    return False


def test_quotes_matches_loop_twin():
    rng = random.Random(1)
    alphabet = "4a2 ._-<>"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        s = "".join(rng.choice("4a2") for _ in range(rng.randint(1, 2)))
        assert quotes(text, s) == slow_quotes(text, s), (text, s)


def test_determinism():
    d = digest(cluster("format_error", 0.4), cluster("loop", 0.4), cluster("env_error", 0.2))
    runs = []
    for _ in range(2):
        agent = RuleMetaAgent()
        proposals = agent.propose(d, base_harness(), context(max_proposals=3))
        revised = agent.revise(proposals[0], "leaked: 6", d, base_harness(), context())
        runs.append(([p.to_dict() for p in proposals], revised.to_dict(), agent.ledger.as_dict()))
    assert runs[0] == runs[1]
    assert [p["cluster"] for p in runs[0][0]] == ["format_error", "loop", "env_error"]
    assert re.search("dropped", runs[0][1]["hypothesis"])


def test_tool_demos_show_only_tool_paths():
    """A cluster that answered without its tool gets only the demonstrations that call one; with no
    tool demonstration there is nothing to propose (the catalogue's next template comes first)."""
    c = cluster("premature_answer")
    draft = TEMPLATES["tool_demos"].build(c, base_harness(), context(demos=[*DEMOS, PYTHON_DEMO, TOOL_DEMO]))
    assert draft is not None and "calculator, python" in draft[0]
    (edit,) = draft[1]
    assert edit.op == "insert" and edit.spec["params"]["turns"] == [*PYTHON_DEMO, *TOOL_DEMO]
    assert TEMPLATES["tool_demos"].build(c, base_harness(), context()) is None
    proposals = RuleMetaAgent().propose(digest(c), base_harness(), context(demos=list(DEMOS)))
    assert [template_of(p, base_harness()) for p in proposals] == ["tool_choice", "self_verification",
                                                                   "format_system_prompt"]


def test_tool_demos_append_only_what_the_harness_does_not_show():
    h = base_harness().insert(FewShotDemos(name="demos", turns=list(TOOL_DEMO)), index=4)
    c = cluster("premature_answer")
    assert TEMPLATES["tool_demos"].build(c, h, context(demos=[TOOL_DEMO])) is None
    (edit,) = TEMPLATES["tool_demos"].build(c, h, context(demos=[TOOL_DEMO, PYTHON_DEMO]))[1]
    assert (edit.op, edit.processor, edit.param) == ("set_param", "demos", "turns")
    assert edit.value == [*TOOL_DEMO, *PYTHON_DEMO]


def test_premature_answers_get_a_forced_tool_call_with_demonstrations_first():
    assert CATALOGUE["premature_answer"][:2] == ("tool_choice", "tool_demos")
    c = cluster("premature_answer")
    h = base_harness()
    proposals = RuleMetaAgent().propose(digest(c), h, context(demos=[*DEMOS, TOOL_DEMO], max_proposals=2))
    assert [template_of(p, h) for p in proposals] == ["tool_choice", "tool_demos"]
    forced = proposals[0]
    force, demos = forced.edits  # the forced call, then the tool-path demonstrations (only those)
    assert (force.op, force.spec["kind"], force.spec["params"]) == ("insert", "tool_choice", {"tool": "calculator",
                                                                                              "steps": 1})
    assert (demos.op, demos.spec["kind"], demos.spec["params"]["turns"]) == ("insert", "few_shot", TOOL_DEMO)
    assert forced.dimension == "tools"
    for phrase in ("answered without the tool genuine solutions use", "demonstrations alone",
                   "the calculator tool", "tool_choice=required", "with worked demonstrations"):
        assert phrase in forced.hypothesis
    built = build(h, forced)
    assert [p.config["tool"] for p in built.at("before_model")] == ["calculator"]
    assert TEMPLATES["tool_choice"].build(c, built, context()) is None  # never a second prefix
    # a harness already showing the demonstrations gets the forced call alone
    shown = build(h, proposals[1])
    (only,) = TEMPLATES["tool_choice"].build(c, shown, context(demos=[TOOL_DEMO]))[1]
    assert only.spec["kind"] == "tool_choice"


@pytest.mark.parametrize(("demos", "tools", "tool"), [
    ([TOOL_DEMO], ["calculator", "python"], "calculator"),  # the tool the demonstrations call
    ([PYTHON_DEMO, TOOL_DEMO], ["calculator", "python"], ""),  # several: the model chooses
    ([PYTHON_DEMO], ["calculator"], "calculator"),  # a demonstrated tool the env does not offer is ignored
    ([], ["calculator"], "calculator"),  # no demonstration: the env's only tool
    (list(DEMOS), ["calculator", "python"], ""),  # no tool demonstrated, several offered: any tool
    ([], [], ""),
])
def test_tool_choice_names_the_tool_the_context_points_to(demos, tools, tool):
    draft = TEMPLATES["tool_choice"].build(cluster("premature_answer"), base_harness(),
                                           context(demos=demos, tools=tools))
    edit = draft[1][0]
    shows_tools = any(d in (TOOL_DEMO, PYTHON_DEMO) for d in demos)
    assert [e.spec["kind"] for e in draft[1][1:]] == (["few_shot"] if shows_tools else [])
    assert edit.spec["params"]["tool"] == tool
    assert (f"the {tool} tool" if tool else "a tool") in draft[0]


def test_tool_choice_is_not_proposed_for_a_tool_the_registry_disables():
    c = cluster("premature_answer")
    h = base_harness().set_param("tool_registry", "enabled", ["python"])
    assert TEMPLATES["tool_choice"].build(c, h, context(demos=[TOOL_DEMO])) is None
    h2 = base_harness().set_param("tool_registry", "enabled", ["calculator"])
    assert TEMPLATES["tool_choice"].build(c, h2, context(demos=[TOOL_DEMO])) is not None
    present = base_harness().insert(ToolChoice(name="force", tool="python"))
    assert TEMPLATES["tool_choice"].build(c, present, context(demos=[TOOL_DEMO])) is None


def test_a_programs_harness_gets_a_system_prompt_and_no_edit_it_would_ignore():
    """An agent that is a program reads its own answers and runs its own tools: answer and tool
    processors are inert for it (``Env.inert_processors``), and its harness has no system prompt yet."""
    from coevo.envs.program_env import PROGRAM_INERT
    from coevo.harness.defaults import program_harness

    harness = program_harness()
    clusters = (cluster("wrong_answer"), cluster("truncated", severity=0.9, tasks=("t3",)))
    proposals = RuleMetaAgent().propose(digest(*clusters), harness, context(demos=[], inert=PROGRAM_INERT))
    kinds = [template_of(p, harness) for p in proposals]
    assert kinds == ["max_new_tokens_up", "format_system_prompt"]  # no last_number_fallback, parse_retry, ...
    (edit,) = proposals[1].edits
    assert edit.op == "insert" and edit.spec["kind"] == "system_prompt"
    shaped = apply_edit(harness, edit)
    assert shaped.get("system_prompt").config["template"].startswith(FORMAT_PROMPT.split("{env}")[0])
    without = RuleMetaAgent().propose(digest(*clusters), harness, context(demos=[]))
    assert "last_number_fallback" in [template_of(p, harness) for p in without]  # what the filter removed
