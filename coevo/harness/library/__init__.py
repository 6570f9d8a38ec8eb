"""The built-in processor library, at least two processors per dimension, and spec loading."""

from __future__ import annotations

from typing import Any

from coevo.harness.code import CodeProcessor
from coevo.harness.errors import UnknownProcessorError
from coevo.harness.library.context import FewShotDemos, InstructionTemplate, SystemPrompt
from coevo.harness.library.control import ArgumentGuard, LoopDetection, ParseRetry, StepBudget
from coevo.harness.library.evaluation import AnswerExtraction, SelfVerification
from coevo.harness.library.execution import PythonExecutor, ToolTimeout
from coevo.harness.library.memory import SlidingWindowMemory, SummaryMemory
from coevo.harness.library.model import SamplingConfig, TemperatureSchedule
from coevo.harness.library.observability import EpisodeMetrics, Journal
from coevo.harness.library.stages import SkillLibrary, StageTools
from coevo.harness.library.tools import JsonToolCallParser, ToolRegistry, ToolSchemaHint, ToolWhitelist
from coevo.harness.library.training import InfraErrorFilter, TokenAnnotation
from coevo.harness.processor import Processor

BUILTIN: tuple[type[Processor], ...] = (
    SamplingConfig,
    TemperatureSchedule,
    SystemPrompt,
    InstructionTemplate,
    FewShotDemos,
    SlidingWindowMemory,
    SummaryMemory,
    ToolRegistry,
    ToolSchemaHint,
    JsonToolCallParser,
    ToolWhitelist,
    PythonExecutor,
    ToolTimeout,
    AnswerExtraction,
    SelfVerification,
    StepBudget,
    LoopDetection,
    ParseRetry,
    ArgumentGuard,
    Journal,
    EpisodeMetrics,
    TokenAnnotation,
    InfraErrorFilter,
    StageTools,
    SkillLibrary,
)

PROCESSORS: dict[str, type[Processor]] = {cls.kind: cls for cls in BUILTIN} | {CodeProcessor.kind: CodeProcessor}
"""Processor kinds a harness spec may name."""


def build_processor(spec: dict[str, Any]) -> Processor:
    """Instantiate a processor from ``{"kind": ..., "name": ..., "params": {...}}``."""
    if not isinstance(spec, dict) or "kind" not in spec:
        raise UnknownProcessorError(str(spec)[:60], "a processor spec is a mapping with a 'kind'")
    kind = spec["kind"]
    cls = PROCESSORS.get(kind)
    if cls is None:
        raise UnknownProcessorError(spec.get("name", kind), f"unknown kind {kind!r}; known kinds: {sorted(PROCESSORS)}")
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise UnknownProcessorError(spec.get("name", kind), "'params' must be a mapping")
    return cls(name=spec.get("name"), **params)
