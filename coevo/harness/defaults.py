"""Built-in harnesses: the base harness every run starts from."""

from __future__ import annotations

from coevo.harness.harness import Harness
from coevo.harness.library import (
    AnswerExtraction,
    EpisodeMetrics,
    InfraErrorFilter,
    JsonToolCallParser,
    Journal,
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


BUILTIN_HARNESSES = {"base": base_harness}
