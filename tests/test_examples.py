"""Every guide's example runs, and does what its guide says (docs/environments.md, processors.md,
meta-agents.md, gpu-cluster.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.envs.base import SPLITS, assign_split
from coevo.evolution.reference import gold_reference

ROOT = Path(__file__).resolve().parents[1]
COUNTDOWN = "examples.countdown_env:CountdownEnv"
GUIDES = {"environments.md": ("examples/helpdesk_env.py", "examples/text_sim_env.py", "examples/countdown_env.py",
                               "examples/function_calling_env.py"),
          "processors.md": ("examples/my_processor.py",), "meta-agents.md": ("examples/openai_meta_agent.py",),
          "gpu-cluster.md": ("examples/gpu_cluster.py",)}


@pytest.mark.parametrize(("guide", "example"), [(g, e) for g, examples in sorted(GUIDES.items()) for e in examples])
def test_each_guide_points_at_its_runnable_example(guide, example):
    assert (ROOT / example).is_file()
    assert example in (ROOT / "docs" / guide).read_text()


# ------------------------------------------------- docs/environments.md, worked examples 1 and 2
HELPDESK, TEXT_SIM = "examples.helpdesk_env:HelpdeskEnv", "examples.text_sim_env:TextSimEnv"
LONG_STEPS = 12  # the guide's setting for long gold paths: --max-steps 12 (it raises step_budget.max_steps too)
CONVERSATION_PROMPT = ("You are the {env} agent, talking with a user. Use the tools to do what they ask, "
                       "then reply to them as <answer>...</answer>; they may write again.")


def long_harness():
    from coevo.harness.defaults import base_harness

    return base_harness().set_param("step_budget", "max_steps", LONG_STEPS)


def gold_run(env, tasks, harness=None, max_steps=LONG_STEPS, all_tasks=None):
    """The gold policy (as ``--model gold`` builds it) through the real runtime."""
    from coevo.agent.gold import GoldPolicy
    from coevo.agent.rollouts import RolloutService

    policy = GoldPolicy(all_tasks if all_tasks is not None else tasks, answer=getattr(env, "gold_answer", None))
    service = RolloutService(policy, env, batch_size=len(tasks), max_steps=max_steps, workers=4, seed=0)
    return service.run(harness or long_harness(), tasks, attempts=1, phase=None)


def degraded(tasks):
    """Each task's gold path without its last call (per-turn counts adjusted): a solution that falls short."""
    out = []
    for t in tasks:
        meta = dict(t.metadata)
        if "turn_calls" in meta:
            meta["turn_calls"] = [*meta["turn_calls"][:-1], meta["turn_calls"][-1] - 1]
        out.append(replace(t, gold_actions=t.gold_actions[:-1], metadata=meta))
    return out


@pytest.mark.parametrize("example", ["helpdesk_env.py", "text_sim_env.py"])
def test_worked_examples_stay_short_and_self_contained(example):
    text = (ROOT / "examples" / example).read_text()
    assert len(text.splitlines()) <= 180
    lines = [line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))]
    imports = {name.split(".")[0].rstrip(",") for name in lines}
    assert imports <= {"__future__", "copy", "hashlib", "json", "random", "subprocess", "sys", "typing", "coevo"}


def test_helpdesk_tasks_are_conversations_with_stable_ids_hash_splits_and_per_turn_gold():
    from examples.helpdesk_env import TOOLS, HelpdeskEnv

    a, b = HelpdeskEnv(n_tasks=30, seed=3), HelpdeskEnv(n_tasks=30, seed=3)
    by_split = {s: a.tasks(s) for s in SPLITS}
    assert all(by_split.values()) and sum(map(len, by_split.values())) == 30
    for split, tasks in by_split.items():
        assert [t.task_id for t in tasks] == [t.task_id for t in b.tasks(split)]
        for t in tasks:
            assert t.split == split == assign_split(t.task_id, 3)
            turns, per_turn = t.metadata["user_turns"], t.metadata["turn_calls"]
            assert len(turns) in (2, 3) and len(per_turn) == len(turns) and sum(per_turn) == len(t.gold_actions)
            assert len(t.metadata["gold_replies"]) == len(turns) - 1 and t.instruction.count(turns[0]) == 1
            assert {c.name for c in t.gold_actions} <= set(TOOLS) and "tool:find_account" in t.capabilities
    assert len(TOOLS) == 4
    with pytest.raises(ValueError, match="unknown split"):
        a.tasks("dev")


def test_helpdesk_api_is_stateful_and_refuses_bad_calls_with_error_results():
    from examples.helpdesk_env import HelpdeskEnv

    task = HelpdeskEnv(n_tasks=3).tasks("train")[0]
    session = HelpdeskEnv(n_tasks=3).reset(task)
    found = session.call_tool("find_account", dict(task.gold_actions[0].arguments))
    aid = found.output.split(":")[0]
    assert found.error is None and aid in session.accounts.world
    assert "no account with email" in session.call_tool("find_account", {"email": "nobody@x.org"}).error
    assert "plan must be one of" in session.call_tool("change_plan", {"account_id": aid, "plan": "gold"}).error
    assert "no account" in session.call_tool("change_plan", {"account_id": "A-0", "plan": "pro"}).error
    assert "needs the string arguments" in session.call_tool("refund", {"account_id": aid}).error
    invoice = next(iter(session.accounts.world[aid]["invoices"]))
    assert session.call_tool("refund", {"account_id": aid, "invoice_id": invoice}).error is None
    assert "not a paid invoice" in session.call_tool("refund", {"account_id": aid, "invoice_id": invoice}).error
    assert "unknown tool" in session.call_tool("delete_account", {}).error
    assert task.metadata["world"][aid]["invoices"][invoice] == "paid"  # the session changed its own copy only


def test_helpdesk_verifier_reads_the_final_state_and_needs_a_reply_to_every_turn():
    from examples.helpdesk_env import HelpdeskEnv

    env = HelpdeskEnv(n_tasks=6)
    task = next(t for t in env.tasks("train") if len(t.metadata["user_turns"]) == 3)
    session = env.reset(task)
    for call in task.gold_actions:
        assert session.call_tool(call.name, dict(call.arguments)).error is None
    assert session.respond("ok") == task.metadata["user_turns"][1]
    assert session.respond("ok") == task.metadata["user_turns"][2]
    unreplied = session.verify("done")  # the state is right, but the last turn never went through respond
    assert not unreplied.passed and unreplied.info["turns_replied"] == 2
    assert session.respond("any text at all") is None
    assert session.verify("any text at all").passed and session.verify("any text at all").reward == 1.0
    fresh = env.reset(task)  # the right words, no actions: the state decides
    for _ in task.metadata["user_turns"]:
        fresh.respond("Done, your plan is changed and the refund issued.")
    assert not fresh.verify("Done.").passed and fresh.verify("Done.").info["wrong_accounts"]


def test_helpdesk_gold_conversations_pass_through_the_runtime_and_a_degraded_gold_fails():
    from coevo.harness.defaults import base_harness
    from examples.helpdesk_env import HelpdeskEnv

    env = HelpdeskEnv()
    val = env.tasks("val")
    guide = (ROOT / "docs" / "environments.md").read_text()
    assert CONVERSATION_PROMPT[-60:] in guide  # the guide's conversational system prompt, used here
    done = gold_run(env, val, harness=long_harness().set_param("system_prompt", "template", CONVERSATION_PROMPT))
    assert done.pass_at_1 == 1.0
    for trace, task in zip(done.traces, val, strict=True):
        assert trace.stop_reason == "answer" and trace.final_answer == HelpdeskEnv.gold_answer(task)
        assert trace.replies == task.metadata["gold_replies"]
    assert gold_run(env, degraded(val)).pass_at_1 == 0.0
    # the defaults (6 model calls) cut the longest conversations: why the guide raises both limits
    cut = gold_run(env, val, harness=base_harness(), max_steps=6)
    assert 0 < cut.pass_at_1 < 1 and {t.stop_reason for t in cut.traces if not t.passed} == {"step_budget"}


def test_text_sim_has_the_benchmarks_own_splits_and_a_process_per_session():
    from examples.text_sim_env import DEV, TEST, TRAIN, TextSimEnv

    env = TextSimEnv()
    assert [t.task_id for t in env.tasks("val")] == [f"room-{name}" for name in DEV]  # dev is coevo's val
    assert [t.task_id for t in env.tasks("test")] == [f"room-{name}" for name in TEST]
    assert len({t.task_id for s in SPLITS for t in env.tasks(s)}) == len(TRAIN + DEV + TEST) == 12
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("dev")
    task = env.tasks("train")[0]
    one, two = env.reset(task), env.reset(task)
    try:
        assert one.proc.pid != two.proc.pid and "small room" in one.observation
        assert one.call_tool("act", {"command": "open box"}).output.startswith("You open the box")
        assert "box (closed)" in two.call_tool("act", {"command": "look"}).output  # each process its own state
        assert "one command" in one.call_tool("act", {"command": "__score__"}).error
        assert "only tool" in one.call_tool("look", {}).error
        assert not one.verify("I opened the door").passed  # the simulator's score decides, not the answer
        one.proc.kill()  # what a deadline does to a call that overran: the next call replays the game first
        assert "box (open)" in one.call_tool("act", {"command": "look"}).output and one.proc.starts == 2
    finally:
        one.close()
        two.close()
    assert one.proc.pid is None and two.proc.pid is None
    # gold paths replay to reference trajectories (the game ends on the last gold action)
    assert all(gold_reference(env, t) is not None for t in env.tasks("train")[:2])


def test_text_sim_gold_passes_a_degraded_gold_fails_and_at_most_four_simulators_run(monkeypatch):
    import threading

    from examples import text_sim_env

    procs, lock, state = [], threading.Lock(), {"open": 0, "peak": 0}

    class Counted(text_sim_env.SimSession):
        def __init__(self, task):
            super().__init__(task)
            procs.append(self.proc)
            with lock:
                state["open"] += 1
                state["peak"] = max(state["peak"], state["open"])

        def close(self):
            super().close()
            with lock:
                state["open"] -= 1

    monkeypatch.setattr(text_sim_env, "SimSession", Counted)
    env = text_sim_env.TextSimEnv()
    every = [t for s in SPLITS for t in env.tasks(s)]
    done = gold_run(env, every)
    assert done.pass_at_1 == 1.0 and all(t.stop_reason == "env_done" for t in done.traces)
    assert state["peak"] == text_sim_env.TextSimEnv.max_sessions == 4 and state["open"] == 0
    assert len(procs) == 12 and all(p.pid is None and p.starts == 1 for p in procs)  # close() ended every process
    assert gold_run(env, degraded(env.tasks("val"))).pass_at_1 == 0.0


def test_text_sim_reset_ends_its_process_when_the_simulator_fails_to_start(monkeypatch):
    from coevo.envs import line_process
    from examples import text_sim_env

    started = []
    real = line_process.subprocess.Popen

    def recording(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(line_process.subprocess, "Popen", recording)
    monkeypatch.setattr(text_sim_env, "SIM_SOURCE", "import sys, time\nsys.stdin.readline()\nprint('boom')\n"
                                                    "time.sleep(60)")
    env = text_sim_env.TextSimEnv()
    with pytest.raises(json.JSONDecodeError):
        env.reset(env.tasks("val")[0])
    (proc,) = started
    assert proc.poll() is not None  # terminated, not left sleeping
    done = gold_run(env, env.tasks("val")[:1])  # through the runtime: the episode fails, the run goes on
    assert done.traces[0].error_source == "env" and "env reset" in done.traces[0].error
    assert all(p.poll() is not None for p in started)


@pytest.mark.parametrize(("env_path", "env_name"), [(HELPDESK, "helpdesk"), (TEXT_SIM, "text_sim")])
def test_coevo_eval_replays_the_gold_of_each_worked_example(tmp_path, monkeypatch, env_path, env_name):
    """The guide's commands: ``--model gold --max-steps 12`` (the cap raises the harness's step
    budget too) passes every val task; the default cap of 6 cuts the long helpdesk conversations."""
    from coevo.cli.main import app

    monkeypatch.chdir(ROOT)
    args = ["eval", "--env", env_path, "--model", "gold", "--split", "val"]
    result = CliRunner().invoke(app, [*args, "--max-steps", str(LONG_STEPS), "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["env"] == env_name and summary["n_tasks"] == {"helpdesk": 8, "text_sim": 3}[env_name]
    assert summary["pass_at_1"] == 1.0 and summary["errors"] == 0
    if env_name == "helpdesk":  # the default cap, 6 model calls, as the guide says
        short = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "short")])
        assert short.exit_code == 0, short.output
        assert json.loads((tmp_path / "short" / "summary.json").read_text())["pass_at_1"] == 0.75


# --------------------------------------------------------------------------- docs/environments.md
def test_countdown_env_fits_in_150_lines_and_has_stable_ids_splits_and_capabilities():
    from examples.countdown_env import CountdownEnv

    assert len((ROOT / "examples" / "countdown_env.py").read_text().splitlines()) <= 150
    a, b = CountdownEnv(n_tasks=40, seed=5), CountdownEnv(n_tasks=40, seed=5)
    by_split = {s: a.tasks(s) for s in SPLITS}
    assert all(by_split.values()) and sum(map(len, by_split.values())) == 40
    for split, tasks in by_split.items():
        assert [t.task_id for t in tasks] == [t.task_id for t in b.tasks(split)]
        assert all(t.split == split == assign_split(t.task_id, 5) for t in tasks)
        for t in tasks:
            size = {3: "three", 4: "four"}[len(t.metadata["numbers"])]
            assert t.capabilities == ("tool:combine", f"skill:countdown_{size}_numbers")
    with pytest.raises(ValueError, match="unknown split"):
        a.tasks("dev")
    with pytest.raises(ValueError, match="n_tasks >= 1"):
        CountdownEnv(n_tasks=0)


def test_countdown_verifier_accepts_the_gold_answer_and_refuses_wrong_ones():
    from examples.countdown_env import CountdownEnv

    env = CountdownEnv(n_tasks=20, seed=1)
    task = env.tasks("train")[0]
    numbers, target = task.metadata["numbers"], task.metadata["target"]
    session = env.reset(task)
    assert session.verify(task.answer).passed and session.verify(task.answer).reward == 1.0
    assert not session.verify(str(target)).passed  # the target itself is not an expression of the numbers
    reused = session.verify(" + ".join([str(numbers[0])] * (numbers.count(numbers[0]) + 1)))
    assert not reused.passed and reused.reward == 0.0 and "not given (or too often)" in reused.info["why"]
    total = sum(numbers)
    other = " + ".join(map(str, numbers)) if total != target else " * ".join(map(str, numbers))
    off = session.verify(other)
    assert not off.passed and f"not {target}" in off.info["why"]
    assert "not an arithmetic expression" in session.verify("the answer is 5").info["why"]
    assert not session.verify(None).passed
    # every train task's gold actions replay to a verified reference trajectory
    assert all(gold_reference(env, t) is not None for t in env.tasks("train"))


def test_countdown_tool_is_stateful_and_its_errors_leave_the_pool_unchanged():
    from examples.countdown_env import CountdownEnv

    env = CountdownEnv(n_tasks=10, seed=2)
    task = env.tasks("train")[0]
    session = env.reset(task)
    first = task.gold_actions[0]
    out = session.call_tool("combine", dict(first.arguments))
    assert out.error is None and out.output.startswith("pool: ")
    assert len(session.pool) == len(task.metadata["numbers"]) - 1
    before = list(session.pool)
    bad = session.call_tool("combine", {"a": 10_000, "op": "+", "b": session.pool[0][0]})
    assert bad.error is not None and "must both be in the pool" in bad.error and session.pool == before
    assert "op must be one of" in session.call_tool("combine", {"a": 1, "op": "/", "b": 1}).error
    assert "unknown tool" in session.call_tool("calculator", {}).error


def test_coevo_eval_finds_the_env_by_its_import_path(tmp_path):
    """The documented console command, run as a user would: the scripted solver passes every task."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coevo = Path(sys.executable).parent / "coevo"
    out = subprocess.run([str(coevo), "eval", "--env", COUNTDOWN, "--model", "scripted", "--split", "val",
                          "--env-arg", "n_tasks=30", "--out", str(tmp_path / "eval")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["env"] == "countdown" and summary["n_tasks"] > 0
    assert summary["pass_at_1"] == 1.0 and summary["errors"] == 0
    bad = subprocess.run([str(coevo), "eval", "--env", "examples.no_such_env:Env", "--model", "scripted"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "not importable" in bad.stdout + bad.stderr


def test_coevo_evolve_runs_on_the_env_by_its_import_path(tmp_path):
    from coevo.cli.main import app

    out = tmp_path / "evolve"
    result = CliRunner().invoke(app, ["evolve", "--env", COUNTDOWN, "--env-arg", "n_tasks=30", "--model", "scripted",
                                      "--rounds", "1", "--batch-tasks", "4", "--val-limit", "3", "--test-limit", "0",
                                      "--max-steps", "6", "--out", str(out)])  # train.yaml's 3 cut a tool episode
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["splits"]["val"]["pass@1"] == [1.0, 1.0]
    assert [json.loads(line)["round"] for line in (out / "rounds.jsonl").read_text().splitlines()] == [0]


def test_coevo_stream_releases_the_env_skills_in_stages(tmp_path):
    from coevo.cli.main import app

    out = tmp_path / "stream"
    result = CliRunner().invoke(app, ["stream", "--env", COUNTDOWN, "--axis", "skills", "--stages", "2", "--model",
                                      "scripted", "--rounds-per-stage", "0", "--adapt-limit", "2", "--eval-limit", "4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert sorted(s for stage in metrics["released"] for s in stage) == [
        "countdown_four_numbers", "countdown_three_numbers"]
    assert metrics["deployment"]["final_pass_rate"] == 1.0


@pytest.mark.parametrize("overrides", [
    ["hydra.searchpath=[file://" + str(ROOT / "examples" / "configs") + "]", "env=countdown"],
    ["~env", f"env.name={COUNTDOWN}", "+env.args.n_tasks=30"],
])
def test_train_py_config_selects_the_env_by_config_only(overrides):
    from coevo.envs.load import make_env
    from examples.gpu_cluster import compose

    cfg = compose(overrides)  # Hydra's compose API over configs/, then coevo.loop.config_check.check
    env = make_env(cfg.env.name, cfg.env.args)
    assert env.name == "countdown" and env.tasks("train")


def test_a_bad_env_config_names_the_field_and_the_allowed_forms():
    from examples.gpu_cluster import compose

    with pytest.raises(ValueError, match=r"config env\.name='countdown'.*built-in env .*package\.module:ClassName"):
        compose(["env.name=countdown"])
    with pytest.raises(ValueError, match=r"config env\.args:.*unexpected keyword argument 'datasets'.*CountdownEnv\("):
        compose([f"env.name={COUNTDOWN}"])  # the default env group's reasoning-gym arguments


@pytest.mark.slow
def test_train_py_runs_a_round_on_the_env(tmp_path):
    overrides = ["~env", f"env.name={COUNTDOWN}", "+env.args.n_tasks=30", "model=tiny", "trainer=grpo",
                 "harness=lenient", "rounds=1", "batch_tasks=2", "rollout.attempts=2", "val_limit=2",
                 "rollout.max_new_tokens=16", "rollout.keep_truncated=true", "rollout.max_steps=2",
                 f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert record["train"]["n_traces"] == 4 and all(t.startswith("countdown-") for t in record["train"]["outcomes"])


# ----------------------------------------------------------------------------- docs/processors.md
def test_my_processor_example_is_checked_run_and_proposed():
    from examples.my_processor import ToolCallBudget, main

    out = main()
    refusals = out["refusals"]
    assert set(refusals) == {"same_hook", "ordering", "singleton_group", "event_type", "unknown_processor"}
    for rule, message in refusals.items():
        assert message.startswith(f"[{rule}] processor ")
    assert "'tool_call_budget'" in refusals["ordering"] and "'mistyped'" in refusals["event_type"]
    assert out["causes"] == ["loop"]
    (edit,) = out["proposal"].edits
    assert edit.op == "insert" and edit.spec["kind"] == ToolCallBudget.kind
    assert out["proposal"].dimension == "control_safety" and out["proposal"].cluster == "loop"
    assert out["reloaded"].id == out["evolved"].id  # the import-path kind loads back from YAML
    # the processor changes the episodes: calls over the budget are answered by it, and the tasks pass
    assert (out["before"].pass_at_1, out["after"].pass_at_1) == (0.0, 1.0)
    blocked = [e for t in out["evolved_traces"] for e in t.events if e.get("hook") == "before_tool" and e["blocked"]]
    assert len(blocked) == out["blocked"] == len(out["evolved_traces"])
    assert not any(e.get("blocked") for t in out["base_traces"] for e in t.events)
    assert all(t.stop_reason == "loop" for t in out["base_traces"])
    # and AEGIS ships it: the Critic's re-run flips the looping tasks and breaks none
    (verdict,) = out["report"].verdicts
    assert verdict.ship and verdict.pass_to_fail == [] and len(verdict.fail_to_pass) == len(out["base_traces"])
    assert out["report"].shipped == [out["evolved"].id] == [out["aegis"].harness().id]


def test_train_py_and_coevo_evolve_take_the_custom_agent_by_config(tmp_path):
    from coevo.cli.main import app
    from coevo.loop.builders import build_meta
    from examples.gpu_cluster import compose
    from examples.my_processor import BUDGET_TEMPLATE

    cfg = compose(["meta_agent.backend=examples.my_processor:budget_agent"])
    agent = build_meta(cfg, tmp_path)
    assert agent.templates["tool_call_budget"] is BUDGET_TEMPLATE and agent.catalogue["loop"][0] == "tool_call_budget"
    result = CliRunner().invoke(app, ["evolve", "--env", "arithmetic", "--env-arg", "n_tasks=20", "--model", "scripted",
                                      "--meta", "examples.my_processor:budget_agent", "--rounds", "1", "--batch-tasks",
                                      "3", "--val-limit", "2", "--test-limit", "0", "--out", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    with pytest.raises(ValueError, match=r"config meta_agent\.backend: meta-agent factory .*has no attribute 'nope'"):
        compose(["meta_agent.backend=examples.my_processor:nope"])
    with pytest.raises(ValueError, match=r"meta_agent\.backend='llm' is not allowed; choose one of \['rule', 'openai', "
                                         r"'hf'\] or the import path"):
        compose(["meta_agent.backend=llm"])


# ---------------------------------------------------------------------------- docs/meta-agents.md
def test_openai_meta_agent_example_plans_revises_routes_and_hits_the_cache(tmp_path):
    from coevo.harness.edits import apply_edit
    from coevo.meta.schema import PLAN_SCHEMA
    from examples.openai_meta_agent import main

    out = main(tmp_path / "cache")
    first, second, requests = out["first"], out["second"], out["requests"]
    assert [r["response_format"]["json_schema"]["name"] for r in requests] == [
        "coevo_plan", "coevo_plan", "coevo_revise", "coevo_route"]
    assert requests[0]["response_format"]["json_schema"]["schema"] == PLAN_SCHEMA
    assert "answer_extractor" in requests[1]["messages"][-1]["content"]  # the error quoted back to the model
    assert first["digest"].clusters[0].cause == "format_error"
    assert [e.processor for e in first["planned"].edits] == ["answer_extraction"]
    assert apply_edit(first["harness"], first["planned"].edits[0]).id != first["harness"].id
    assert first["revised"].revision == 1 and first["route"] == ("base", 0.8)
    ledger = first["ledger"]
    assert ledger["plan"]["calls"] == 2 and ledger["plan"]["cached"] == 0 and ledger["total_tokens"] > 0
    # the ledger counts the tokens the server reported (the stub reports characters / 4)
    assert ledger["plan"]["prompt_tokens"] == sum(sum(len(m["content"]) for m in r["messages"]) // 4
                                                  for r in requests[:2])
    # the second run asks the server nothing: every call is a cache hit that costs no tokens
    assert out["second_requests"] == []
    assert all(second["ledger"][s]["cached"] == second["ledger"][s]["calls"] == first["ledger"][s]["calls"]
               for s in ("plan", "revise", "route"))
    assert second["ledger"]["total_tokens"] == 0
    assert second["planned"].key() == first["planned"].key()


# ----------------------------------------------------------------------------- docs/gpu-cluster.md
def test_gpu_cluster_example_checks_configs_composes_launches_and_matches_its_guide():
    from examples.gpu_cluster import LAUNCHES, main

    out = main()
    assert {name: c.distributed_type.value for name, c in out["configs"].items()} == {
        "ddp.yaml": "MULTI_GPU", "ddp_2nodes.yaml": "MULTI_GPU", "fsdp2.yaml": "FSDP", "zero3.yaml": "DEEPSPEED"}
    assert out["configs"]["zero3.yaml"].deepspeed_config["zero_stage"] == 3
    assert out["configs"]["fsdp2.yaml"].fsdp_config["fsdp_version"] == 2
    assert out["configs"]["ddp_2nodes.yaml"].num_machines == 2
    assert len(out["composed"]["sweep"]) == 6
    assert {(c.trainer.lr, c.seed) for c in out["composed"]["sweep"]} == {
        (lr, s) for lr in (1e-5, 5e-5) for s in (0, 1, 2)}
    ddp = out["composed"]["ddp_colocated"][0]
    assert (ddp.model.name, ddp.rollout.backend, ddp.rollout.vllm_mode, ddp.logger.kind) == (
        "/models/Qwen2.5-1.5B-Instruct", "vllm", "colocate", "wandb")
    assert out["composed"]["server"][0].rollout.vllm_mode == "server"
    guide = (ROOT / "docs" / "gpu-cluster.md").read_text()
    for name, launch in LAUNCHES.items():
        assert launch.command() in guide, name
    assert out["table"] in guide and out["sharded_table"] in guide


def test_accelerate_config_checks_refuse_keys_and_values_accelerate_would_not_take(tmp_path):
    from examples.gpu_cluster import ACCELERATE_CONFIGS, check_accelerate_config

    text = (ACCELERATE_CONFIGS / "fsdp2.yaml").read_text()
    for bad, match in ((text.replace("fsdp_version: 2", "fsdp_version: 3"), "fsdp_version"),
                       (text.replace("fsdp_reshard_after_forward", "fsdp_reshard_after_fwd"),
                        "not an accelerate launch"),
                       (text + "num_gpus: 8\n", "unknown keys")):
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(ValueError, match=match):
            check_accelerate_config(path)


def test_memory_arithmetic_counts_the_parameters_transformers_builds():
    """The guide's parameter counts: the analytic formula equals the models transformers instantiates
    from the same shapes (on the meta device: no memory), and the totals are the published sizes."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from examples.gpu_cluster import ARCHS, lora_params, params

    nominal = {"Qwen2.5-0.5B": 0.494, "Qwen2.5-1.5B": 1.544, "Qwen2.5-3B": 3.086, "Qwen2.5-7B": 7.616,
               "Llama-3.1-8B": 8.030, "Qwen2.5-32B": 32.764}
    for a in ARCHS:
        assert abs(params(a) / 1e9 - nominal[a.name]) < 0.005 * nominal[a.name], a.name
    for a in (replace(ARCHS[0], layers=2), replace(ARCHS[-1], layers=2)):  # tied + biases, untied + none
        kind = Qwen2Config if a.qkv_bias else LlamaConfig
        config = kind(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                      intermediate_size=a.intermediate, tie_word_embeddings=a.tied)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == params(a), a.name
    from coevo.trainers.grpo import apply_lora

    a = ARCHS[0]
    small = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=2, num_attention_heads=a.heads,
                        num_key_value_heads=a.kv_heads, intermediate_size=64, tie_word_embeddings=True)
    with torch.device("meta"):
        lora = apply_lora(AutoModelForCausalLM.from_config(small), r=16)
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert trainable == lora_params(a, 16) // a.layers * 2


def test_a_multi_turn_gold_path_replays_as_a_reference_trajectory():
    """A conversation's gold: each turn's calls, its reply, the user's next message, as the
    runtime runs it; the reference gives AEGIS a demonstration of the whole conversation."""
    from coevo.evolution.reference import reference_demo
    from coevo.harness.library.context import demo_problem
    from examples.helpdesk_env import HelpdeskEnv

    env = HelpdeskEnv()
    for task in env.tasks("train"):
        ref = gold_reference(env, task)
        assert ref is not None and ref.passed, task.task_id
        assert len(ref.replies) == len(task.metadata["turn_calls"]) - 1
        users = [m for m in ref.messages if m["role"] == "user"]
        assert len(users) == len(task.metadata["turn_calls"])
    demo = reference_demo(ref)
    assert [m["role"] for m in demo].count("user") == len(task.metadata["turn_calls"])
    assert demo_problem(demo) is None and demo[-1]["role"] == "assistant"
