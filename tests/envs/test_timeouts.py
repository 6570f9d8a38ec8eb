"""Timeouts that end the work they bound: ``RESET_TIMEOUT_S`` and ``TOOL_TIMEOUT_S``
(``coevo.agent.episode``, the defaults of every rollout path). An env whose session talks to a line-protocol simulator
(``coevo.envs.line_process.LineProcess``) has the simulator killed at the deadline, and the next
call gets a fresh process and its own reply, never the stale reply of the call that timed out.
In-process work cannot be stopped: it is abandoned, and a session a late reset returns is closed.
Without them a reset could hang for good, and a timed-out tool's thread would keep reading the
simulator's pipe."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import psutil
import pytest

from coevo.agent import ScriptedPolicy, run_episode
from coevo.agent.rollouts import RolloutService
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.envs.line_process import LineProcess
from coevo.harness import events as ev
from coevo.harness.defaults import base_harness

SIMULATOR = """
import sys, time
for line in sys.stdin:
    request = line.strip()
    if request.startswith("sleep "):
        time.sleep(float(request.split()[1]))
    print("reply:" + request, flush=True)
"""
SAY = ev.ToolSpec("say", "send one line to the simulator",
                  {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})


def gone(pid: int) -> bool:
    """The process has exited and been reaped (a zombie would still hold the pid)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class LineSession(EnvSession):
    """A session holding one simulator: its first reply is the observation; ``say`` asks it a line."""

    def __init__(self, task: Task) -> None:
        self.task, self.done, self.tools = task, False, {"say": SAY}
        self.sim = LineProcess([sys.executable, "-c", SIMULATOR])
        self.observation = self.sim.ask(task.metadata["first"])
        self.pids = [self.sim.pid]  # the process that gave each reply

    def call_tool(self, name: str, arguments: dict) -> ev.ToolResult:
        reply = self.sim.ask(arguments["text"])
        self.pids.append(self.sim.pid)
        return ev.ToolResult(reply)

    def verify(self, answer: str | None) -> Score:
        return Score(float(answer == "ok"), answer == "ok")

    def close(self) -> None:
        self.sim.close()


class LineEnv(Env):
    name = "line"

    def __init__(self, first: str = "hello") -> None:
        self.first = first
        self.sessions: list[LineSession] = []

    def tasks(self, split: str) -> list[Task]:
        return [Task("t0", "line", "talk", split, answer="ok", metadata={"first": self.first})]

    def reset(self, task: Task) -> LineSession:
        session = LineSession(task)
        self.sessions.append(session)
        return session


def test_a_timed_out_tool_call_kills_its_simulator_and_the_next_call_gets_a_fresh_correct_reply():
    env = LineEnv()
    seen: dict[str, object] = {}

    def respond(messages):
        tools = [m for m in messages if m["role"] == "tool"]
        if not tools:
            return '<tool_call>{"name": "say", "arguments": {"text": "sleep 5"}}</tool_call>'
        if len(tools) == 1:  # the first call timed out: its simulator must already be gone
            seen["first_pid_gone"] = gone(env.sessions[0].pids[0])
            return '<tool_call>{"name": "say", "arguments": {"text": "hello again"}}</tool_call>'
        return "<answer>ok</answer>"

    service = RolloutService(ScriptedPolicy(respond), env, batch_size=1, max_steps=4, workers=1, seed=0,
                             tool_timeout_s=0.5)  # the harness's tool_timeout says 10 s: the config caps it
    start = time.monotonic()
    trace = service.run(base_harness(), env.tasks("test"), attempts=1, phase=None).traces[0]
    assert time.monotonic() - start < 4  # the 5 s sleep was not waited for
    assert trace.error is None and trace.passed
    assert trace.tool_calls[0].error == "tool timed out after 0.5 s"
    assert seen["first_pid_gone"] is True
    assert trace.tool_calls[1].output == "reply:hello again"  # not the stale "reply:sleep 5"
    session = env.sessions[0]
    assert session.sim.starts == 2 and session.pids[1] != session.pids[0]
    assert all(gone(pid) for pid in session.pids)  # the episode closed the second one


def test_a_reset_past_its_timeout_fails_the_episode_and_kills_the_simulator():
    env = LineEnv(first="sleep 5")
    pids: list[int] = []
    original = LineProcess._start

    def start(self):  # note every simulator started, to look for it afterwards
        original(self)
        pids.append(self.pid)

    policy = ScriptedPolicy(lambda messages: "<answer>ok</answer>")
    start_time = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LineProcess, "_start", start)
        trace = run_episode(env.tasks("test")[0], base_harness(), policy, env, reset_timeout_s=0.5)
    assert time.monotonic() - start_time < 4
    assert trace.error == "env reset: DeadlineExceeded: reset timed out after 0.5 s"
    assert trace.error_source == "env" and not trace.passed
    assert len(pids) == 1 and gone(pids[0])


@dataclass
class SlowSession(EnvSession):
    """An in-process session: nothing to kill."""

    closed: list[bool] = field(default_factory=list)
    observation: str = "go"
    done: bool = False
    tools: dict = field(default_factory=lambda: {"nap": ev.ToolSpec("nap", "sleeps in-process")})

    def call_tool(self, name, arguments):
        time.sleep(3)
        return ev.ToolResult("late")

    def verify(self, answer):
        return Score(0.0, False)

    def close(self):
        self.closed.append(True)


class SlowResetEnv(Env):
    name = "slow"

    def __init__(self) -> None:
        self.sessions: list[SlowSession] = []

    def tasks(self, split):
        return [Task("t0", "slow", "wait", split, answer="ok")]

    def reset(self, task):
        time.sleep(1.6)  # in-process: past the deadline and the grace period, then it returns
        self.sessions.append(SlowSession())
        return self.sessions[-1]


def test_in_process_work_is_abandoned_and_a_late_session_is_closed_when_it_arrives():
    env = SlowResetEnv()
    start = time.monotonic()
    trace = run_episode(env.tasks("test")[0], base_harness(), ScriptedPolicy(lambda m: "<answer>ok</answer>"), env,
                        reset_timeout_s=0.2)
    assert time.monotonic() - start < 1.5  # the deadline plus the grace period, not the whole reset
    assert trace.error == ("env reset: DeadlineExceeded: reset timed out after 0.2 s "
                           "(abandoned: in-process work cannot be stopped)")
    deadline = time.monotonic() + 5
    while not env.sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    assert env.sessions and env.sessions[0].closed == [True]


def test_the_deadlines_are_constants_every_rollout_path_defaults_to():
    """No config field sets them (a harness's ``tool_timeout`` processor sets shorter limits per tool):
    the episode, the runtime and the rollout service, which ``train.py`` builds, all default to them."""
    import inspect

    from coevo.agent import episode, rollouts, runtime

    assert episode.RESET_TIMEOUT_S == episode.TOOL_TIMEOUT_S == 60.0
    for fn in (episode.EpisodeRun.__init__, runtime.run_episodes, runtime.run_attempts,
               rollouts.RolloutService.__init__):
        params = inspect.signature(fn).parameters
        assert params["reset_timeout_s"].default == episode.RESET_TIMEOUT_S, fn
        assert params["tool_timeout_s"].default == episode.TOOL_TIMEOUT_S, fn


def test_a_textworld_step_past_its_deadline_kills_its_jvm_and_the_next_call_replays_on_a_fresh_one(monkeypatch):
    """A py4j call cannot be interrupted: the JVM under it is killed at the deadline, the session
    goes on, and its next command is played on a fresh JVM that replays the game so far."""
    pytest.importorskip("textworld_express")
    import shutil

    if shutil.which("java") is None:
        pytest.skip("TextWorld-Express needs java on PATH")
    from py4j.protocol import Py4JError
    from textworld_express import TextWorldExpressEnv

    from coevo.envs.deadline import DeadlineExceeded, deadline
    from coevo.envs.textworld_express import TWXEnv

    real_step = TextWorldExpressEnv.step

    def step(self, command):  # "hang" is a step the JVM never answers, until it is gone
        if command == "hang":
            while self._gateway.java_process.poll() is None:
                time.sleep(0.05)
            raise Py4JError("the JVM is gone")
        return real_step(self, command)

    monkeypatch.setattr(TextWorldExpressEnv, "step", step)
    with TWXEnv(games=["coin"], n_per_game=1, max_workers=1) as env:
        session = env.reset(env.tasks("train")[0])
        assert session.call_tool("act", {"command": "look around"}).error is None
        jvm = session._worker.process.pid
        start = time.monotonic()
        with deadline(time.monotonic() + 0.5), pytest.raises(DeadlineExceeded):
            session.call_tool("act", {"command": "hang"})
        assert time.monotonic() - start < 3 and gone(jvm) and not session.done
        result = session.call_tool("act", {"command": "look around"})
        assert result.error is None and session._history == ["look around", "look around"]
        assert session._worker.process.pid != jvm
