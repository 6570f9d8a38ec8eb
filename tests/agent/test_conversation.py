"""Envs with several user turns (``EnvSession.respond``) and a bound on open sessions
(``Env.max_sessions``), replayed by GoldPolicy through the default harness."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from coevo.agent.gold import GoldPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.harness.defaults import base_harness
from coevo.harness.events import ToolCall, ToolResult, ToolSpec

COUNTER = ToolSpec("add", "Add n to the counter.", {"type": "object", "properties": {"n": {"type": "integer"}},
                                                    "required": ["n"]})


class Chat(EnvSession):
    """The user asks for additions in turns; after each reply the next turn comes, then nothing.
    Passed when the counter ends at the target and every turn got a reply."""

    def __init__(self, task: Task, env: "ChatEnv") -> None:
        self.task, self.env = task, env
        self.turns = list(task.metadata["user_turns"])
        self.observation = self.turns.pop(0)
        self.tools = {"add": COUNTER}
        self.done, self.counter, self.replies = False, 0, []
        with env.lock:
            env.open += 1
            env.peak = max(env.peak, env.open)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.counter += int(arguments["n"])
        return ToolResult(f"counter = {self.counter}")

    def respond(self, reply: str) -> str | None:
        self.replies.append(reply)
        return self.turns.pop(0) if self.turns else None

    def verify(self, answer: str | None) -> Score:
        ok = self.counter == self.task.answer and len(self.replies) == len(self.task.metadata["user_turns"])
        return Score(float(ok), ok)

    def close(self) -> None:
        with self.env.lock:
            self.env.open -= 1


class ChatEnv(Env):
    name = "chat"

    def __init__(self, max_sessions: int | None = None, broken: str | None = None) -> None:
        self.max_sessions, self.broken = max_sessions, broken
        self.lock, self.open, self.peak = threading.Lock(), 0, 0
        self._tasks = [Task(f"c{i}", "chat", "add", "val", 3 + i,
                            gold_actions=(ToolCall("add", {"n": 1}), ToolCall("add", {"n": 2 + i})),
                            metadata={"user_turns": ["Please add 1.", f"Now add {2 + i}."], "turn_calls": [1, 1],
                                      "gold_replies": ["added 1"]}) for i in range(6)]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> Chat:
        if task.task_id == self.broken:
            raise ConnectionError("simulator did not start")
        return Chat(task, self)


def run(env: ChatEnv, tasks: list[Task], batch_size: int = 32):
    return RolloutService(GoldPolicy(tasks), env, batch_size=batch_size, max_steps=8, workers=4, seed=0).run(
        base_harness(), env.tasks("val"), attempts=1, phase=None)


def test_a_conversation_goes_on_after_each_reply_until_the_user_is_done():
    env = ChatEnv()
    done = run(env, env.tasks("val"))
    assert done.pass_at_1 == 1.0
    for trace in done.traces:
        assert trace.replies == ["added 1"] and trace.final_answer == "done"
        users = [m["content"] for m in trace.messages if m["role"] == "user"]
        assert users[-2:] == ["Please add 1.", users[-1]] and users[-1].startswith("Now add")
        assert trace.stop_reason == "answer" and trace.cost["prompt_tokens"] > 0
    assert env.open == 0  # every session closed


def test_a_degraded_gold_conversation_fails():
    env = ChatEnv()
    broken = [dataclasses.replace(t, gold_actions=t.gold_actions[:1] + (ToolCall("add", {"n": 0}),))
              for t in env.tasks("val")]
    assert run(env, broken).pass_at_1 == 0.0


def test_an_env_bounds_its_open_sessions_and_a_failed_reset_stays_in_its_episode():
    env = ChatEnv(max_sessions=2, broken="c3")
    done = run(env, env.tasks("val"), batch_size=4)
    assert env.peak == 2 and env.open == 0
    by_id = {t.task_id: t for t in done.traces}
    assert by_id["c3"].error_source == "env" and "simulator did not start" in by_id["c3"].error
    assert all(t.passed for tid, t in by_id.items() if tid != "c3")
    unbounded = ChatEnv()
    run(unbounded, unbounded.tasks("val"))
    assert unbounded.peak == 6  # without max_sessions every episode starts at once


class OneMove(Chat):
    """A game won by its first action."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.done = True
        return super().call_tool(name, arguments)


def test_a_game_won_on_the_last_allowed_step_ends_as_won_not_cut():
    env = ChatEnv()
    env.reset = lambda task: OneMove(task, env)  # type: ignore[method-assign]
    h = base_harness().set_param("step_budget", "max_steps", 1)
    done = RolloutService(GoldPolicy(env.tasks("val")), env, batch_size=8, max_steps=1, workers=2, seed=0).run(
        h, env.tasks("val")[:2], attempts=1, phase=None)
    assert [t.stop_reason for t in done.traces] == ["env_done", "env_done"]
