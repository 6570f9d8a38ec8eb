"""OpenAI chat-completions bodies as coevo sees them, and coevo's replies as an OpenAI response.

A program reaches the model with a chat-completions request (``messages``, ``tools``, sampling
fields). coevo renders every conversation with its own chat template and tool format (the one
``json_tool_parser`` reads and ``tool_call_text`` writes), so the program's OpenAI-form history is
translated into the same messages a native episode holds: an assistant turn's ``tool_calls`` become
``<tool_call>`` blocks in its content, a ``tool`` turn keeps the tool's name. The model's reply goes
back in OpenAI form: the text outside tool-call blocks as ``content``, each parsed call as one of
``tool_calls`` (several calls in one reply are one turn, answered by the program in order).

A body coevo cannot read raises ``MalformedRequest`` with what is wrong; the episode that sent it
fails with that cause.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from coevo.harness.events import Message, ToolCall, ToolSpec
from coevo.harness.library.tools import TOOL_CALL_RE, tool_call_text

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
PROGRAM = "program"
"""The ``provider`` of a tool the program offers: the program runs it, never coevo."""


class MalformedRequest(ValueError):
    """A chat-completions body that does not say what to ask the model."""


@dataclass
class ProgramRequest:
    """One model request of a program, read: the conversation in coevo's form, the tools it offers,
    and the sampling fields it set (None where it set none)."""

    messages: list[Message]
    tools: dict[str, ToolSpec]
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    model: str = ""


def _text(content: object, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MalformedRequest(f"{where}: content part of type {kind!r} is not text (coevo's model reads text)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise MalformedRequest(f"{where}: content must be a string or a list of parts, got {type(content).__name__}")


def _call(raw: object, where: str) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise MalformedRequest(f"{where}: a tool call needs a 'function' object")
    fn = raw["function"]
    name, arguments = fn.get("name"), fn.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise MalformedRequest(f"{where}: a tool call needs a function name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as err:
            raise MalformedRequest(f"{where}: arguments of {name!r} are not JSON: {err}") from None
    if not isinstance(arguments, dict):
        raise MalformedRequest(f"{where}: arguments of {name!r} must be a JSON object")
    return ToolCall(name, arguments, str(raw.get("id", "")))


def _tool(raw: object, k: int) -> ToolSpec:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise MalformedRequest(f"tools[{k}]: a tool needs type 'function' and a function with a name")
    parameters = fn.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise MalformedRequest(f"tools[{k}]: parameters of {fn['name']!r} must be a JSON schema object")
    return ToolSpec(fn["name"], str(fn.get("description") or ""), parameters, provider=PROGRAM)


def read_request(body: object) -> ProgramRequest:
    """``body`` (a chat-completions request) in coevo's form; ``MalformedRequest`` says what is wrong."""
    if isinstance(body, MalformedRequest):  # the transport could not even read it
        raise body
    if not isinstance(body, dict):
        raise MalformedRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise MalformedRequest("the request needs a non-empty 'messages' list")
    tools = [_tool(t, k) for k, t in enumerate(body.get("tools") or [])]
    names: dict[str, str] = {}  # tool call id -> tool name, for the tool turns that answer it
    messages: list[Message] = []
    for k, m in enumerate(raw_messages):
        where = f"messages[{k}]"
        role = ROLES.get(str(m.get("role"))) if isinstance(m, dict) else None
        if role is None:
            raise MalformedRequest(f"{where}: role must be one of {sorted(ROLES)}")
        text = _text(m.get("content"), where)
        if role == "assistant" and m.get("tool_calls"):
            calls = [_call(c, f"{where}.tool_calls") for c in m["tool_calls"]]
            names.update({c.call_id: c.name for c in calls})
            text = "\n".join([*([text] if text else []), *(tool_call_text(c) for c in calls)])
        if role == "tool":
            name = m.get("name") or names.get(str(m.get("tool_call_id", "")), "tool")
            messages.append({"role": "tool", "name": name, "content": text})
        else:
            messages.append({"role": role, "content": text})
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise MalformedRequest("'stop' must be a string or a list of strings")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    for key, value in (("temperature", body.get("temperature")), ("top_p", body.get("top_p")),
                       ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise MalformedRequest(f"{key!r} must be a non-negative number, got {value!r}")
    return ProgramRequest(messages, {t.name: t for t in tools}, body.get("temperature"), body.get("top_p"),
                          None if max_tokens is None else int(max_tokens), stop, str(body.get("model") or ""))


def reply_content(reply: str, calls: list[ToolCall]) -> str:
    """The reply's text without its tool-call blocks (what OpenAI puts in ``content`` beside ``tool_calls``)."""
    return TOOL_CALL_RE.sub("", reply).strip() if calls else reply


def chat_completion(reply: str, calls: list[ToolCall], finish_reason: str, prompt_tokens: int,
                    completion_tokens: int, model: str, logprobs: list[float] | None = None) -> dict[str, Any]:
    """A chat-completions response for one reply: ``tool_calls`` in OpenAI form (ids kept from the
    parse, arguments JSON-encoded) and ``finish_reason`` ``tool_calls`` when there are any."""
    tool_calls = [{"id": c.call_id or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                   "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                  for c in calls]
    message: dict[str, Any] = {"role": "assistant", "content": reply_content(reply, calls) or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "finish_reason": "tool_calls" if tool_calls else finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "", "logprob": lp, "top_logprobs": []} for lp in logprobs]}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
