"""Built-in harnesses: the base harness every run starts from, ``lenient`` (also reads the last
number as an answer), ``conversational`` (a system prompt for multi-turn tasks with a user) and
``function_calling`` (a conversation where plain text ends the turn)."""

from __future__ import annotations

from coevo.harness.harness import Harness
from coevo.harness.library import (
    AnswerExtraction,
    EpisodeMetrics,
    InfraErrorFilter,
    Journal,
    JsonToolCallParser,
    LoopDetection,
    ParseRetry,
    SamplingConfig,
    StepBudget,
    SystemPrompt,
    TokenAnnotation,
    ToolRegistry,
    ToolSchemaHint,
    ToolTimeout,
)


def base_harness() -> Harness:
    """A deliberately plain harness: system prompt, tools described, JSON tool calls parsed,
    answers extracted, a step budget and basic bookkeeping. Evolution starts from here."""
    return Harness(
        [
            SamplingConfig(),
            SystemPrompt(),
            ToolRegistry(),
            ToolSchemaHint(),
            TokenAnnotation(),
            JsonToolCallParser(),
            AnswerExtraction(),
            ParseRetry(max_retries=1),
            ToolTimeout(),
            StepBudget(),
            LoopDetection(),
            Journal(),
            EpisodeMetrics(),
            InfraErrorFilter(),
        ],
        name="base",
    )


def lenient_harness() -> Harness:
    """The base harness that also takes the last number of a completion as its answer: a random
    or barely trained model then sometimes scores, which smoke runs need for a GRPO signal."""
    h = base_harness().set_param("answer_extraction", "last_number_fallback", True)
    return Harness(h.processors, name="lenient")


CONVERSATIONAL_SYSTEM_PROMPT = (
    "You are a helpful assistant talking with a user. Reply to the user in plain text, one turn at a "
    "time, and use the tools when they help. Ask when you need more information. Write "
    "<answer>...</answer> only when the task is complete, as the task describes it: an answer ends the "
    "conversation."
)


def conversational_harness() -> Harness:
    """The base harness with a system prompt for conversational tasks (a simulated user replies to
    each turn): the base prompt's "give your final answer as <answer>" makes an agent answer, and
    so end the episode, on its first turn. Only the system prompt differs from ``base``; the same
    change on another harness is the one setting ``system_prompt.template``."""
    h = base_harness().set_param("system_prompt", "template", CONVERSATIONAL_SYSTEM_PROMPT)
    return Harness(h.processors, name="conversational")


FUNCTION_CALLING_SYSTEM_PROMPT = (
    "You are a helpful assistant talking with a user. Call the tools when they help; when you have "
    "no tool to call, reply to the user in plain text: a reply without a tool call ends your turn, "
    "and the user speaks next."
)


FUNCTION_CALLING_RETRY = (
    "I could not read the tool call in your reply. Call a tool with "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>, or reply to the user in plain text.'
)


def function_calling_harness() -> Harness:
    """The conversation harness of function-calling benchmarks (BFCL's multi-turn categories): a
    reply without a tool call is the turn's reply as written (``answer_extraction.plain_text``),
    not a format error to retry, so no reminder interrupts the user's conversation; tool calls
    and answer tags read as in ``base``. A reply whose tool call does not parse is retried with a
    note that states this harness's rule (a tool call, or plain text), not base's answer tags."""
    h = (base_harness().set_param("system_prompt", "template", FUNCTION_CALLING_SYSTEM_PROMPT)
         .set_param("answer_extraction", "plain_text", True)
         .set_param("parse_retry", "message", FUNCTION_CALLING_RETRY))
    return Harness(h.processors, name="function_calling")


def program_harness() -> Harness:
    """The harness of an agent that is a program (``coevo.programs``): only what applies at the
    interception point of its model requests. The program keeps its own system prompt, loop,
    tools and answer format; the harness sets the sampling, lists the program's tools in the format
    the model reads and parses its tool calls back into the program's OpenAI form, and caps the
    requests per episode. AEGIS's edits add to it (a system prompt replacing the program's,
    demonstrations, a forced tool call, ``tool_registry`` hiding tools)."""
    return Harness(
        [SamplingConfig(), ToolRegistry(), ToolSchemaHint(), TokenAnnotation(), JsonToolCallParser(), StepBudget(),
         EpisodeMetrics(), InfraErrorFilter()],
        name="program",
    )


BUILTIN_HARNESSES = {"base": base_harness, "lenient": lenient_harness, "conversational": conversational_harness,
                     "function_calling": function_calling_harness, "program": program_harness}


def with_step_cap(harness: Harness, max_steps: int) -> Harness:
    """``harness`` whose ``step_budget`` lets an episode run ``max_steps`` model calls: a budget
    below the cap is raised to it (never lowered), so one setting (``--max-steps``,
    ``rollout.max_steps``) decides how long an episode may run instead of two."""
    budget = next((p for p in harness if p.kind == "step_budget"), None)
    if budget is None or budget.config["max_steps"] >= max_steps:
        return harness
    return harness.set_param(budget.name, "max_steps", int(max_steps))
