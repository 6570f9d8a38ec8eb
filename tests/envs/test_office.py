"""The office env: gold paths pass and degraded ones fail by final state, splits and capabilities,
owners, the scripted solver through the real runtime and ``coevo eval``, independent sessions,
tool errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_attempts
from coevo.cli.main import app
from coevo.envs import ENVS, SCRIPTED_SOLVERS, SPLITS
from coevo.envs.office import ENTITIES, OWNER, OfficeEnv, degraded, final_answer, gold_solver
from coevo.evolution.reference import gold_reference
from coevo.harness.defaults import base_harness
from coevo.streams.axes import with_agent_capabilities

ENV = OfficeEnv()
ALL = [t for split in SPLITS for t in ENV.tasks(split)]


def replay(task, calls):
    session = ENV.reset(task)
    for call in calls:
        session.call_tool(call.name, dict(call.arguments))
    return session.verify(final_answer(task))


def test_registered_and_sized():
    assert ENVS["office"] is OfficeEnv and SCRIPTED_SOLVERS["office"] is gold_solver
    assert 60 <= len(ALL) <= 120 and len({t.task_id for t in ALL}) == len(ALL)
    assert [t.task_id for t in OfficeEnv().tasks("val")] == [t.task_id for t in ENV.tasks("val")]
    assert len(ENTITIES) >= 3 and set(OWNER.values()) == set(ENTITIES) and 8 <= len(OWNER) <= 12


def test_every_gold_path_passes_and_every_degraded_one_fails():
    assert ALL and all(task.gold_actions for task in ALL)
    for task in ALL:
        session = ENV.reset(task)
        for call in task.gold_actions:
            result = session.call_tool(call.name, dict(call.arguments))
            assert result.error is None, (task.task_id, call, result.error)
        score = session.verify(final_answer(task))
        assert score.passed and score.reward == 1.0, (task.task_id, score.info)
        bad = replay(task, degraded(task.gold_actions))
        assert not bad.passed and bad.reward == 0.0 and bad.info["problems"], task.task_id


def test_final_answer_is_checked_where_the_task_asks_a_question():
    asked = [t for t in ALL if t.answer["reply"] is not None]
    assert asked
    for task in asked:
        session = ENV.reset(task)
        for call in task.gold_actions:
            session.call_tool(call.name, dict(call.arguments))
        assert not session.verify("I do not know").passed and not session.verify(None).passed
        assert session.verify(f"The answer is {task.answer['reply']}.").passed


def test_splits_capabilities_entities_and_owners():
    for split in SPLITS:
        tasks = ENV.tasks(split)
        assert tasks and any(len(t.metadata["entities"]) >= 2 for t in tasks), split
        assert any(len(t.metadata["entities"]) == 1 for t in tasks), split
    for task in ALL:
        gold_tools = {c.name for c in task.gold_actions}
        assert set(task.capabilities) == {f"tool:{n}" for n in gold_tools} and len(task.capabilities) == len(gold_tools)
        assert task.metadata["entities"] == sorted({OWNER[n] for n in gold_tools})
        assert gold_tools <= set(ENV.reset(task).tools)
    agents = with_agent_capabilities(ALL, OWNER)
    assert all({c for c in a.capabilities if c.startswith("agent:")} == {f"agent:{e}" for e in t.metadata["entities"]}
               for a, t in zip(agents, ALL, strict=True))
    assert any(len(t.metadata["entities"]) == 4 for t in ALL)


def test_gold_calls_fit_the_base_harness_reply_budget():
    """A gold call as one completion fits the base harness's max_new_tokens (ScriptedPolicy counts bytes)."""
    budget = base_harness().get("sampling").config["max_new_tokens"]
    assert ALL and all(task.gold_actions for task in ALL)
    for task in ALL:
        messages = [{"role": "user", "content": task.instruction}]
        for _ in task.gold_actions:
            reply = gold_solver(messages)
            assert len(reply.encode()) <= budget, (task.task_id, reply)
            messages.append({"role": "assistant", "content": reply})


def test_gold_references_replay():
    task = next(t for t in ENV.tasks("train") if t.answer["reply"] is not None)
    assert gold_reference(ENV, task) is not None


def harness(steps: int = 10):
    return base_harness().set_param("step_budget", "max_steps", steps)


@pytest.mark.parametrize("split", SPLITS)
def test_scripted_solver_passes_every_task_through_the_runtime(split):
    tasks = ENV.tasks(split)
    traces = run_attempts(tasks, harness(), ScriptedPolicy(gold_solver), ENV, max_steps=10, batch_size=4)
    assert tasks
    for task, (trace,) in zip(tasks, traces, strict=True):
        assert trace.error is None and trace.passed, (task.task_id, trace.stop_reason, trace.verifier_info)
        assert [c.name for c in trace.tool_calls] == [c.name for c in task.gold_actions]


def test_sessions_are_independent():
    task = next(t for t in ALL if t.metadata["kind"] == "cancel_event")
    a, b = ENV.reset(task), ENV.reset(task)
    for call in task.gold_actions:  # interleaved: a acts, b only looks
        a.call_tool(call.name, dict(call.arguments))
        b.call_tool("calendar_list", {"date": task.gold_actions[0].arguments["date"]})
    assert a.verify("done").passed and not b.verify("done").passed
    assert ENV.reset(task).world.state == b.world.state  # b untouched, a fresh session starts clean
    # the same task twice in one runtime batch: each episode sends its own mail once
    twice = [next(t for t in ALL if t.metadata["kind"] == "move_and_notify")] * 2
    traces = run_attempts(twice, harness(), ScriptedPolicy(gold_solver), ENV, max_steps=10, batch_size=2)
    assert all(t.passed for (t,) in traces)


def test_bad_arguments_and_unknown_ids_are_tool_errors():
    session = ENV.reset(ALL[0])
    before = json.dumps(session.world.state, sort_keys=True)
    for name, args, message in [
        ("calendar_cancel", {"event_id": "ev-99"}, "no event with id"),
        ("calendar_reschedule", {"event_id": "ev-1", "date": "tomorrow", "time": "10:00"}, "YYYY-MM-DD"),
        ("calendar_create", {"title": "x", "date": "2026-03-02", "time": "25:00", "attendees": []}, "HH:MM"),
        ("calendar_create", {"title": "x", "date": "2026-03-02", "time": "10:00", "attendees": "bob"}, "list"),
        ("contacts_update", {"contact_id": "c-42", "field": "phone", "value": "1"}, "no contact with id"),
        ("contacts_update", {"contact_id": "c-1", "field": "salary", "value": "1"}, "field must be one of"),
        ("contacts_find", {}, "missing ['name']"),
        ("mail_send", {"to": "nobody", "subject": "s", "body": "b"}, "not an email address"),
        ("mail_search", {"query": "x", "limit": 3}, "unexpected ['limit']"),
        ("files_read", {"path": "nope.txt"}, "no file"),
        ("files_write", {"path": 3, "content": "x"}, "non-empty string"),
        ("calendar_list", "2026-03-02", "object of arguments"),
        ("printer_print", {"x": 1}, "unknown tool"),
    ]:
        result = session.call_tool(name, args)
        assert result.error is not None and message in result.error, (name, result)
    assert json.dumps(session.world.state, sort_keys=True) == before


def test_coevo_eval_scripted(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["eval", "--env", "office", "--model", "scripted", "--split", "val",
                                      "--max-steps", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_tasks"] == len(ENV.tasks("val")) and summary["pass_at_1"] == 1.0


@pytest.mark.parametrize("kind", ["invite", "send_agenda", "move_and_notify", "save_card", "new_email"])
def test_multi_entity_kinds_exist(kind):
    assert any(t.metadata["kind"] == kind and len(t.metadata["entities"]) >= 2 for t in ALL)
