"""The built-in processor library, at least two processors per dimension, and spec loading."""

from __future__ import annotations

from typing import Any

from coevo.config.imports import import_object, is_import_path
from coevo.harness.errors import UnknownProcessorError
from coevo.harness.library.builtin import BUILTIN
from coevo.harness.library.code import CodeProcessor
from coevo.harness.library.context import FewShotDemos, InstructionTemplate, SystemPrompt
from coevo.harness.library.control import ArgumentGuard, LoopDetection, ParseRetry, StepBudget
from coevo.harness.library.delegation import Specialist
from coevo.harness.library.evaluation import AnswerExtraction, SelfVerification
from coevo.harness.library.execution import PythonExecutor, ToolTimeout
from coevo.harness.library.memory import SlidingWindowMemory, SummaryMemory
from coevo.harness.library.model import SamplingConfig, TemperatureSchedule
from coevo.harness.library.observability import EpisodeMetrics, Journal
from coevo.harness.library.stages import SkillLibrary, StageTools
from coevo.harness.library.tools import JsonToolCallParser, ToolChoice, ToolRegistry, ToolSchemaHint, ToolWhitelist
from coevo.harness.library.training import InfraErrorFilter, TokenAnnotation
from coevo.harness.processor import Processor

PROCESSORS: dict[str, type[Processor]] = {cls.kind: cls for cls in BUILTIN} | {CodeProcessor.kind: CodeProcessor}
"""Processor kinds a harness spec may name."""


def processor_class(kind: str, name: str | None = None) -> type[Processor]:
    """The class of a processor kind: a built-in kind from ``PROCESSORS``, or the import path
    ``package.module:ClassName`` of a ``Processor`` subclass defined elsewhere, whose ``kind`` must be
    that same path so that the specs it writes load back (in harness YAML, lineage and edits).
    Errors name the processor (``name``, else the kind) and the allowed forms."""
    cls = PROCESSORS.get(kind) if isinstance(kind, str) else None
    if cls is not None:
        return cls
    owner = name or str(kind)
    if not isinstance(kind, str) or not is_import_path(kind):
        raise UnknownProcessorError(
            owner, f"unknown kind {kind!r}; use a built-in kind {sorted(PROCESSORS)} or the import path "
            "'package.module:ClassName' of a Processor subclass")
    try:
        found = import_object(kind, "processor kind")
    except ValueError as err:
        raise UnknownProcessorError(owner, str(err)) from None
    if not (isinstance(found, type) and issubclass(found, Processor)):
        raise UnknownProcessorError(owner, f"{kind!r} is {found!r}, not a Processor subclass")
    if found.kind != kind:
        raise UnknownProcessorError(
            owner, f"{kind!r} has kind {found.kind!r}; a processor loaded by import path must declare "
            f"kind = {kind!r} so the specs it writes load back")
    return found


def build_processor(spec: dict[str, Any]) -> Processor:
    """Instantiate a processor from ``{"kind": ..., "name": ..., "params": {...}}``; ``kind`` is a
    built-in kind or an import path (``processor_class``)."""
    if not isinstance(spec, dict) or "kind" not in spec:
        raise UnknownProcessorError(str(spec)[:60], "a processor spec is a mapping with a 'kind'")
    kind = spec["kind"]
    cls = processor_class(kind, spec.get("name"))
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise UnknownProcessorError(spec.get("name", kind), "'params' must be a mapping")
    return cls(name=spec.get("name"), **params)
