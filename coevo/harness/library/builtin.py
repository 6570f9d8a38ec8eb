"""The built-in processor classes, at least two per dimension (``CodeProcessor`` aside: it is
built from source, and extends one of these)."""

from __future__ import annotations

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
    ToolChoice,
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
    Specialist,
)
