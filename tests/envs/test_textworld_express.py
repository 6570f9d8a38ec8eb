"""TextWorld-Express env: gold paths win, wrong play loses, splits are pinned, and no JVM outlives
its env. Needs Java; each env starts its JVMs lazily (about half a second each)."""

import json
import os
import shutil

import pytest

pytest.importorskip("textworld_express")
if shutil.which("java") is None:
    pytest.skip("TextWorld-Express needs java on PATH", allow_module_level=True)

import textworld_express

from coevo.agent.episode import Job
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.runtime import run_episode, run_episodes
from coevo.envs.textworld_express import GAMES, TWXEnv
from coevo.harness.defaults import base_harness


def java_children() -> set[int]:
    """Pids of java processes whose parent is this test process (from /proc), zombies included:
    a JVM that exited but was never waited for also counts as left behind."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if comm == "java" and ppid == os.getpid():
            pids.add(int(entry))
    return pids


@pytest.fixture(scope="module")
def env():
    with TWXEnv(n_per_game=2, max_workers=2) as e:
        yield e


def play(session, commands):
    for command in commands:
        result = session.call_tool("act", {"command": command})
        assert result.error is None, result.error
    return session.verify(None)


@pytest.mark.parametrize("game", GAMES)
def test_gold_path_wins_and_wrong_play_loses(env, game):
    for split in ("train", "test"):
        task = next(t for t in env.tasks(split) if t.metadata["game"] == game)
        assert task.capabilities == (f"game:{game}", "tool:act")
        assert json.loads(json.dumps(dict(task.metadata))) == dict(task.metadata)
        assert [c.arguments["command"] for c in task.gold_actions] == list(task.answer)

        session = env.reset(task)
        assert task.instruction in session.observation and set(session.tools) == {"act", "valid_actions"}
        score = play(session, task.answer)
        assert session.done and score.passed and score.reward == 1.0, (task.task_id, score)
        assert session.call_tool("act", {"command": "look around"}).error == "the game is over"
        session.close()

        idle = env.reset(task)
        score = idle.verify("I won")
        assert not score.passed and score.reward == 0.0

        wrong = env.reset(task)
        score = play(wrong, ["dance", "xyzzy", "inventory"])
        assert not wrong.done and not score.passed and score.reward < 1.0
        for s in (idle, wrong):
            s.close()


def test_tool_arguments_and_step_limit(env):
    task = next(t for t in env.tasks("val") if t.metadata["game"] == "coin")
    session = env.reset(task)
    assert session.call_tool("act", {}).error
    assert session.call_tool("act", ["look around"]).error
    assert session.call_tool("act", {"command": 3}).error
    assert session.call_tool("act", {"command": "  "}).error
    assert session.call_tool("act", {"command": "x" * 500}).error
    assert session.call_tool("jump", {}).error.startswith("unknown tool")
    assert "look around" in session.call_tool("valid_actions", {}).output
    limit = session.step_limit
    assert limit == max(30, task.metadata["gold_length"])
    for _i in range(limit):
        assert not session.done
        out = session.call_tool("act", {"command": "dance"})
    assert session.done and "step limit" in out.output
    assert not session.verify(None).passed
    session.close()
    assert session.call_tool("act", {"command": "look around"}).error == "the session is closed"


def test_splits_are_disjoint_and_pinned():
    with TWXEnv(games=["coin", "arithmetic"], n_per_game=3) as env:
        splits = {s: env.tasks(s) for s in ("train", "val", "test")}
        ids = [t.task_id for ts in splits.values() for t in ts]
        assert len(ids) == len(set(ids)) == 18
        seeds = {s: {(t.metadata["game"], t.metadata["seed"]) for t in ts} for s, ts in splits.items()}
        assert not (seeds["train"] & seeds["val"] or seeds["train"] & seeds["test"] or seeds["val"] & seeds["test"])
        coin = {
            s: [(t.task_id, t.metadata["gold_length"]) for t in ts if t.metadata["game"] == "coin"]
            for s, ts in splits.items()
        }
        # Pinned: a change here means the package or our seed mapping changed the task set.
        assert coin == {
            "train": [("twx/coin/train/0", 3), ("twx/coin/train/1", 2), ("twx/coin/train/2", 2)],
            "val": [("twx/coin/dev/10000", 3), ("twx/coin/dev/10001", 3), ("twx/coin/dev/10002", 4)],
            "test": [("twx/coin/test/20000", 2), ("twx/coin/test/20001", 3), ("twx/coin/test/20002", 3)],
        }
        assert splits["val"][2].answer == ("look around", "move north", "move west", "take coin")
        arith = next(t for t in splits["train"] if t.task_id == "twx/arithmetic/train/0")
        assert arith.answer[-1] == "put 2 bananas in box" and arith.split == "train"
        assert all(t.split == s for s, ts in splits.items() for t in ts)
    # Stable across JVMs: the package's coin gold path is a random walk that is not.
    with TWXEnv(games=["coin"], n_per_game=3) as again:
        assert again.tasks("val") == [t for t in splits["val"] if t.metadata["game"] == "coin"]


def test_bad_configuration():
    with pytest.raises(ValueError, match="choose from"):
        TWXEnv(games=["coin", "zork"])
    with pytest.raises(ValueError, match="choose from"):
        TWXEnv(game_params={"simonsays": "gameLength=3"})
    with pytest.raises(ValueError):
        TWXEnv(n_per_game=0)


def test_no_jvm_left_after_close_and_context_manager():
    before = java_children()
    env = TWXEnv(games=["coin"], n_per_game=1, max_workers=2)
    task = env.tasks("train")[0]
    a, b = env.reset(task), env.reset(task)
    a.call_tool("act", {"command": "look around"})
    b.call_tool("act", {"command": "look around"})
    assert 1 <= len(java_children() - before) <= 2  # steps in turn share a JVM
    env.close()
    assert java_children() == before
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        env.reset(task)

    with TWXEnv(games=["sorting"], n_per_game=1) as env:
        env.tasks("test")
        assert len(java_children() - before) == 1
    assert java_children() == before


def test_session_that_raises_kills_its_jvm(monkeypatch):
    before = java_children()
    with TWXEnv(games=["coin"], n_per_game=1, max_workers=1) as env:
        task = env.tasks("train")[0]
        session = env.reset(task)
        session.call_tool("act", {"command": "look around"})
        started = java_children() - before
        assert len(started) == 1

        def broken_step(self, command):
            raise RuntimeError("simulated JVM failure")

        with monkeypatch.context() as m:
            m.setattr(textworld_express.TextWorldExpressEnv, "step", broken_step)
            with pytest.raises(RuntimeError, match="simulated"):
                session.call_tool("act", {"command": "look around"})
            assert session.done
            assert java_children() == before  # the broken JVM is killed, not pooled
            assert session.call_tool("act", {"command": "look around"}).error == "the session is closed"

            trace = run_episode(task, base_harness(), ScriptedPolicy(gold_responder([task])), env)
            assert trace.error and "env tool 'act'" in trace.error and not trace.passed
            assert java_children() == before

        fresh = env.reset(task)  # the env recovers with a new JVM
        assert play(fresh, task.answer).passed
        assert len(java_children() - before) == 1
    assert java_children() == before


def gold_responder(tasks):
    """A scripted agent that plays each task's gold path, one act call per model turn."""
    gold = {t.instruction: list(t.answer) for t in tasks}
    assert len(gold) == len(tasks), "tasks must have distinct instructions"

    def respond(messages):
        task = next(m["content"] for m in messages if m["role"] == "user")
        commands = next(g for instruction, g in gold.items() if task.startswith(instruction))
        turn = sum(m["role"] == "assistant" for m in messages)
        call = {"name": "act", "arguments": {"command": commands[min(turn, len(commands) - 1)]}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    return respond


def test_runtime_end_to_end(env):
    harness = base_harness().set_param("step_budget", "max_steps", 40)
    task = next(t for t in env.tasks("train") if t.metadata["game"] == "cookingworld")
    trace = run_episode(task, harness, ScriptedPolicy(gold_responder([task])), env, max_steps=40)
    assert trace.error is None and trace.passed and trace.reward == 1.0
    assert trace.stop_reason == "env_done" and len(trace.tool_calls) == len(task.answer)


def test_more_episodes_than_jvms():
    """Every episode's session is open at once; with one JVM they take turns and replay."""
    before = java_children()
    with TWXEnv(games=["mapreader", "sorting", "twc"], n_per_game=1, max_workers=1) as env:
        tasks = env.tasks("val")
        a, b = env.reset(tasks[0]), env.reset(tasks[0])  # interleaved play of the same game
        for x, y in zip(tasks[0].answer, tasks[0].answer, strict=True):
            a.call_tool("act", {"command": x})
            b.call_tool("act", {"command": y})
        assert a.verify(None).passed and b.verify(None).passed
        harness = base_harness().set_param("step_budget", "max_steps", 40)
        traces = run_episodes(
            [Job(t, harness) for t in tasks], ScriptedPolicy(gold_responder(tasks)), env, max_steps=40, workers=4
        )
        assert [t.passed for t in traces] == [True] * 3, [t.error for t in traces]
        assert len(java_children() - before) == 1
    assert java_children() == before
