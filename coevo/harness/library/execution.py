"""Execution environment: where code runs and how long tool calls may take."""

from __future__ import annotations

from typing import Any

from coevo.harness.errors import ParamError
from coevo.harness.events import TaskStartEvent, ToolCallEvent, ToolResult, ToolSpec
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor
from coevo.safety.sandbox.python_tool import run_python


class PythonExecutor(Processor):
    kind = "python_executor"
    description = ("Offers a `python` tool that runs code in an isolated subprocess (a bubblewrap jail: no network, "
                   "no host files, no privileges) with time and memory limits.")
    hook = Hook.TASK_START
    dimension = Dimension.EXECUTION
    consumes = produces = TaskStartEvent
    params = (
        Param("timeout_s", "float", 5.0, "wall-clock limit per execution"),
        Param("memory_mb", "int", 256, "address-space limit of the subprocess"),
        Param("max_output_chars", "int", 2000, "stdout shown to the model"),
    )

    LIMITS = {"timeout_s": 60.0, "memory_mb": 4096, "max_output_chars": 100_000}
    """Upper bounds of the parameters: a proposal edits them, and must not buy itself unbounded time."""

    def __init__(self, name: str | None = None, **params: object) -> None:
        super().__init__(name, **params)
        for param, cap in self.LIMITS.items():
            if not 0 < self.config[param] <= cap:
                raise ParamError(self.name, f"parameter {param!r} must be in (0, {cap}], got {self.config[param]!r}")

    def provided_tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
        desc = "Run Python code and return what it prints (the value of a final expression is printed)."
        return [ToolSpec("python", desc, schema, provider=self.name)]

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        for spec in self.provided_tools():
            event.state.available_tools[spec.name] = spec
        return event

    def call_tool(self, call_name: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        if call_name != "python":
            return super().call_tool(call_name, arguments, timeout_s)
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("", error="python needs a string argument 'code'")
        res = run_python(
            code,
            timeout_s=min(timeout_s, self.config["timeout_s"]),
            memory_mb=self.config["memory_mb"],
            max_output_chars=self.config["max_output_chars"],
        )
        return ToolResult(res.stdout, error=res.error, seconds=res.seconds)


class ToolTimeout(Processor):
    kind = "tool_timeout"
    description = "Sets the wall-clock limit of each tool call, per tool name or by default."
    hook = Hook.BEFORE_TOOL
    dimension = Dimension.EXECUTION
    consumes = produces = ToolCallEvent
    group = "tool_timeout"
    params = (
        Param("default_s", "float", 10.0, "limit for tools not listed"),
        Param("per_tool", "dict", {}, "tool name -> seconds"),
    )

    def process(self, event: ToolCallEvent) -> ToolCallEvent:
        event.timeout_s = float(self.config["per_tool"].get(event.call.name, self.config["default_s"]))
        return event
