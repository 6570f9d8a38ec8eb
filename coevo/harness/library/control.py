"""Control and safety: budgets, loops, malformed replies and dangerous tool arguments."""

from __future__ import annotations

import json
import re

from coevo.harness.errors import ParamError
from coevo.harness.events import ParsedOutputEvent, StepEndEvent, ToolCallEvent, ToolResult, harness_note
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor

CONSECUTIVE_PARSE_FAILURES = "consecutive_parse_failures"  # state.memory key kept by ParseRetry


class StepBudget(Processor):
    kind = "step_budget"
    description = "Ends the episode after a fixed number of agent steps."
    hook = Hook.STEP_END
    dimension = Dimension.CONTROL
    consumes = produces = StepEndEvent
    group = "step_budget"
    params = (Param("max_steps", "int", 6, "agent steps (model calls) per episode"),)

    def __init__(self, name: str | None = None, **params: object) -> None:
        super().__init__(name, **params)
        if self.config["max_steps"] < 1:  # an episode takes at least one step, so 0 or less would silently mean 1
            raise ParamError(self.name, f"parameter 'max_steps' must be >= 1 (agent steps per episode), "
                                        f"got {self.config['max_steps']}")

    def process(self, event: StepEndEvent) -> StepEndEvent:
        if event.state.step + 1 >= self.config["max_steps"]:
            event.state.stop("step_budget")
        return event


class LoopDetection(Processor):
    kind = "loop_detection"
    description = (
        "Detects the same step repeated N times in a row (the same actions with the same tool results); "
        "stops the episode or warns the model. A repeated call whose result changed (polling, waiting "
        "in a simulator) is progress, not a loop, and each new user turn starts a fresh count (the same "
        "short reply to different user messages is a conversation)."
    )
    hook = Hook.STEP_END
    dimension = Dimension.CONTROL
    consumes = produces = StepEndEvent
    params = (
        Param("window", "int", 3, "identical consecutive steps (same actions, same results) that count as a loop"),
        Param("action", "str", "stop", "what to do on a loop", choices=("stop", "warn")),
    )
    HISTORY = "loop_detection_history"
    TURN = "loop_detection_turn"  # the user turn the history belongs to (replies given so far)

    @staticmethod
    def step_results(messages: list) -> list[str]:
        """The tool results the step showed the model: the tool turns after its assistant turn."""
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
        if last is None:
            return []
        return [str(m.get("content", "")) for m in messages[last + 1:] if m.get("role") == "tool"]

    def process(self, event: StepEndEvent) -> StepEndEvent:
        memory, turn = event.state.memory, len(event.state.replies)
        if memory.get(self.TURN) != turn:  # a new user turn: the same reply to another message is no loop
            memory[self.TURN], memory[self.HISTORY] = turn, []
        history = memory[self.HISTORY]
        history.append(json.dumps([event.actions, self.step_results(event.state.messages)], sort_keys=True))
        window = self.config["window"]
        if len(history) >= window and len(set(history[-window:])) == 1 and event.actions:
            if self.config["action"] == "stop":
                event.state.stop("loop")
            else:
                event.state.messages.append(harness_note("You are repeating the same action. Try something different."))
        return event


class ParseRetry(Processor):
    kind = "parse_retry"
    description = (
        "When a completion has neither a tool call nor an answer, asks the model again with a format "
        "reminder, up to N times in a row; counts consecutive failures for other processors."
    )
    hook = Hook.AFTER_MODEL
    dimension = Dimension.CONTROL
    consumes = produces = ParsedOutputEvent
    runs_after = frozenset({"answer_extraction", "self_verification", "token_annotation"})
    params = (
        Param("max_retries", "int", 2, "consecutive reminders before giving up"),
        Param(
            "message",
            "prompt",
            "I could not find a tool call or a final answer in your reply. Call a tool with "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call> or answer with <answer>...</answer>.',
            "the reminder",
        ),
    )

    def process(self, event: ParsedOutputEvent) -> ParsedOutputEvent:
        memory = event.state.memory
        if event.tool_calls or event.answer is not None or event.followup:
            memory[CONSECUTIVE_PARSE_FAILURES] = 0
            return event
        failures = memory.get(CONSECUTIVE_PARSE_FAILURES, 0) + 1
        memory[CONSECUTIVE_PARSE_FAILURES] = failures
        if failures <= self.config["max_retries"]:
            reason = f" ({event.parse_error})" if event.parse_error else ""
            event.followup.append(harness_note(self.config["message"] + reason))
        return event


class ArgumentGuard(Processor):
    kind = "argument_guard"
    description = "Blocks tool calls whose arguments match a deny pattern (e.g. shell escapes in python code)."
    hook = Hook.BEFORE_TOOL
    dimension = Dimension.CONTROL
    consumes = produces = ToolCallEvent
    params = (
        Param(
            "deny_patterns",
            "str_list",
            [r"\bimport\s+(os|subprocess|socket|shutil)\b", r"\b__import__\b"],
            "regexes searched in the JSON of the arguments",
        ),
    )

    def process(self, event: ToolCallEvent) -> ToolCallEvent:
        text = json.dumps(event.call.arguments)
        for pattern in self.config["deny_patterns"]:
            if re.search(pattern, text):
                event.result = ToolResult("", error=f"call blocked by guard pattern {pattern!r}")
                break
        return event
