"""Training bridge: what of an episode the GRPO trainer should learn from."""

from __future__ import annotations

from coevo.harness.events import ModelOutputEvent, TaskEndEvent
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library.control import CONSECUTIVE_PARSE_FAILURES
from coevo.harness.processor import Param, Processor


class TokenAnnotation(Processor):
    kind = "token_annotation"
    description = (
        "Marks each model call's tokens for the loss: truncated completions are excluded (their "
        "reward says nothing about the text), retried ones down-weighted."
    )
    hook = Hook.AFTER_MODEL
    dimension = Dimension.TRAINING_BRIDGE
    consumes = produces = ModelOutputEvent
    params = (
        Param("exclude_truncated", "bool", True, "drop completions that hit max_new_tokens"),
        Param("retry_weight", "float", 0.5, "loss weight of calls made after a parse-retry reminder"),
    )

    def process(self, event: ModelOutputEvent) -> ModelOutputEvent:
        if self.config["exclude_truncated"] and event.finish_reason == "length":
            event.trainable = False
        if event.state.memory.get(CONSECUTIVE_PARSE_FAILURES, 0) > 0:
            event.loss_weight = self.config["retry_weight"]
        return event


class InfraErrorFilter(Processor):
    kind = "infra_error_filter"
    description = (
        "Keeps an episode out of training, and out of its task's GRPO group, when its tools timed out "
        "more often than tolerated, since its reward then reflects the machine rather than the policy. "
        "(Crashes of the policy, the environment or a tool are marked by the runtime itself: "
        "Trace.infra_failure.)"
    )
    hook = Hook.TASK_END
    dimension = Dimension.TRAINING_BRIDGE
    consumes = produces = TaskEndEvent
    params = (Param("max_tool_timeouts", "int", 0, "timeouts tolerated before the trace is excluded"),)

    def process(self, event: TaskEndEvent) -> TaskEndEvent:
        if event.state.usage.get("tool_timeouts", 0) > self.config["max_tool_timeouts"]:
            event.state.trainable = False
        return event
