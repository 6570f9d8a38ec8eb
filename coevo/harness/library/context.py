"""Context assembly: what the model is told at the start of an episode."""

from __future__ import annotations

from collections.abc import Sequence

from coevo.harness.errors import ParamError
from coevo.harness.events import DEMO, Message, TaskStartEvent
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful problem solver. Think step by step, use the tools when they help, "
    "and give your final answer as <answer>...</answer>."
)


def first_user_index(messages: list[dict]) -> int:
    """Index of the first user message (the task), or len(messages) if there is none."""
    return next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))


class SystemPrompt(Processor):
    kind = "system_prompt"
    description = "Puts the system message first in the context; {env} in the template is the environment name."
    hook = Hook.TASK_START
    dimension = Dimension.CONTEXT
    consumes = produces = TaskStartEvent
    group = "system_prompt"
    params = (Param("template", "prompt", DEFAULT_SYSTEM_PROMPT, "system message template"),)

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        text = self.config["template"].replace("{env}", event.state.task.env)
        msgs = [m for m in event.state.messages if m.get("role") != "system"]
        event.state.messages = [{"role": "system", "content": text}, *msgs]
        return event


class InstructionTemplate(Processor):
    kind = "instruction_template"
    description = "Rewrites the task message through a template; {instruction} is the task text."
    hook = Hook.TASK_START
    dimension = Dimension.CONTEXT
    consumes = produces = TaskStartEvent
    group = "instruction"
    params = (Param("template", "prompt", "{instruction}", "user message template"),)

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        msgs = event.state.messages
        i = first_user_index(msgs)
        text = self.config["template"].replace("{instruction}", event.state.task.instruction)
        if i < len(msgs):
            msgs[i] = {**msgs[i], "content": text}
        else:
            msgs.append({"role": "user", "content": text})
        return event


def split_demos(turns: Sequence[Message]) -> list[list[Message]]:
    """A flat list of demonstration turns as its demonstrations: each starts at a user turn."""
    demos: list[list[Message]] = []
    for turn in turns:
        if turn.get("role") == "user" or not demos:
            demos.append([])
        demos[-1].append(dict(turn))
    return demos


def pair_demo(question: str, answer: str) -> list[Message]:
    """A (question, reply) demonstration as turns: a user turn and an assistant turn."""
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def demo_problem(turns: Sequence[Message]) -> str | None:
    """Why ``turns`` are not demonstrations as the runtime would produce them, or None when they are:
    each is a user turn (the task) answered by an assistant turn, then assistant and tool turns
    (a user turn starts the next demonstration, so every tool turn follows an assistant turn or
    another tool turn). A demonstration ends with the assistant's answer, or with a tool turn when
    the environment ended the episode on that call (a won game)."""
    for k, demo in enumerate(split_demos(turns)):
        if demo[0].get("role") != "user":
            return f"demonstration {k} starts with a {demo[0].get('role')} turn, not a user turn"
        if len(demo) < 2 or demo[1].get("role") != "assistant":
            return f"demonstration {k} has no assistant turn answering its user turn"
    return None


class FewShotDemos(Processor):
    kind = "few_shot"
    description = (
        "Inserts worked demonstrations before the task. On small models one demonstration of the "
        "answer format moves pass rates more than any instruction. 'demos' are plain question/reply "
        "pairs; 'turns' are demonstrations in the runtime's own turn structure (the task, the "
        "assistant's tool call, the tool result turn, ..., the assistant's answer), so a model sees "
        "a tool result where the runtime will put it and never learns to write one itself."
    )
    hook = Hook.TASK_START
    dimension = Dimension.CONTEXT
    consumes = produces = TaskStartEvent
    params = (
        Param("demos", "str_list", [], "alternating user and assistant texts: [q1, a1, q2, a2, ...]"),
        Param("turns", "turns", [], "demonstrations as chat turns, after those of 'demos': each a user turn, "
              "then assistant turns and tool turns ({role: tool, name, content}) as the runtime sends them, "
              "ending with the assistant's answer (or the tool turn on which the environment ended the episode)"),
    )

    def __init__(self, name: str | None = None, **params):
        super().__init__(name, **params)
        if len(self.config["demos"]) % 2:
            raise ParamError(self.name, "parameter 'demos' needs an even number of texts (user, assistant pairs)")
        problem = demo_problem(self.config["turns"])
        if problem is not None:
            raise ParamError(self.name, f"parameter 'turns': {problem}")

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        demos = self.config["demos"]
        turns = [pair_demo(demos[k], demos[k + 1]) for k in range(0, len(demos), 2)]
        flat = [turn for demo in turns for turn in demo] + [dict(t) for t in self.config["turns"]]
        flat = [{**turn, DEMO: True} for turn in flat]  # marked: coevo.agent.demos finds their tokens
        msgs = event.state.messages
        i = first_user_index(msgs)
        event.state.messages = msgs[:i] + flat + msgs[i:]
        return event
