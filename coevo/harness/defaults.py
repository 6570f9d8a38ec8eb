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


def lenient_harness() -> Harness:
    """The base harness that also takes the last number of a completion as its answer: a random
    or barely trained model then sometimes scores, which smoke runs need for a GRPO signal."""
    h = base_harness().set_param("answer_extraction", "last_number_fallback", True)
    return Harness(h.processors, name="lenient")


BUILTIN_HARNESSES = {"base": base_harness, "lenient": lenient_harness}
