"""OpenAI chat-completions bodies read into coevo's messages and tools, and replies written back."""

from __future__ import annotations

import json

import pytest

from coevo.harness.events import ToolCall
from coevo.programs.chat_api import MalformedRequest, chat_completion, read_request

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds.",
                                           "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}}}]


def test_a_tool_calling_history_reads_as_the_messages_a_native_episode_holds():
    body = {"model": "m", "temperature": 0.5, "max_tokens": 32, "stop": "END", "tools": TOOLS, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be exact."}]},
        {"role": "user", "content": "2+3 and 4+5?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "9"},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]}
    req = read_request(body)
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert req.messages[0]["content"] == "Be exact."
    assert req.messages[2]["content"] == ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
                                          '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 5}}</tool_call>')
    assert [(m["name"], m["content"]) for m in req.messages[3:]] == [("add", "9"), ("add", "5")]
    assert list(req.tools) == ["add"] and req.tools["add"].provider == "program"
    assert (req.temperature, req.max_tokens, req.stop) == (0.5, 32, ["END"])


@pytest.mark.parametrize("body, says", [
    ([], "must be a JSON object"),
    ({"messages": []}, "non-empty 'messages'"),
    ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\]: role must be one of"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "'image_url' is not text"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
     "arguments of 'f' are not JSON"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, r"tools\[0\]"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "'temperature' must be"),
    (MalformedRequest("the request body is not JSON: boom"), "not JSON: boom"),
])
def test_a_body_coevo_cannot_read_says_what_is_wrong(body, says):
    with pytest.raises(MalformedRequest, match=says):
        read_request(body)


def test_several_tool_calls_in_one_reply_are_one_openai_turn():
    reply = ('Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
             '<tool_call>{"name": "x"}</tool_call>')
    out = chat_completion(reply, [ToolCall("add", {"a": 1}, "s0c0"), ToolCall("x", {}, "s0c1")], "stop", 7, 3, "m",
                          [-0.5, -0.25, 0.0])
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me add."
    calls = choice["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("s0c0", "add", {"a": 1}), ("s0c1", "x", {})]
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == [-0.5, -0.25, 0.0]
    plain = chat_completion("just text", [], "length", 1, 1, "m")["choices"][0]
    assert plain["finish_reason"] == "length" and plain["message"] == {"role": "assistant", "content": "just text"}
