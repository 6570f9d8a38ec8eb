"""A proposal may not import code: building a ``package.module:Class`` kind imports its module,
so a meta-agent naming ``this:X`` would run the ``this`` module (it prints its text) before the
edit could be refused; such a kind is refused without importing it. Kinds of modules already
loaded (the user's own processors) stay proposable."""

from __future__ import annotations

import json
import sys

import pytest

from coevo.evolution.evolver import BuildError, build_candidate
from coevo.evolution.meta_agent import PlanContext
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit, apply_edit
from coevo.meta.llm import LLMMetaAgent
from coevo.rundir.evolve_records import Proposal
from tests.meta.test_llm import Scripted, make_digest, plan, proposal_json

HOSTILE = {"op": "insert", "processor": "zen", "spec": {"kind": "this:X", "name": "zen"}}
USERS_OWN = "examples.my_processor:ToolCallBudget"


@pytest.fixture
def this_not_imported():
    sys.modules.pop("this", None)
    yield
    assert "this" not in sys.modules, "the proposal's import-path kind was imported"


def test_the_critic_refuses_an_import_path_kind_without_importing_it(this_not_imported, capsys):
    proposal = Proposal(hypothesis="h", edits=[Edit(**HOSTILE)], dimension="control_safety", cluster="step_budget")
    with pytest.raises(BuildError, match="a proposal may not import code"):
        build_candidate(base_harness(), proposal)
    assert "Beautiful is better than ugly" not in capsys.readouterr().out


def test_the_llm_meta_agent_drops_the_proposal_without_importing_it(this_not_imported, tmp_path):
    client = Scripted([(plan(proposal_json([HOSTILE])), 10, 10)] * 10)
    agent = LLMMetaAgent(client, cache_dir=tmp_path, name="openai")
    assert agent.propose(make_digest(), base_harness(), PlanContext()) == []
    follow_up = json.dumps(client.calls[-1][0])
    assert "a proposal may not import code" in follow_up  # the model is told why


def test_a_kind_the_starting_harness_already_uses_may_be_proposed():
    own = apply_edit(base_harness(), Edit("insert", "budget", spec={"kind": USERS_OWN, "name": "budget",
                                                                     "params": {"max_calls": 2}}))
    again = Edit("replace", "budget", spec={"kind": USERS_OWN, "name": "budget", "params": {"max_calls": 3}})
    candidate = build_candidate(own, Proposal(hypothesis="h", edits=[again], dimension="tools", cluster="step_budget"))
    assert candidate.get("budget").config["max_calls"] == 3


def test_a_kind_whose_module_the_users_agent_loaded_may_be_proposed():
    import examples.my_processor  # noqa: F401 - as the user's meta-agent module imports it

    edit = Edit("insert", "budget", spec={"kind": USERS_OWN, "name": "budget", "params": {"max_calls": 2}})
    candidate = build_candidate(base_harness(), Proposal(hypothesis="h", edits=[edit], dimension="tools",
                                                         cluster="loop"))
    assert candidate.get("budget").kind == USERS_OWN
