"""Evaluation: turning completions into a final answer, and checking it before submitting."""

from __future__ import annotations

import re

from coevo.harness.events import ParsedOutputEvent, harness_note
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor

DEFAULT_PATTERNS = [
    r"<answer>\s*([\s\S]*?)\s*</answer>",  # may span lines (grids, lists)
    r"\\boxed\{([^{}]*)\}",
    r"(?i)final answer\s*(?:is\s*[:：]?|[:：])\s*(.*\w.*)",  # "is" or a colon, then a word, to the end of the line
    r"(?i)^\s*answer\s*[:：]\s*(.*\w.*)",
]
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


class AnswerExtraction(Processor):
    kind = "answer_extraction"
    description = (
        "Finds the final answer in a completion that calls no tool: the first matching pattern wins "
        "(answer tags, \\boxed{}, 'Final answer:'); optionally the last number as a fallback, or the "
        "whole text (plain text ends the turn, as function-calling APIs have it)."
    )
    hook = Hook.AFTER_MODEL
    dimension = Dimension.EVALUATION
    consumes = produces = ParsedOutputEvent
    group = "answer_extraction"
    params = (
        Param("patterns", "str_list", DEFAULT_PATTERNS, "regexes with one group, tried in order "
                                                        "(^ and $ match at lines)"),
        Param("last_number_fallback", "bool", False, "use the last number when no pattern matches"),
        Param("plain_text", "bool", False, "a reply with no tool call, no tool-call block and no pattern "
                                           "match is the answer as written (the reply that ends the turn)"),
    )

    def __init__(self, name: str | None = None, **params):
        super().__init__(name, **params)
        from coevo.harness.errors import ParamError

        try:
            self._regexes = [re.compile(p, re.MULTILINE) for p in self.config["patterns"]]
        except re.error as err:
            raise ParamError(self.name, f"parameter 'patterns' holds an invalid regex: {err}") from None

    def process(self, event: ParsedOutputEvent) -> ParsedOutputEvent:
        if event.tool_calls or event.answer is not None:
            return event
        for rx in self._regexes:
            m = rx.search(event.text)
            if m and (m.group(1).strip() or _closed(m)):
                event.answer = m.group(1).strip()
                return event
        if self.config["last_number_fallback"]:
            numbers = NUMBER_RE.findall(event.text)
            if numbers:
                event.answer = numbers[-1]
        if self.config["plain_text"] and event.answer is None and event.parse_error is None and event.text.strip():
            event.answer = event.text.strip()  # a broken tool-call block stays a format error for parse_retry
        return event


def _closed(match: re.Match[str]) -> bool:
    """Whether the pattern matched a closing delimiter after its group (``</answer>``, ``}``).

    Such a match is an answer even when the group is blank: ``<answer></answer>`` is the model's
    empty reply, which ends the episode and which the verifier scores, not a format failure that
    ``parse_retry`` would ask about again. An open-ended pattern ("Final answer:" to the end of the
    line) with nothing after it found no answer."""
    return match.end(1) < match.end()


class SelfVerification(Processor):
    kind = "self_verification"
    description = (
        "Before accepting the first answer of an episode, asks the model to check it once; the answer "
        "given after the check is final."
    )
    hook = Hook.AFTER_MODEL
    dimension = Dimension.EVALUATION
    consumes = produces = ParsedOutputEvent
    runs_after = frozenset({"answer_extraction"})
    params = (
        Param(
            "prompt",
            "prompt",
            "You answered {answer}. Check your work step by step. If it is right, repeat it as "
            "<answer>...</answer>; otherwise give the corrected answer the same way.",
            "verification request; {answer} is the proposed answer",
        ),
    )
    ASKED = "self_verification_asked"

    def process(self, event: ParsedOutputEvent) -> ParsedOutputEvent:
        if event.answer is None or event.state.memory.get(self.ASKED):
            return event
        event.state.memory[self.ASKED] = True
        event.hold_answer = True
        event.followup.append(harness_note(self.config["prompt"].replace("{answer}", event.answer)))
        return event
