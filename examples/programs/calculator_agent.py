"""A small agent program that knows nothing of coevo: an OpenAI tool-calling loop with one tool.

It reads its task from standard input, talks to whatever ``OPENAI_BASE_URL`` names (coevo's
endpoint in ``env.name=program``), runs the ``calculator`` tool itself when the model calls it, and
prints its final answer as its last line. Several tool calls in one reply are answered in order.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys

from openai import OpenAI

SYSTEM = "You are a careful problem solver. Use the calculator, then give the final answer as <answer>...</answer>."
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_TURNS = 4


def calculator(expression: str) -> str:
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("only + - * of integers")
    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as err:
        return f"error: {err}"


def main() -> None:
    client = OpenAI()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sys.stdin.read()}]
    reply = ""
    for _ in range(MAX_TURNS):
        message = client.chat.completions.create(model="coevo", messages=messages, tools=TOOLS).choices[0].message
        reply = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            expression = str(json.loads(call.function.arguments).get("expression", ""))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(expression)})
    found = re.search(r"<answer>(.*?)(?:</answer>|$)", reply, re.DOTALL)
    print((found.group(1) if found else reply).strip().replace("\n", " "))


if __name__ == "__main__":
    main()
