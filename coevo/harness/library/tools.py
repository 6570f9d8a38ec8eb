"""Tool ecosystem: which tools the agent has, how they are described, how calls are parsed."""

from __future__ import annotations

import json
import re
from typing import Any

from coevo.harness.errors import ParamError
from coevo.harness.events import (
    ModelOutputEvent,
    ModelRequestEvent,
    ParsedOutputEvent,
    TaskStartEvent,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSpec,
    harness_note,
)
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor

TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
"""A tool name ``tool_choice`` may force: it is written into a JSON string unescaped."""

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
ANSWER_BLOCK_RE = re.compile(r"<answer>.*?(?:</answer>|$)", re.DOTALL)
"""An answer block (closed, or cut off at the end of a completion): JSON in it is an answer, never a call."""

DEFAULT_HINT = (
    "You can call these tools:\n{tools}\n"
    "To call a tool, write exactly:\n"
    '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>\n'
    "and wait for its result."
)


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object embedded in ``text`` (a lenient scan for small models)."""
    decoder = json.JSONDecoder()
    found, i = [], text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        found.append(obj)
        i = text.find("{", end)
    return found


def _as_call(obj: object) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models JSON-encode the arguments twice
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


class ToolRegistry(Processor):
    kind = "tool_registry"
    description = "Enables a subset of the tools the environment and harness offer ('*' enables all)."
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = TaskStartEvent
    group = "tool_registry"
    runs_after = frozenset({"python_executor"})  # tool providers register before the registry filters
    params = (Param("enabled", "str_list", ["*"], "tool names to enable, or ['*']"),)

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        enabled = self.config["enabled"]
        offered = event.state.available_tools
        names = list(offered) if "*" in enabled else [n for n in enabled if n in offered]
        event.state.tools = {n: offered[n] for n in names}
        return event


def tool_hint_line(spec: ToolSpec) -> str:
    """One tool in the hint: name, description, the arguments' schemas, the arguments the schema
    does not require (``; optional: a, b``) and the result's schema when the tool has one
    (``. Returns: {...}``). Arguments are required unless listed as optional."""
    properties = (spec.parameters or {}).get("properties", {}) or {}
    required = set((spec.parameters or {}).get("required") or ())
    optional = [k for k in properties if k not in required]
    line = f"- {spec.name}: {spec.description} Arguments: {json.dumps(properties)}"
    line += f"; optional: {', '.join(optional)}" if optional else ""
    return line + (f". Returns: {json.dumps(spec.returns)}" if spec.returns else "")


def sentences(text: str) -> list[str]:
    """``text``'s sentences, each without its final period."""
    return [x.rstrip(".") for x in re.split(r"(?<=[.!?])\s+", text.strip()) if x.strip()]


def compact_listing(specs: list[ToolSpec]) -> list[str]:
    """Each tool in a few tokens: ``- name(a, b, c?): sentence`` (``?`` marks an optional argument),
    for tool sets whose full schemas would fill the context window. The sentence is the first of the
    tool's description that no other tool of the listing also has: benchmark tool sets open every
    description of a class with the same boilerplate ("This tool belongs to the Message API, ..."),
    and a first sentence shared by all of them would leave the tools told apart by name alone. A
    description with no sentence of its own keeps its first."""
    said = [sentences(spec.description) for spec in specs]
    counts: dict[str, int] = {}
    for own in said:
        for sentence in set(own):
            counts[sentence] = counts.get(sentence, 0) + 1
    lines = []
    for spec, own in zip(specs, said, strict=True):
        properties = (spec.parameters or {}).get("properties", {}) or {}
        required = set((spec.parameters or {}).get("required") or ())
        args = ", ".join(k if k in required else f"{k}?" for k in properties)
        telling = next((x for x in own if counts[x] == 1), own[0] if own else "")
        lines.append(f"- {spec.name}({args}): {telling}")
    return lines


class ToolSchemaHint(Processor):
    kind = "tool_schema_hint"
    description = (
        "Appends the enabled tools' names, descriptions and argument schemas (naming the optional "
        "arguments; the others are required), and the call format, to the system message."
    )
    hook = Hook.TASK_START
    dimension = Dimension.TOOLS
    consumes = produces = TaskStartEvent
    runs_after = frozenset({"system_prompt", "tool_registry"})
    params = (Param("template", "prompt", DEFAULT_HINT, "{tools} is replaced by one line per tool with its JSON "
                    "schema; {tools_compact} by one short line per tool (name, argument names, the first sentence "
                    "of its description no other tool shares): for tool sets whose schemas would fill the context"),)

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        tools = event.state.tools
        if not tools:
            return event
        hint = self.config["template"]
        if "{tools_compact}" in hint:
            hint = hint.replace("{tools_compact}", "\n".join(compact_listing(list(tools.values()))))
        if "{tools}" in hint:
            hint = hint.replace("{tools}", "\n".join(tool_hint_line(t) for t in tools.values()))
        msgs = event.state.messages
        if msgs and msgs[0].get("role") == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + hint}
        else:
            msgs.insert(0, {"role": "system", "content": hint})
        return event


def tool_call_text(call: ToolCall) -> str:
    """A tool call in the format the base harness teaches and ``json_tool_parser`` parses (what a
    worked demonstration or a scripted policy writes)."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>{payload}</tool_call>"


class JsonToolCallParser(Processor):
    kind = "json_tool_parser"
    description = (
        'Parses <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks from a completion; '
        "lenient mode also accepts a bare JSON object with name and arguments (never one inside "
        "<answer>...</answer>: an answer is not a tool call). Calls beyond max_calls are dropped, and "
        "the model is told which (a followup message; the event log's parse_error says so too)."
    )
    hook = Hook.AFTER_MODEL
    dimension = Dimension.TOOLS
    consumes = ModelOutputEvent
    produces = ParsedOutputEvent
    group = "action_parser"
    params = (
        Param("max_calls", "int", 4, "tool calls honoured per completion (the rest are dropped, and the model told)"),
        Param("lenient", "bool", True, "accept bare JSON objects outside <tool_call> tags and <answer> blocks"),
    )

    def process(self, event: ModelOutputEvent) -> ParsedOutputEvent:
        calls: list[ToolCall] = []
        error = None
        blocks = TOOL_CALL_RE.findall(event.text)
        for block in blocks:
            objs = _json_objects(block)
            call = _as_call(objs[0]) if objs else None
            if call is None:
                error = f"could not parse tool call: {block[:80]!r}"
            else:
                calls.append(call)
        if not blocks and self.config["lenient"]:
            outside_answers = ANSWER_BLOCK_RE.sub(" ", event.text)
            calls = [c for c in map(_as_call, _json_objects(outside_answers)) if c is not None]
        followup = []
        limit = self.config["max_calls"]
        if len(calls) > limit:
            dropped = calls[limit:]
            names = ", ".join(c.name for c in dropped)
            note = (f"dropped {len(dropped)} tool call(s) beyond max_calls={limit}: {names}")
            error = f"{error}; {note}" if error else note
            followup.append(harness_note(
                f"Only the first {limit} of your {len(calls)} tool calls were run; the other "
                f"{len(dropped)} ({names}) were not. Call them again in your next reply if you still need them."))
            calls = calls[:limit]
        for k, c in enumerate(calls):
            c.call_id = f"s{event.state.step}c{k}"
        names = ("state", "text", "finish_reason", "call_index", "trainable", "loss_weight")
        fields = {k: getattr(event, k) for k in names}
        return ParsedOutputEvent(**fields, tool_calls=calls, parse_error=error, followup=followup)


class ToolWhitelist(Processor):
    kind = "tool_whitelist"
    description = "Refuses calls to tools outside an allowed list, answering the model with the list instead."
    hook = Hook.BEFORE_TOOL
    dimension = Dimension.TOOLS
    consumes = produces = ToolCallEvent
    params = (Param("allowed", "str_list", [], "allowed tool names; empty means the enabled tools"),)

    def process(self, event: ToolCallEvent) -> ToolCallEvent:
        allowed = self.config["allowed"] or list(event.state.tools)
        if event.call.name not in allowed:
            event.result = ToolResult("", error=f"tool {event.call.name!r} is not allowed; use one of {allowed}")
        return event


def forced_call_prefix(tool: str = "", spec: ToolSpec | None = None) -> str:
    """The start of a tool call in the format ``json_tool_parser`` reads (``tool_call_text`` writes
    whole ones): for any tool, up to the opening quote of the
    name; for a named tool, up to its arguments object, and when ``spec`` shows a single argument,
    up to that argument's value (its opening quote for a string). SmolLM2-135M forced only to the
    arguments object invented argument names ({"operation": "add", ...}) in most calls; given the
    key, it copies the expression from the task."""
    if not tool:
        return '<tool_call>{"name": "'
    prefix = '<tool_call>{"name": ' + json.dumps(tool) + ', "arguments": {'
    properties = ((spec.parameters if spec is not None else {}) or {}).get("properties") or {}
    if len(properties) == 1:
        (key, schema), = properties.items()
        prefix += json.dumps(key) + ": " + ('"' if (schema or {}).get("type") == "string" else "")
    return prefix


class ToolChoice(Processor):
    kind = "tool_choice"
    description = (
        "Forces a tool call, as an API's tool_choice='required' or a named tool does: on the first "
        "model calls of an episode it prefills the reply with the start of a <tool_call> (naming the "
        "tool, or leaving the name to the model), so the model writes the call's arguments instead "
        "of answering directly; later calls are free, so the model can answer from the result."
    )
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.TOOLS
    consumes = produces = ModelRequestEvent
    group = "reply_prefix"  # one processor decides how the reply starts
    params = (
        Param("tool", "str", "", "the tool to call; '' lets the model choose any enabled tool"),
        Param("steps", "int", 1, "model calls of an episode that are forced (the first N)"),
    )

    def __init__(self, name: str | None = None, **params):
        super().__init__(name, **params)
        tool, steps = self.config["tool"], self.config["steps"]
        if tool and TOOL_NAME_RE.fullmatch(tool) is None:
            raise ParamError(self.name, f"parameter 'tool' must be a tool name (letters, digits, _ . -) or '' for "
                                        f"any tool, got {tool!r}")
        if steps < 1:
            raise ParamError(self.name, f"parameter 'steps' must be >= 1 (model calls to force), got {steps}")

    def process(self, event: ModelRequestEvent) -> ModelRequestEvent:
        state, tool = event.state, self.config["tool"]
        if state.step >= self.config["steps"]:
            return event
        if (tool and tool in state.tools) or (not tool and state.tools):
            event.reply_prefix = forced_call_prefix(tool, state.tools.get(tool))
        return event
