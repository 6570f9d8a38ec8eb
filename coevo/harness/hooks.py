"""The eight lifecycle hooks and the nine behavioural dimensions of a harness.

A harness (HarnessX §3) is a set of processors, each attached to exactly one hook and belonging
to exactly one dimension. The hooks are fired by the agent runtime in a fixed order; the
dimensions are a taxonomy used to reason about edits (which part of the harness a failure
implicates, whether evolution is stuck in one part).
"""

from __future__ import annotations

from enum import Enum


class Hook(str, Enum):
    """Lifecycle points of one episode, in firing order.

    ``task_start`` once, then per step ``step_start`` → ``before_model`` → ``after_model`` →
    (``before_tool`` → ``after_tool``) per tool call → ``step_end``; ``task_end`` once.
    """

    TASK_START = "task_start"
    STEP_START = "step_start"
    BEFORE_MODEL = "before_model"
    AFTER_MODEL = "after_model"
    BEFORE_TOOL = "before_tool"
    AFTER_TOOL = "after_tool"
    STEP_END = "step_end"
    TASK_END = "task_end"


HOOK_ORDER: tuple[Hook, ...] = tuple(Hook)


class Dimension(str, Enum):
    """The nine behavioural dimensions of HarnessX §3.3."""

    MODEL_SELECTION = "model_selection"
    CONTEXT = "context_assembly"
    MEMORY = "memory"
    TOOLS = "tools"
    EXECUTION = "execution_environment"
    EVALUATION = "evaluation_reward"
    CONTROL = "control_safety"
    OBSERVABILITY = "observability"
    TRAINING_BRIDGE = "training_bridge"
