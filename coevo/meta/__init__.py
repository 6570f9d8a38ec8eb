"""Meta-agent backends for AEGIS: ``rule`` (offline, deterministic), ``openai`` and ``hf`` (LLMs).

``BACKENDS`` maps a backend name to the constructor of its meta-agent: ``RuleMetaAgent()``,
``openai_meta_agent(base_url, model, ...)`` and ``hf_meta_agent(model_name_or_path, ...)``.
"""

from coevo.meta.base import MetaAgent, PlanContext, TokenLedger
from coevo.meta.cache import CachedCall, CallCache
from coevo.meta.llm import (
    ChatClient,
    HFClient,
    LLMConnectionError,
    LLMMetaAgent,
    MetaAgentError,
    OpenAIClient,
    hf_meta_agent,
    openai_meta_agent,
)
from coevo.meta.rule import CATALOGUE, TEMPLATES, RuleMetaAgent

BACKENDS = {"rule": RuleMetaAgent, "openai": openai_meta_agent, "hf": hf_meta_agent}
"""backend name → constructor of its meta-agent."""

__all__ = [
    "BACKENDS",
    "CATALOGUE",
    "TEMPLATES",
    "CachedCall",
    "CallCache",
    "ChatClient",
    "HFClient",
    "LLMConnectionError",
    "LLMMetaAgent",
    "MetaAgent",
    "MetaAgentError",
    "OpenAIClient",
    "PlanContext",
    "RuleMetaAgent",
    "TokenLedger",
    "hf_meta_agent",
    "openai_meta_agent",
]
