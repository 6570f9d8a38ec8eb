"""Typed events that flow through the hooks, and the plain-data episode state they carry.

Every event holds the episode's ``EpisodeState`` plus the payload specific to its hook.
Processors receive an event and return an event (usually the same object, possibly mutated);
the harness checks statically that each processor's declared input type accepts what the
previous processor at that hook produces (``coevo.harness.algebra``).

Everything here is plain data (strings, numbers, lists, dicts, dataclasses of those) so that an
event can be pickled into and out of the sandbox that runs code-level processors. Callables such
as tool implementations never live in the state: the runtime resolves tools by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coevo.harness.hooks import Hook

Message = dict[str, Any]
"""A chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str, ...}``."""

HARNESS = "harness"
"""The ``name`` of a user-role message the harness wrote (a reminder, a warning, a check), not the
task's user: a conversation's user turns and the harness's nudges stay apart in the history, and
the model sees the nudge marked (``[harness]``, ``coevo.policy.chat.to_template_messages``)."""


DEMO = "demo"
"""A message key the few_shot processor sets on each turn it inserts: a worked demonstration, not
the episode's own conversation. Chat templates never see it (``coevo.policy.chat.to_template_messages``
keeps role and content); the runtime renders a request without these turns to find their tokens
(``coevo.agent.demos``), so the trainer can train a reply under the prompt without them."""


def harness_note(content: str) -> Message:
    """A user-role message the harness, not the user, says."""
    return {"role": "user", "name": HARNESS, "content": content}


def is_harness_note(message: Message) -> bool:
    return message.get("role") == "user" and message.get("name") == HARNESS


@dataclass
class SamplingParams:
    """How the policy samples one completion."""

    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # extra stop strings besides EOS


@dataclass(frozen=True)
class ToolSpec:
    """A tool the agent may call: its name, what it does, and its JSON-schema parameters.

    ``provider`` says who executes it: ``"env"`` for tools of the environment session, or the
    name of the harness processor that implements it. ``returns`` is the JSON schema of its
    result when the benchmark gives one (BFCL's ``response``): the tool hint shows it, so the
    model knows what the result will hold before it calls.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)  # JSON schema of the arguments
    provider: str = "env"
    returns: dict[str, Any] | None = None  # JSON schema of the result; None: not given


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str = ""


@dataclass
class ToolResult:
    output: str
    error: str | None = None
    seconds: float = 0.0


@dataclass
class TaskView:
    """What the agent may know about a task: never the ground truth."""

    task_id: str
    env: str
    instruction: str
    split: str = "train"


@dataclass
class EpisodeState:
    """Mutable state of one episode, shared by every hook.

    ``messages`` is the conversation history; what is actually sent to the model at a step is
    the ``ModelRequestEvent.messages`` view, which memory processors may shorten without losing
    history. ``memory`` is a scratch space for processors that need state across hooks (plain
    data only). ``journal`` collects observability records that end up in the trace.
    """

    task: TaskView
    messages: list[Message] = field(default_factory=list)
    available_tools: dict[str, ToolSpec] = field(default_factory=dict)  # offered by env/harness
    tools: dict[str, ToolSpec] = field(default_factory=dict)  # enabled for the agent
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prefix_len: int = 0  # messages assembled at task_start (system, demos, task): never dropped
    step: int = 0
    max_steps: int = 8
    done: bool = False
    stop_reason: str | None = None
    final_answer: str | None = None
    replies: list[str] = field(default_factory=list)  # the agent's answers to earlier user turns (multi-turn envs)
    memory: dict[str, Any] = field(default_factory=dict)
    journal: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)  # counters kept by the runtime
    trainable: bool = True  # training bridge: False keeps the trace out of GRPO

    def stop(self, reason: str) -> None:
        """End the episode after the current step (first reason wins)."""
        if not self.done:
            self.done = True
            self.stop_reason = reason


@dataclass
class Event:
    """Base of all hook events."""

    state: EpisodeState


@dataclass
class TaskStartEvent(Event):
    """task_start: assemble the initial context, enable tools, choose sampling."""


@dataclass
class StepStartEvent(Event):
    """step_start: fired before each agent step (``state.step`` is the step about to run)."""


@dataclass
class ModelRequestEvent(Event):
    """before_model: the exact messages and sampling parameters about to be sent to the policy.

    ``reply_prefix`` is text the assistant turn starts with (prefilled, not generated): the model
    continues from it, e.g. ``<tool_call>{"name": "`` forces a tool call as an API's
    ``tool_choice="required"`` does. The runtime parses and records ``reply_prefix + generated
    text`` as the reply; the trainer learns only from the generated tokens.
    """

    messages: list[Message] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    reply_prefix: str = ""


@dataclass
class ModelOutputEvent(Event):
    """after_model: the raw completion, before any parsing."""

    text: str = ""
    finish_reason: str = "stop"  # "stop" | "length"
    call_index: int = 0  # index into the trace's model calls
    trainable: bool = True  # training bridge: whether this call's tokens enter the loss
    loss_weight: float = 1.0


@dataclass
class ParsedOutputEvent(ModelOutputEvent):
    """after_model, once a parser has run: the actions the completion asks for.

    The runtime acts on it: tool calls are executed; otherwise an ``answer`` ends the episode
    unless ``hold_answer`` is set; ``followup`` messages are appended after the assistant turn
    (e.g. a parse-retry hint or a verification request).
    """

    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    parse_error: str | None = None
    hold_answer: bool = False
    followup: list[Message] = field(default_factory=list)


@dataclass
class ToolCallEvent(Event):
    """before_tool: a call about to run. Setting ``result`` short-circuits execution."""

    call: ToolCall = field(default_factory=lambda: ToolCall("", {}))
    timeout_s: float = 10.0
    result: ToolResult | None = None


@dataclass
class ToolResultEvent(Event):
    """after_tool: a call and its result, before the result is shown to the model."""

    call: ToolCall = field(default_factory=lambda: ToolCall("", {}))
    result: ToolResult = field(default_factory=lambda: ToolResult(""))


@dataclass
class StepEndEvent(Event):
    """step_end: after the step's actions ran; control processors may stop the episode here."""

    actions: list[str] = field(default_factory=list)  # short descriptions of what the step did


@dataclass
class TaskEndEvent(Event):
    """task_end: the episode is over; ``state.final_answer`` is what will be verified."""


# The event type the runtime fires at each hook, and the type the hook's processor chain must
# deliver back. They differ only at after_model, where a parser must turn raw text into actions.
HOOK_INPUT: dict[Hook, type[Event]] = {
    Hook.TASK_START: TaskStartEvent,
    Hook.STEP_START: StepStartEvent,
    Hook.BEFORE_MODEL: ModelRequestEvent,
    Hook.AFTER_MODEL: ModelOutputEvent,
    Hook.BEFORE_TOOL: ToolCallEvent,
    Hook.AFTER_TOOL: ToolResultEvent,
    Hook.STEP_END: StepEndEvent,
    Hook.TASK_END: TaskEndEvent,
}
HOOK_OUTPUT: dict[Hook, type[Event]] = {**HOOK_INPUT, Hook.AFTER_MODEL: ParsedOutputEvent}
