"""A text-action simulator in its own process, with its own splits (docs/environments.md, worked
example 2).

The simulator (``SIM_SOURCE``) is a tiny room puzzle: a lamp, a box, a drawer, a rug and a locked
door. It runs as a separate Python process per session, the way a JVM or C++ simulator would: one
JSON line in to load a variation, then one command per line in and one JSON line out
(``{"observation": ..., "done": ...}``); ``__score__`` asks for its score (0-100). The agent acts
through a single tool, ``act(command)``; the simulator's own score decides ``verify``. Tasks and
splits are the benchmark's own lists (train / dev / test; dev is coevo's ``val``), not hashed.

    PYTHONPATH=. coevo eval --env examples.text_sim_env:TextSimEnv --model gold --split val \\
        --max-steps 12      # also raises the harness's step budget (6) to 12
"""

from __future__ import annotations

import json
import sys
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, check_split
from coevo.envs.line_process import LineProcess
from coevo.harness.events import ToolCall, ToolResult, ToolSpec

SIM_SOURCE = r'''
import json, sys
s = json.loads(sys.stdin.readline())  # the variation: {"goal": "open" | "leave", "key": "box" | ..., "dark": bool}
s.update(lit=not s["dark"], box="closed", drawer="closed", rug="flat", door="locked", found=False, held=False,
         outside=False)
HELP = "Commands: look, turn on lamp, open box, open drawer, lift rug, take key, unlock door, open door, go north."

def look():
    if not s["lit"]:
        return "It is pitch dark. You feel a lamp switch by your hand."
    key = " A brass key lies here." if s["found"] and not s["held"] else ""
    return (f"A small room with a lamp, a box ({s['box']}), a drawer ({s['drawer']}), a rug ({s['rug']}) and a "
            f"{s['door']} door to the north.{key}")

def step(cmd):
    if cmd == "look":
        return look()
    if cmd == "turn on lamp":
        s["lit"] = True
        return "The lamp is on. " + look()
    if not s["lit"]:
        return "It is too dark to do that."
    if cmd in ("open box", "open drawer", "lift rug"):
        thing = cmd.split()[1]
        s[thing] = "lifted" if thing == "rug" else "open"
        if s["key"] == thing and not s["found"]:
            s["found"] = True
            return f"You {cmd.split()[0]} the {thing}. There is a brass key!"
        return f"You {cmd.split()[0]} the {thing}. Nothing there."
    if cmd == "take key":
        if not s["found"] or s["held"]:
            return "You see no key here."
        s["held"] = True
        return "Taken: brass key."
    if cmd == "unlock door":
        if not s["held"] or s["door"] != "locked":
            return "You need a key, and a locked door."
        s["door"] = "closed"
        return "Click. The door is unlocked."
    if cmd == "open door":
        if s["door"] == "locked":
            return "The door is locked."
        s["door"] = "open"
        return "The door swings open."
    if cmd == "go north" and s["door"] == "open":
        s["outside"] = True
        return "You step out into the garden."
    return "You can't do that. " + HELP

def score():
    marks = [s["lit"], s["found"], s["held"], s["door"] != "locked", s["door"] == "open"]
    marks += [s["outside"]] if s["goal"] == "leave" else []
    return round(100 * sum(marks) / len(marks))

print(json.dumps({"observation": look() + " " + HELP, "done": False}))
for line in sys.stdin:
    cmd = " ".join(line.lower().split())
    if cmd == "__score__":
        print(json.dumps({"score": score(), "done": score() == 100}))
    else:
        obs = step(cmd)
        print(json.dumps({"observation": obs, "done": score() == 100}))
'''

# the benchmark's own variations and splits (names, not hashes): goal-keyplace-light
TRAIN = ["open-box-lit", "open-drawer-dark", "open-rug-lit", "leave-box-lit", "leave-drawer-lit", "leave-rug-dark"]
DEV = ["open-box-dark", "leave-drawer-dark", "leave-rug-lit"]
TEST = ["open-drawer-lit", "open-rug-dark", "leave-box-dark"]
SPLIT_LISTS = {"train": TRAIN, "val": DEV, "test": TEST}  # coevo calls dev "val"
GOALS = {"open": "Open the door of the room.", "leave": "Get out of the room through the north door."}
ACT = ToolSpec("act", "Send one command to the simulator; returns what you observe.",
               {"type": "object", "properties": {"command": {"type": "string", "description": "e.g. open box"}},
                "required": ["command"]})


def gold_commands(goal: str, key: str, dark: bool) -> list[str]:
    """The benchmark's gold path: the way the published trajectories start (look), then the solution."""
    first = {"box": "open box", "drawer": "open drawer", "rug": "lift rug"}[key]
    path = ["look"] + (["turn on lamp"] if dark else []) + [first, "take key", "unlock door", "open door"]
    return path + (["go north"] if goal == "leave" else [])


class SimSession(EnvSession):
    tools = {"act": ACT}

    def __init__(self, task: Task) -> None:
        self.task, self.done = task, False
        self.proc = LineProcess([sys.executable, "-u", "-c", SIM_SOURCE])  # started by the first line sent
        self.sent: list[str] = []  # every line that changed the game, to replay into a fresh simulator

    def start(self) -> None:
        first = self._send(json.dumps(self.task.metadata["variation"]))
        self.observation = f"{self.task.instruction}\n\n{first['observation']}"

    def _send(self, line: str) -> dict[str, Any]:
        if self.proc.pid is None and self.sent:  # killed at a deadline: a fresh simulator, the game replayed
            for old in self.sent:
                self.proc.ask(old)
        reply = json.loads(self.proc.ask(line))  # within the runtime's deadline, else killed and raised
        if line != "__score__":
            self.sent.append(line)
        return reply

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command")
        if name != "act":
            return ToolResult("", error=f"unknown tool {name!r}; the only tool is 'act'")
        if not isinstance(command, str) or not command.strip() or "\n" in command or command.startswith("__"):
            return ToolResult("", error="act needs one command, e.g. {\"command\": \"look\"}")
        reply = self._send(command.strip())
        self.done = bool(reply["done"])  # the simulator says the game is won: the episode ends
        return ToolResult(reply["observation"])

    def verify(self, answer: str | None) -> Score:
        """The simulator's own score decides; the answer text is not read."""
        score = self._send("__score__")["score"]
        return Score(score / 100, score == 100, {"score": score})

    def close(self) -> None:
        self.proc.kill()


class TextSimEnv(Env):
    name = "text_sim"
    max_sessions = 4  # at most four simulator processes at once; the runtime starts episodes as others end

    def tasks(self, split: str) -> list[Task]:
        return [self._task(variation, split) for variation in SPLIT_LISTS[check_split(split)]]

    def _task(self, name: str, split: str) -> Task:
        goal, key, light = name.split("-")
        commands = gold_commands(goal, key, light == "dark")
        return Task(task_id=f"room-{name}", env=self.name, split=split, answer="score 100",
                    instruction=f"{GOALS[goal]} Act with the tool act(command), one command at a time.",
                    capabilities=("tool:act", f"skill:room_{goal}"),
                    gold_actions=tuple(ToolCall("act", {"command": c}) for c in commands),
                    metadata={"variation": {"goal": goal, "key": key, "dark": light == "dark"}})

    def reset(self, task: Task) -> SimSession:
        session = SimSession(task)
        try:
            session.start()
        except BaseException:
            session.close()  # the runtime never gets this session, so nobody else would close it
            raise
        return session
