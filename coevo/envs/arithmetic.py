"""A built-in arithmetic task set with a calculator tool: small, deterministic, dependency-free.

It exists so the runtime, the harness and the CLI can be exercised end to end on any machine
before the heavier environments (reasoning-gym, TextWorld-Express) are installed.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
import random
import re
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.base import Env, EnvSession, Score, Task, assign_split, check_split
from coevo.harness.events import Message, ToolCall, ToolResult, ToolSpec

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def safe_arithmetic(expression: str) -> int | float:
    """Evaluate + - * / // % ** on numbers and parentheses; anything else is a ValueError."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.replace("^", "**").replace("×", "*"), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            except OverflowError:
                raise ValueError("result too large") from None
            if (isinstance(value, int) and value.bit_length() > 256) or not math.isfinite(value):
                raise ValueError("result too large")
            return value
        raise ValueError(f"unsupported element {type(node).__name__}")

    return ev(tree.body)


def _last_number(answer: str | None) -> float | None:
    numbers = NUMBER_RE.findall(answer.replace(",", "")) if answer is not None else []
    return float(numbers[-1]) if numbers else None


def _same_number(answer: str | None, expected: int) -> bool:
    value = _last_number(answer)
    return value is not None and abs(value - expected) < 1e-6


def closeness(answer: str | None, expected: int, scale: float = 10.0) -> float:
    """Partial credit in [0, 1]: exp(-|answer - expected| / scale), 0 without a number."""
    value = _last_number(answer)
    return 0.0 if value is None else math.exp(-abs(value - expected) / scale)


CALCULATOR = ToolSpec(
    "calculator",
    "Evaluate an arithmetic expression with + - * / ** and parentheses.",
    {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


@dataclass
class ArithmeticSession(EnvSession):
    task: Task
    observation: str
    tools: dict[str, ToolSpec] = field(default_factory=lambda: {"calculator": CALCULATOR})
    done: bool = False
    partial_credit: bool = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "calculator":
            return ToolResult("", error=f"unknown tool {name!r}")
        expr = arguments.get("expression")
        if not isinstance(expr, str):
            return ToolResult("", error="calculator needs a string argument 'expression'")
        try:
            value = safe_arithmetic(expr)
        except ValueError as err:
            return ToolResult("", error=str(err))
        return ToolResult(str(int(value)) if float(value).is_integer() else f"{value:.6g}")

    def verify(self, answer: str | None) -> Score:
        ok = _same_number(answer, self.task.answer)
        reward = 1.0 if ok else (closeness(answer, self.task.answer) * 0.5 if self.partial_credit else 0.0)
        return Score(reward, ok, {"expected": self.task.answer})

    def close(self) -> None:
        pass


class ArithmeticEnv(Env):
    """``n_tasks`` expressions of 2 to ``max_terms`` integer terms in [2, ``max_operand``], generated
    from ``seed``. Small operands make answers a random guesser sometimes hits: smoke runs use that
    to get reward variance (and so a GRPO signal) from an untrained tiny model, as does
    ``partial_credit``: a wrong number earns up to 0.5 by its closeness (``passed`` stays exact)."""

    name = "arithmetic"

    def __init__(self, n_tasks: int = 60, max_terms: int = 4, seed: int = 0, max_operand: int = 99,
                 partial_credit: bool = False) -> None:
        if n_tasks < 1 or max_terms < 2 or max_operand < 2:
            raise ValueError("arithmetic env needs n_tasks >= 1, max_terms >= 2 and max_operand >= 2")
        distinct = (max_operand - 1) ** max_terms * 3 ** (max_terms - 1)
        if n_tasks > distinct // 2:
            raise ValueError(f"arithmetic env: {n_tasks} tasks asked, but max_terms={max_terms} and "
                             f"max_operand={max_operand} give too few distinct expressions ({distinct})")
        rng = random.Random(seed)
        self.partial_credit = partial_credit
        self._tasks: list[Task] = []
        seen: set[str] = set()
        while len(self._tasks) < n_tasks:
            terms = rng.randint(2, max_terms)
            expr = str(rng.randint(2, max_operand))
            for _ in range(terms - 1):
                expr += f" {rng.choice('+-*')} {rng.randint(2, max_operand)}"
            if expr in seen:
                continue
            seen.add(expr)
            task_id = "arith-" + hashlib.sha256(expr.encode()).hexdigest()[:10]
            self._tasks.append(
                Task(
                    task_id=task_id,
                    env=self.name,
                    instruction=f"What is {expr}?",
                    split=assign_split(task_id, seed),
                    answer=int(safe_arithmetic(expr)),
                    capabilities=("calculator",),
                    gold_actions=(ToolCall("calculator", {"expression": expr}),),
                    metadata={"terms": terms},
                )
            )

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> ArithmeticSession:
        return ArithmeticSession(task, observation=task.instruction, partial_credit=self.partial_credit)


def calculator_solver(messages: list[Message]) -> str:
    """A scripted agent for the arithmetic env: call the calculator on the expression in the task,
    then answer with its result. Used as the demo policy before a real model is configured."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool" and last.get("content") and not last["content"].startswith("Error"):
        return f"The calculator says {last['content']}.\n<answer>{last['content']}</answer>"
    task = next((m["content"] for m in messages if m.get("role") == "user"), "")
    match = re.search(r"What is ([-\d+*/() .]+)\?", task)
    if match is None:
        return "I cannot find an expression."
    expr = match.group(1).strip()
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
