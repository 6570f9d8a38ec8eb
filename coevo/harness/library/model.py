"""Model selection: how the policy samples."""

from __future__ import annotations

from coevo.harness.events import ModelRequestEvent, TaskStartEvent
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library.control import CONSECUTIVE_PARSE_FAILURES
from coevo.harness.processor import Param, Processor


class SamplingConfig(Processor):
    kind = "sampling"
    description = "Sets the sampling parameters (temperature, top-p, completion budget, stop strings) for the episode."
    hook = Hook.TASK_START
    dimension = Dimension.MODEL_SELECTION
    consumes = produces = TaskStartEvent
    group = "sampling"
    params = (
        Param("temperature", "float", 0.0, "0 is greedy decoding"),
        Param("top_p", "float", 1.0, "nucleus sampling mass"),
        Param("max_new_tokens", "int", 192, "completion budget per model call"),
        Param("stop", "str_list", [], "extra stop strings"),
    )

    def process(self, event: TaskStartEvent) -> TaskStartEvent:
        s = event.state.sampling
        s.temperature = self.config["temperature"]
        s.top_p = self.config["top_p"]
        s.max_new_tokens = self.config["max_new_tokens"]
        s.stop = list(self.config["stop"])
        return event


class TemperatureSchedule(Processor):
    kind = "temperature_schedule"
    description = (
        "Raises the sampling temperature after consecutive unparseable completions, so a model stuck "
        "on a malformed reply explores instead of repeating it."
    )
    hook = Hook.BEFORE_MODEL
    dimension = Dimension.MODEL_SELECTION
    consumes = produces = ModelRequestEvent
    params = (
        Param("increase", "float", 0.3, "temperature added per consecutive parse failure"),
        Param("max_temperature", "float", 1.0, "upper bound"),
    )

    def process(self, event: ModelRequestEvent) -> ModelRequestEvent:
        failures = event.state.memory.get(CONSECUTIVE_PARSE_FAILURES, 0)
        if failures:
            bumped = event.sampling.temperature + self.config["increase"] * failures
            event.sampling.temperature = min(self.config["max_temperature"], bumped)
        return event
