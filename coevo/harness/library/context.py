"""Context assembly: what the model is told at the start of an episode."""

from __future__ import annotations

from coevo.harness.events import TaskStartEvent
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


class FewShotDemos(Processor):
    kind = "few_shot"
    description = (
        "Inserts worked demonstrations (user/assistant turns) before the task. On small models one "
        "demonstration of the answer format moves pass rates more than any instruction."
    )
    hook = Hook.TASK_START
    dimension = Dimension.CONTEXT
    consumes = produces = TaskStartEvent
    params = (
        Param("demos", "str_list", [], "alternating user and assistant texts: [q1, a1, q2, a2, ...]"),
    )

    def __init__(self, name: str | None = None, **params):
        super().__init__(name, **params)
        if len(self.config["demos"]) % 2:
            from coevo.harness.errors import ParamError

            raise ParamError(self.name, "parameter 'demos' needs an even number of texts (user, assistant pairs)")

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        demos = self.config["demos"]
        turns = [
            {"role": "user" if k % 2 == 0 else "assistant", "content": text} for k, text in enumerate(demos)
        ]
        msgs = event.state.messages
        i = first_user_index(msgs)
        event.state.messages = msgs[:i] + turns + msgs[i:]
        return event
