"""A hand-built env with three tool capabilities and a scripted solver whose behaviour depends on
the harness, so every cell of a stream's pass matrix is known in advance.

Tasks ``What is add(a, b)?`` need ``tool:add`` (8 of them), ``mul`` (6), ``neg`` (4), and two
``What is 7?`` tasks need no tool. Even indices are train, odd ones val; tool tasks carry their
call as gold actions (so references can be built). By frequency the three
stages release add, then mul, then neg.

The solver (``solve``) calls the task's tool when the system message lists it and answers with the
result; it answers 0 (wrong) when the tool is not listed. Two weaknesses make the protocols differ:

- ``mul`` tasks are solved only when the task message starts with ``Use a tool:`` (what an
  ``instruction_template`` edit can add);
- with more than four tools listed it is "distracted" on ``add`` tasks and calls the last listed
  tool (a distractor) instead, then answers 0.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, check_split
from coevo.harness.events import Message, ToolCall, ToolResult, ToolSpec

OPS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "neg": lambda a, b: -a}
COUNTS = {"add": 8, "mul": 6, "neg": 4}
TEMPLATE = "Use a tool: {instruction}"


def spec(name: str) -> ToolSpec:
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    return ToolSpec(name, f"Apply {name} to the integers a and b.", {"type": "object", "properties": props})


def make_tasks() -> list[Task]:
    tasks = []
    for op, n in COUNTS.items():
        for i in range(n):
            a, b = i + 2, i + 5
            tasks.append(Task(f"{op}-{i}", "toolbox", f"What is {op}({a}, {b})?", "train" if i % 2 == 0 else "val",
                              OPS[op](a, b), capabilities=(f"tool:{op}", f"skill:{op}"),
                              gold_actions=(ToolCall(op, {"a": a, "b": b}),)))
    for i in range(2):
        tasks.append(Task(f"plain-{i}", "toolbox", "What is 7?", "train" if i % 2 == 0 else "val", 7))
    return tasks


@dataclass
class ToolboxSession(EnvSession):
    task: Task
    observation: str
    tools: dict[str, ToolSpec] = field(default_factory=lambda: {n: spec(n) for n in OPS})
    done: bool = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in OPS:
            return ToolResult("", error=f"unknown tool {name!r}")
        try:
            return ToolResult(str(OPS[name](int(arguments["a"]), int(arguments.get("b", 0)))))
        except (KeyError, TypeError, ValueError) as err:
            return ToolResult("", error=f"bad arguments: {err}")

    def verify(self, answer: str | None) -> Score:
        ok = answer is not None and answer.strip() == str(self.task.answer)
        return Score(1.0 if ok else 0.0, ok)

    def close(self) -> None:
        pass


class ToolboxEnv(Env):
    name = "toolbox"

    def __init__(self) -> None:
        self._tasks = make_tasks()

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> ToolboxSession:
        return ToolboxSession(task, task.instruction)


TASK_RE = re.compile(r"What is (?:(\w+)\((-?\d+), (-?\d+)\)|(\d+))\?")


def listed_tools(messages: list[Message]) -> list[str]:
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    return re.findall(r"^- (\w+): ", system, flags=re.MULTILINE)


def solve(messages: list[Message]) -> str:
    last = messages[-1]
    if last.get("role") == "tool":
        content = last.get("content", "")
        return "<answer>0</answer>" if content.startswith("Error") else f"<answer>{content.strip()}</answer>"
    user = next(m["content"] for m in messages if m.get("role") == "user")
    match = TASK_RE.search(user)
    if match is None:
        return "<answer>0</answer>"
    op, a, b, plain = match.groups()
    if plain is not None:
        return f"<answer>{plain}</answer>"
    tools = listed_tools(messages)
    if op not in tools or (op == "mul" and not user.startswith("Use a tool:")):
        return "<answer>0</answer>"
    name = tools[-1] if op == "add" and len(tools) > 4 else op
    return f"<tool_call>{json.dumps({'name': name, 'arguments': {'a': int(a), 'b': int(b)}})}</tool_call>"
