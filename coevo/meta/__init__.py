"""Meta-agent backends for AEGIS: ``rule`` (offline, deterministic), ``openai`` and ``hf`` (LLMs).

``BACKENDS`` maps a backend name to the constructor of its meta-agent: ``RuleMetaAgent()``,
``openai_meta_agent(base_url, model, ...)`` and ``hf_meta_agent(model_name_or_path, ...)``. A backend may
also be the import path of a no-argument factory of your own (``load_meta_agent``).
"""

import os
from collections.abc import Callable

from coevo.config.imports import import_object, missing_dependency
from coevo.config.schema import MetaAgentConfig
from coevo.evolution.meta_agent import MetaAgent, MetaAgentError, PlanContext, TokenLedger
from coevo.meta.cache import CachedCall, CallCache
from coevo.meta.clients import REQUEST_RETRIES, TIMEOUT_S, ChatClient, HFClient, LLMConnectionError, OpenAIClient
from coevo.meta.llm import MAX_RETRIES, ROUTER_FAILURES, LLMMetaAgent, RouterError, hf_meta_agent, openai_meta_agent
from coevo.meta.rule import RuleMetaAgent
from coevo.meta.templates import CATALOGUE, TEMPLATES

BACKENDS = {"rule": RuleMetaAgent, "openai": openai_meta_agent, "hf": hf_meta_agent}
"""backend name → constructor of its meta-agent."""


def meta_agent_factory(path: str) -> Callable[[], MetaAgent]:
    """The no-argument factory (or class) named by ``package.module:name``, for a meta-agent of your own,
    e.g. a ``RuleMetaAgent`` with extra templates (docs/processors.md): ``meta_agent.backend=pkg.mod:make``
    or ``coevo evolve --meta pkg.mod:make``. Checked here, called by ``load_meta_agent``.

    Every mistake in ``path`` is a ValueError naming it, a module that the factory's module imports
    but is not installed included: the config check (``coevo.loop.config_check.check``, ``coevo evolve``)
    reports ValueErrors as the value's fault, before the run starts."""
    factory = import_object(path, "meta-agent factory")  # a missing dependency of its module included
    if not callable(factory):
        raise ValueError(f"meta-agent factory {path!r} is {factory!r}, not a callable that returns a meta-agent")
    return factory


def make_meta_agent(backend: str, *, url: str | None = None, model: str | None = None,
                    cache_dir: str | os.PathLike[str] | None = None, api_key_env: str = MetaAgentConfig.api_key_env,
                    timeout_s: float = TIMEOUT_S, max_retries: int = MAX_RETRIES,
                    request_retries: int = REQUEST_RETRIES, router_failure: str = ROUTER_FAILURES[0]) -> MetaAgent:
    """The meta-agent of ``backend`` (a ``BACKENDS`` name or a factory's import path), for
    ``train.py`` and ``coevo evolve`` alike. ``url``/``model`` serve ``openai`` (both needed) and
    ``hf`` (``model``, default the embedded SmolLM2); ``cache_dir`` holds the LLM call cache;
    ``timeout_s`` and ``request_retries`` serve ``openai`` (each request's timeout, its SDK's retries of
    a failed request), ``max_retries`` and ``router_failure`` both LLM backends (retries of an invalid
    reply, ``LLMMetaAgent.route``); ``train.py`` passes none of the four (their defaults are the
    constants ``TIMEOUT_S``, ``REQUEST_RETRIES``, ``MAX_RETRIES`` and the first of ``ROUTER_FAILURES``)."""
    if backend == "rule":
        return RuleMetaAgent()
    if backend not in BACKENDS:
        return load_meta_agent(backend)
    if backend == "openai":
        return openai_meta_agent(url, model, api_key_env=api_key_env, timeout_s=timeout_s, cache_dir=cache_dir,
                                 max_retries=max_retries, request_retries=request_retries,
                                 router_failure=router_failure)
    return hf_meta_agent(model or "smollm2", cache_dir=cache_dir, max_retries=max_retries,
                         router_failure=router_failure)


def load_meta_agent(path: str) -> MetaAgent:
    """``meta_agent_factory(path)()``, checked against the ``MetaAgent`` protocol."""
    factory = meta_agent_factory(path)
    try:
        agent = factory()
    except TypeError as err:
        raise ValueError(f"meta-agent factory {path!r} must take no arguments: {err}") from None
    except ModuleNotFoundError as err:
        raise missing_dependency("meta-agent factory", path, err) from err
    needed = ("propose", "revise", "state_dict", "load_state_dict")
    missing = [m for m in needed if not callable(getattr(agent, m, None))]  # a factory of one's own may return anything
    if missing or not hasattr(agent, "ledger"):
        raise ValueError(f"{path!r} returned {agent!r}, which lacks {missing or ['ledger']} of a meta-agent "
                         "(see MetaAgent in coevo/evolution/meta_agent.py)")
    return agent


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
    "RouterError",
    "RuleMetaAgent",
    "TokenLedger",
    "hf_meta_agent",
    "load_meta_agent",
    "meta_agent_factory",
    "openai_meta_agent",
]
