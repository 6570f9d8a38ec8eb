"""LLM meta-agent backends: the same Planner/reviser/router over any chat model.

``LLMMetaAgent`` owns the prompts (``coevo.meta.prompts``), the JSON schemas of each stage
(``coevo.meta.schema``), validation and retries, the token ledger and the disk cache; a
``ChatClient`` (``coevo.meta.clients``) only turns messages into text and token counts.
The ``openai`` backend (any OpenAI-compatible endpoint, e.g. a vLLM server) and the ``hf`` backend
(a local transformers model) therefore differ only by their client, and a test can drive the
agent with a scripted fake client.

An LLM's reply is never trusted: it is parsed as JSON, checked against the stage's schema, turned
into typed ``Proposal``s and every edit is applied to the harness through the algebra. Any failure
is quoted back to the model in a follow-up message (up to ``max_retries`` times) because the
algebra's errors name the offending processor and rule, which is what a model needs to fix its
reply; what still fails after that is dropped with a logged warning. A failure of the model
itself (``MetaAgentError``: an endpoint still failing after the SDK's retries, a reply that is no
chat completion) is not the model's to fix: ``propose`` and ``revise`` raise it, and AEGIS records
it as a warning of the round and goes on; ``route`` falls back to no opinion, or raises
``RouterError`` with ``router_failure="raise"`` (a constructor argument: ``train.py`` runs the
default, ``"fallback"``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from coevo.config.schema import MetaAgentConfig
from coevo.evolution.meta_agent import MetaAgentError, PlanContext, TokenLedger
from coevo.harness.edits import Edit, apply_edit, check_proposed
from coevo.harness.harness import Harness
from coevo.meta.cache import CallCache
from coevo.meta.clients import REQUEST_RETRIES, TIMEOUT_S, ChatClient, HFClient, OpenAIClient
from coevo.meta.prompts import follow_up, plan_messages, revise_messages, route_messages, withhold_secrets
from coevo.meta.schema import (
    PLAN_SCHEMA,
    REVISE_SCHEMA,
    ROUTE_SCHEMA,
    SCHEMAS,
    parse_reply,
)
from coevo.rundir.evolve_records import Digest, Proposal

log = logging.getLogger("coevo.meta")

T = TypeVar("T")

ROUTER_FAILURES = ("fallback", "raise")
"""What ``route`` does when it gets no usable answer: log and return no opinion (the default, what
``train.py`` runs with), or raise."""
MAX_RETRIES = 3
"""Retries of an invalid reply, each quoting the error to the model (the default; no config field)."""


class RouterError(MetaAgentError):
    """The router got no usable answer and ``router_failure="raise"``: a run that relies on routing
    stops rather than silently sending every task to the base variant."""


# ---------------------------------------------------------------------------------------- agent
class LLMMetaAgent:
    """Planner, reviser and router over a ``ChatClient``, with validation, retries, a token
    ledger per stage and an optional disk cache of calls (``cache_dir``)."""

    def __init__(self, client: ChatClient, *, cache_dir: str | os.PathLike[str] | None = None,
                 max_retries: int = MAX_RETRIES, name: str = "llm",
                 router_failure: str = ROUTER_FAILURES[0]) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if router_failure not in ROUTER_FAILURES:
            raise ValueError(f"router_failure must be one of {list(ROUTER_FAILURES)}, got {router_failure!r}")
        self.router_failure = router_failure
        self.client = client
        self.name = name
        self.max_retries = max_retries
        self.cache = CallCache(cache_dir) if cache_dir is not None else None
        self.ledger = TokenLedger()

    def state_dict(self) -> dict[str, Any]:
        """Only the ledger: replies are reproduced from the disk cache on resume."""
        return {"ledger": self.ledger.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load(state["ledger"])

    def __repr__(self) -> str:
        return f"LLMMetaAgent(name={self.name!r}, client={self.client!r}, max_retries={self.max_retries})"

    # ------------------------------------------------------------------ calls
    def call(self, stage: str, messages: list[dict[str, str]]) -> str:
        """One model call, answered from the cache when the same prompt was seen (0 tokens). The
        prompt is sent (and cached) with secret values withheld (``withhold_secrets``): the endpoint
        is another party, and a task's text may quote a key."""
        messages = withhold_secrets(messages)
        schema = SCHEMAS[stage]
        model = str(getattr(self.client, "model", type(self.client).__name__))  # a client of one's own may have none
        if self.cache is not None:
            hit = self.cache.get(model, stage, messages, schema)
            if hit is not None:
                self.ledger.record(stage, cached=True)
                return hit.text
        start = time.perf_counter()
        text, prompt_tokens, completion_tokens = self.client.complete(messages, schema=schema, stage=stage)
        self.ledger.record(stage, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                           seconds=time.perf_counter() - start)
        if self.cache is not None:
            self.cache.put(model, stage, messages, schema, text, prompt_tokens, completion_tokens)
        return text

    def _converse(self, stage: str, messages: list[dict[str, str]], check: Callable[[str], tuple[T | None, str | None]],
                  accepted: Callable[[], int] = lambda: 0) -> tuple[T | None, str | None]:
        """Call, check, and quote the error back until ``check`` passes or retries run out.
        ``accepted`` says how many items of a partly valid reply were kept (the follow-up tells
        the model). Returns the checked value and the last error (None when it passed)."""
        value, error = None, None
        for attempt in range(1 + self.max_retries):
            text = self.call(stage, messages)
            value, error = check(text)
            if error is None:
                return value, None
            if attempt < self.max_retries:
                messages = [*messages, {"role": "assistant", "content": text},
                            {"role": "user", "content": follow_up(error, accepted())}]
        return value, error

    # ------------------------------------------------------------------ building proposals
    def build_proposal(self, item: dict[str, Any], harness: Harness, digest: Digest,
                       context: PlanContext) -> tuple[Proposal | None, str | None]:
        """A schema-valid proposal object → (Proposal, None), or (None, why it cannot be used)."""
        edits = []
        for j, raw in enumerate(item["edits"]):
            data = {k: v for k, v in raw.items() if v is not None}
            if data.get("spec") is not None:
                spec = {k: v for k, v in data["spec"].items() if v is not None}
                # an insert's new processor is named by the edit: the recorded edit and the harness must agree
                if data["op"] == "insert" and spec.setdefault("name", data["processor"]) != data["processor"]:
                    return None, (f"edit {j}: an insert names its new processor twice, differently: processor "
                                  f"{data['processor']!r} vs spec.name {spec['name']!r}")
                data["spec"] = spec
            try:
                edits.append(Edit.from_dict(data))
            except (TypeError, ValueError) as err:
                return None, f"edit {j} is malformed: {err}"
        current = harness
        for j, edit in enumerate(edits):
            try:
                check_proposed(current, edit)
                current = apply_edit(current, edit)
            except (ValueError, TypeError, KeyError) as err:  # the algebra's errors, a bad spec, a refused code
                return None, f"edit {j} ({edit.describe()}) does not apply: {type(err).__name__}: {err}"
        if current.id == harness.id:
            return None, "the edits leave the harness unchanged"
        known = {t for c in digest.clusters for t in c.task_ids} | set(digest.failed_task_ids) | set(
            digest.passed_task_ids)

        def scoped(ids: list[str]) -> list[str]:  # the Critic can only re-run this round's tasks
            return [t for t in ids if t in known] if known else list(ids)

        proposal = Proposal(
            hypothesis=item["hypothesis"], edits=edits, dimension=item["dimension"], cluster=item["cluster"],
            target_tasks=scoped(item["target_tasks"]), predicted_flips=scoped(item["predicted_flips"]),
            at_risk=scoped(item["at_risk"]), variant=context.variant, source=self.name,
        )
        if proposal.key() in context.rejected:
            return None, "these edits were already rejected for this variant; propose different ones"
        return proposal, None

    # ------------------------------------------------------------------ MetaAgent
    def propose(self, digest: Digest, harness: Harness, context: PlanContext) -> list[Proposal]:
        """Proposals from one conversation; a reply's valid proposals are kept while the invalid
        ones are sent back for correction, and those still invalid at the end are dropped. A
        digest without failure clusters has nothing to plan: no call is made."""
        if context.max_proposals < 0:
            raise ValueError(f"max_proposals must be >= 0, got {context.max_proposals}")
        if context.max_proposals == 0 or not digest.clusters:
            return []
        accepted: list[Proposal] = []

        def check(text: str) -> tuple[list[Proposal], str | None]:
            data, error = parse_reply(text, PLAN_SCHEMA)
            if error is not None:
                return accepted, error
            errors = []
            for i, item in enumerate(data["proposals"]):
                proposal, err = self.build_proposal(item, harness, digest, context)
                if err is not None:
                    errors.append(f"proposal {i}: {err}")
                elif all(proposal.key() != p.key() for p in accepted):
                    accepted.append(proposal)
            if not errors or len(accepted) >= context.max_proposals:
                return accepted, None
            return accepted, "; ".join(errors)

        messages = plan_messages(digest, harness, context)
        _, error = self._converse("plan", messages, check, lambda: len(accepted))
        if error is not None:
            log.warning("%s planner: dropped proposal(s) still invalid after %d retries: %s",
                        self.name, self.max_retries, error)
        return accepted[: context.max_proposals]

    def revise(self, proposal: Proposal, reason: str, digest: Digest, harness: Harness,
               context: PlanContext) -> Proposal | None:
        """A revised proposal with different edits, or None when the model gives up or keeps failing."""
        def check(text: str) -> tuple[Proposal | None, str | None]:
            data, error = parse_reply(text, REVISE_SCHEMA)
            if error is not None:
                return None, error
            if data.get("give_up") is True and "proposal" not in data:
                return None, None
            if "proposal" not in data or data.get("give_up"):
                return None, 'reply with either {"give_up": true} or {"proposal": {...}}, not both or neither'
            revised, error = self.build_proposal(data["proposal"], harness, digest, context)
            if revised is not None and revised.key() == proposal.key():
                return None, "the revision has the same edits as the rejected proposal; change them"
            return revised, error

        revised, error = self._converse("revise", revise_messages(proposal, reason, digest, harness, context), check)
        if error is not None:
            log.warning("%s reviser: gave up on a revision after %d retries: %s", self.name, self.max_retries, error)
            return None
        if revised is not None:
            revised.variant, revised.revision = proposal.variant, proposal.revision + 1
        return revised

    def route(self, task_text: str, options: dict[str, str], lessons: list[str]) -> tuple[str, float]:
        """(variant, confidence) for a task; ``options`` maps variant name → its record. When the
        model never gives a usable answer, or its endpoint fails (``MetaAgentError``): with
        ``router_failure="fallback"`` a logged warning and the first option with confidence 0.0 (no
        opinion), so the task goes to the base variant and the rollout goes on; with ``"raise"`` a
        ``RouterError`` saying why, for runs whose results mean nothing without routing."""
        if not options:
            raise ValueError("options must name at least one variant")

        def check(text: str) -> tuple[tuple[str, float] | None, str | None]:
            data, error = parse_reply(text, ROUTE_SCHEMA)
            if error is not None:
                return None, error
            if data["variant"] not in options:
                return None, f"variant must be one of {list(options)}, got {data['variant']!r}"
            return (data["variant"], float(data["confidence"])), None

        try:
            choice, error = self._converse("route", route_messages(task_text, options, lessons), check)
        except MetaAgentError as err:
            choice, error = None, f"{type(err).__name__}: {err}"
        if choice is None:
            if self.router_failure == "raise":
                raise RouterError(f"{self.name} router: no usable answer ({error}); router_failure=raise")
            log.warning("%s router: no usable answer (%s); falling back to %r with no confidence",
                        self.name, error, next(iter(options)))
            return next(iter(options)), 0.0
        return choice


# ----------------------------------------------------------------------------------- backends
def openai_meta_agent(base_url: str, model: str, *, api_key_env: str = MetaAgentConfig.api_key_env,
                      timeout_s: float = TIMEOUT_S, cache_dir: str | os.PathLike[str] | None = None,
                      max_retries: int = MAX_RETRIES,
                      request_retries: int = REQUEST_RETRIES,
                      router_failure: str = ROUTER_FAILURES[0]) -> LLMMetaAgent:
    """The ``openai`` backend: any OpenAI-compatible endpoint (OpenAI, a vLLM server, ...).
    ``request_retries``: the SDK's retries of a failed request; ``max_retries``: the agent's of an
    invalid reply."""
    client = OpenAIClient(base_url, model, api_key_env=api_key_env, timeout_s=timeout_s,
                          request_retries=request_retries)
    return LLMMetaAgent(client, cache_dir=cache_dir, max_retries=max_retries, name="openai",
                        router_failure=router_failure)


def hf_meta_agent(model_name_or_path: str = "smollm2", *, device: str = "cpu", max_new_tokens: int = 512,
                  cache_dir: str | os.PathLike[str] | None = None,
                  max_retries: int = MAX_RETRIES,
                  router_failure: str = ROUTER_FAILURES[0]) -> LLMMetaAgent:
    """The ``hf`` backend: a local transformers model."""
    client = HFClient(model_name_or_path, device=device, max_new_tokens=max_new_tokens)
    return LLMMetaAgent(client, cache_dir=cache_dir, max_retries=max_retries, name="hf",
                        router_failure=router_failure)
