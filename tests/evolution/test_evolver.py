"""The Evolver builds typed and code-level proposals through the algebra, or says why not."""

from __future__ import annotations

import pytest

from coevo.agent.episode import Job
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_episodes
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.evolution.evolver import BuildError, build_candidate
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.rundir.evolve_records import Proposal

# a subclass of the built-in answer extraction that also accepts "RESULT=> <x>" and keeps the
# parent's behaviour through super()
SOURCE = '''
class ColonAnswer(AnswerExtraction):
    def process(self, event):
        event = super().process(event)
        if event.answer is None and "RESULT=>" in event.text:
            event.answer = event.text.split("RESULT=>")[-1].strip()
        return event
'''


def code_proposal(source: str = SOURCE) -> Proposal:
    spec = {"kind": "code", "name": "answer_extraction",
            "params": {"source": source, "class_name": "ColonAnswer", "init_params": {}}}
    return Proposal("answers written as RESULT=> x are lost", [Edit("replace", "answer_extraction", spec=spec)],
                    dimension="evaluation_reward", cluster="format_error")


def test_a_code_level_subclass_is_built_and_changes_behaviour():
    env = ArithmeticEnv(n_tasks=10, max_terms=2, seed=1)
    task = env.tasks("train")[0]
    policy = ScriptedPolicy(lambda m: f"RESULT=> {task.answer}")
    base = base_harness()
    candidate = build_candidate(base, code_proposal())
    assert candidate.parent_id is not None and candidate.get("answer_extraction").kind == "code"
    assert candidate.edit.manifest["hypothesis"] == "answers written as RESULT=> x are lost"
    before, after = (run_episodes([Job(task, h)], policy, env, max_steps=2)[0] for h in (base, candidate))
    assert (before.passed, after.passed) == (False, True)


def test_code_without_super_is_refused_with_the_reason():
    with pytest.raises(BuildError, match="super"):
        build_candidate(base_harness(), code_proposal(SOURCE.replace("super().process(event)", "event")))


def test_an_edit_that_breaks_the_algebra_names_the_edit():
    bad = Proposal("x", [Edit("set_param", "step_budget", param="max_steps", value="many")], dimension="control_safety")
    with pytest.raises(BuildError, match=r"edit 0 \(set_param step_budget.max_steps\)"):
        build_candidate(base_harness(), bad)
    with pytest.raises(BuildError, match="unchanged"):
        build_candidate(base_harness(), Proposal("x", [Edit("set_param", "step_budget", param="max_steps", value=6)],
                                                 dimension="control_safety"))
