"""Countdown: reach a target from given numbers, combining two numbers per tool call.

The worked example of docs/environments.md, a complete coevo environment in one file: stable task ids and
``assign_split`` splits, a stateful multi-turn tool (``combine``), its own verifier, capability annotations,
gold actions (for reference trajectories) and a scripted solver. Used by config only (see the guide).
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.harness.events import Message, ToolCall, ToolResult, ToolSpec

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
ARGS = {"a": {"type": "integer"}, "op": {"type": "string", "enum": list(OPS)}, "b": {"type": "integer"}}
COMBINE = ToolSpec("combine", "Take the numbers a and b out of the pool and put `a op b` back (op: +, - or *); "
                   "returns the new pool.", {"type": "object", "properties": ARGS, "required": list(ARGS)})
PUZZLE = re.compile(r"Using the numbers ([\d, ]+) \(each at most once\).*?reach (\d+)\.")


def check_expression(text: str | None, numbers: list[int], target: int) -> str | None:
    """The verifier: None when ``text`` is an expression of + - * over ``numbers`` (each at most once)
    equal to ``target``, else why not. It reads only the answer, so no tool call can fake a pass."""
    try:
        tree = ast.parse((text or "").strip()[:200], mode="eval").body
    except SyntaxError:
        return "the answer is not an arithmetic expression"
    used: list[int] = []

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in AST_OPS:
            return OPS[AST_OPS[type(node.op)]](value(node.left), value(node.right))
        raise ValueError(f"{type(node).__name__} is not allowed (only integers, + - * and parentheses)")

    try:
        result = value(tree)
    except ValueError as err:
        return str(err)
    extra = Counter(used) - Counter(numbers)
    if extra:
        return f"uses numbers that were not given (or too often): {sorted(extra.elements())}"
    return None if result == target else f"the expression equals {result}, not {target}"


def solve(numbers: list[int], target: int) -> list[dict[str, Any]] | None:
    """Combine calls reaching ``target`` left to right over an order of ``numbers`` (as generated), or None."""
    for order in itertools.permutations(numbers):
        for ops in itertools.product(OPS, repeat=len(numbers) - 1):
            acc, steps = order[0], []
            for op, x in zip(ops, order[1:], strict=False):
                steps.append({"a": acc, "op": op, "b": x})
                acc = OPS[op](acc, x)
            if acc == target:
                return steps
    return None


@dataclass
class CountdownSession(EnvSession):
    task: Task
    observation: str
    pool: list[tuple[int, str]]  # (value, the expression that made it)
    tools: dict[str, ToolSpec] = field(default_factory=lambda: {"combine": COMBINE})
    done: bool = False

    def take(self, number: Any) -> tuple[int, str] | None:  # (value, expression) out of the pool, or None
        k = next((k for k, (v, _) in enumerate(self.pool) if v == number and type(number) is int), None)
        return None if k is None else self.pool.pop(k)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "combine":
            return ToolResult("", error=f"unknown tool {name!r}; the only tool is 'combine'")
        op, before = arguments.get("op"), list(self.pool)
        if op not in OPS:
            return ToolResult("", error=f"op must be one of {list(OPS)}, got {op!r}")
        a, b = self.take(arguments.get("a")), self.take(arguments.get("b"))
        if a is None or b is None:
            self.pool = before
            return ToolResult("", error=f"a and b must both be in the pool {[v for v, _ in before]}")
        self.pool.append((OPS[op](a[0], b[0]), f"({a[1]} {op} {b[1]})"))
        return ToolResult("pool: " + ", ".join(f"{v} = {e}" if e != str(v) else e for v, e in self.pool))

    def verify(self, answer: str | None) -> Score:
        why = check_expression(answer, list(self.task.metadata["numbers"]), self.task.metadata["target"])
        return Score(1.0 if why is None else 0.0, why is None, {"why": why or "reaches the target"})

    def close(self) -> None:
        pass


class CountdownEnv(Env):
    """``n_tasks`` puzzles of 3 or 4 numbers in [1, ``max_number``], generated from ``seed``."""

    name = "countdown"

    def __init__(self, n_tasks: int = 60, seed: int = 0, max_number: int = 9) -> None:
        if n_tasks < 1 or max_number < 2:
            raise ValueError(f"countdown needs n_tasks >= 1 and max_number >= 2, got {n_tasks} and {max_number}")
        rng, self._tasks = random.Random(seed), {}
        for _ in range(200 * n_tasks):
            numbers = [rng.randint(1, max_number) for _ in range(rng.choice((3, 4)))]
            acc, expr, gold = numbers[0], str(numbers[0]), []
            for x in numbers[1:]:
                op = rng.choice("+-*" if acc >= x else "+*")
                gold.append(ToolCall("combine", {"a": acc, "op": op, "b": x}))
                acc, expr = OPS[op](acc, x), f"({expr} {op} {x})"
            key = f"{sorted(numbers)}->{acc}"  # the id hashes the puzzle, so it is stable on every machine
            if key in self._tasks or acc in numbers:
                continue
            task_id = "countdown-" + hashlib.sha256(key.encode()).hexdigest()[:10]
            self._tasks[key] = Task(
                task_id=task_id, env=self.name, split=assign_split(task_id, seed), answer=expr[1:-1],
                instruction=f"Using the numbers {', '.join(map(str, numbers))} (each at most once) and + - *, "
                            f"reach {acc}. Answer with the expression, e.g. <answer>(1 + 2) * 3</answer>.",
                capabilities=("tool:combine", f"skill:countdown_{('three', 'four')[len(numbers) - 3]}_numbers"),
                gold_actions=tuple(gold), metadata={"numbers": numbers, "target": acc})
            if len(self._tasks) == n_tasks:
                return
        raise ValueError(f"countdown: only {len(self._tasks)} distinct puzzles with max_number={max_number}")

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks.values() if t.split == check_split(split)]

    def reset(self, task: Task) -> CountdownSession:
        return CountdownSession(task, task.instruction, [(n, str(n)) for n in task.metadata["numbers"]])

    @staticmethod
    def scripted_solver(messages: list[Message]) -> str:
        """``--model scripted``: search a solution, play it one combine call per turn, then answer."""
        puzzles = [m for msg in messages if msg.get("role") == "user" for m in PUZZLE.findall(msg["content"])]
        if not puzzles:
            return "I cannot find the puzzle."
        plan = solve([int(n) for n in puzzles[-1][0].split(",")], int(puzzles[-1][1])) or []
        results = [m["content"] for m in messages if m.get("role") == "tool" and m["content"].startswith("pool:")]
        if len(results) < len(plan):
            return f"<tool_call>{json.dumps({'name': 'combine', 'arguments': plan[len(results)]})}</tool_call>"
        return f"<answer>{results[-1].split(' = ', 1)[-1] if results else 'none'}</answer>"
