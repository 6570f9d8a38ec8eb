"""The rule meta-agent with templates and a catalogue of one's own (docs/processors.md)."""

from __future__ import annotations

import pytest

from coevo.evolution.meta_agent import PlanContext
from coevo.evolution.types import IMPLICATED
from coevo.harness.defaults import base_harness
from coevo.harness.edits import apply_edit
from coevo.meta.drafts import Template, insert_edit
from coevo.meta.rule import RuleMetaAgent
from coevo.meta.templates import CATALOGUE, TEMPLATES
from coevo.rundir.evolve_records import Cluster, Digest


def digest(*causes: str) -> Digest:
    clusters = [Cluster(c, IMPLICATED[c], 2, 0.5, ["t1", "t2"], ["a", "b"], []) for c in causes]
    return Digest(0, "base", "h", 4, 2, 0.5, clusters, 100, 10, ["p1"], ["t1", "t2"])


def test_an_extended_catalogue_proposes_the_new_template_first_and_the_default_agent_does_not():
    from examples.my_processor import BUDGET_TEMPLATE, ToolCallBudget

    agent = RuleMetaAgent(templates={**TEMPLATES, "budget": BUDGET_TEMPLATE},
                          catalogue={**CATALOGUE, "loop": ("budget", *CATALOGUE["loop"])})
    (p,) = agent.propose(digest("loop"), base_harness(), PlanContext(max_proposals=1))
    assert p.edits[0].spec["kind"] == ToolCallBudget.kind and p.dimension == "control_safety" and p.cluster == "loop"
    assert apply_edit(base_harness(), p.edits[0]).get("tool_call_budget").config["max_calls"] == 1
    (default,) = RuleMetaAgent().propose(digest("loop"), base_harness(), PlanContext(max_proposals=1))
    assert default.edits[0].spec is None or default.edits[0].spec["kind"] != ToolCallBudget.kind
    # a rejected budget is revised into the cluster's next template, as for built-in ones
    revised = agent.revise(p, "rejected: no fail->pass", digest("loop"), base_harness(), PlanContext())
    assert revised is not None and revised.key() != p.key()


def test_a_catalogue_may_leave_causes_out():
    only_loop = RuleMetaAgent(catalogue={"loop": CATALOGUE["loop"]})
    assert only_loop.propose(digest("format_error"), base_harness(), PlanContext()) == []
    assert only_loop.propose(digest("format_error", "loop"), base_harness(), PlanContext(max_proposals=5))


def test_a_catalogue_that_names_unknown_causes_or_templates_is_refused():
    with pytest.raises(ValueError, match=r"catalogue causes \['typo'\] are not failure causes; use those of"):
        RuleMetaAgent(catalogue={"typo": ("few_shot_demos",)})
    with pytest.raises(ValueError, match=r"catalogue names templates \['mine'\] that are not in templates"):
        RuleMetaAgent(catalogue={"loop": ("mine",)})


def test_templates_reach_processors_through_insert_edit():
    from examples.my_processor import ToolCallBudget

    edit = insert_edit(base_harness(), ToolCallBudget(name="b"))
    assert edit is not None and edit.index == len(base_harness().at("before_tool"))
    assert Template("t", (ToolCallBudget.kind,), lambda c, h, x: None).dimension == "control_safety"


def test_a_meta_agent_from_an_import_path_must_be_a_no_argument_factory_of_a_meta_agent():
    from coevo.meta import load_meta_agent

    agent = load_meta_agent("examples.my_processor:budget_agent")
    assert isinstance(agent, RuleMetaAgent) and "tool_call_budget" in agent.templates
    with pytest.raises(ValueError, match=r"'examples\.my_processor:ToolCallBudget' returned .* which lacks "
                                         r"\['propose', 'revise', 'state_dict', 'load_state_dict'\] of a meta-agent"):
        load_meta_agent("examples.my_processor:ToolCallBudget")
    with pytest.raises(ValueError, match=r"'examples\.my_processor:stubborn' must take no arguments"):
        load_meta_agent("examples.my_processor:stubborn")
    with pytest.raises(ValueError, match=r"'examples\.my_processor:REMINDER' is 'You have.*', not a callable"):
        load_meta_agent("examples.my_processor:REMINDER")
