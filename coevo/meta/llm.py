"""LLM meta-agent backends: the same Planner/reviser/router over any chat model.

``LLMMetaAgent`` owns the prompts, the JSON schemas of each stage, validation and retries, the
token ledger and the disk cache; a ``ChatClient`` only turns messages into text and token counts.
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
it as a warning of the round and goes on; ``route`` falls back to no opinion.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from coevo.config import MetaAgentConfig
from coevo.evolution.meta_agent import MetaAgentError, PlanContext, TokenLedger
from coevo.evolution.types import CAUSES, Digest, Proposal
from coevo.harness.edits import EDIT_OPS, Edit, apply_edit, check_proposed
from coevo.harness.harness import Harness
from coevo.harness.hooks import HOOK_ORDER, Dimension
from coevo.harness.library import PROCESSORS
from coevo.meta.cache import CallCache

log = logging.getLogger("coevo.meta")

T = TypeVar("T")

# ------------------------------------------------------------------------------------- schemas
EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": list(EDIT_OPS)},
        "processor": {"type": "string"},
        "spec": {
            "type": ["object", "null"],
            "properties": {
                "kind": {"type": "string"},
                "name": {"type": ["string", "null"]},
                "params": {"type": ["object", "null"]},
            },
            "required": ["kind"],
        },
        "param": {"type": ["string", "null"]},
        "value": {},
        "after": {"type": ["string", "null"]},
        "index": {"type": ["integer", "null"]},
    },
    "required": ["op", "processor"],
    "additionalProperties": False,
}

PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "hypothesis": {"type": "string"},
        "dimension": {"type": "string", "enum": [d.value for d in Dimension]},
        "cluster": {"type": ["string", "null"], "enum": [*CAUSES, None]},
        "target_tasks": {"type": "array", "items": {"type": "string"}},
        "predicted_flips": {"type": "array", "items": {"type": "string"}},
        "at_risk": {"type": "array", "items": {"type": "string"}},
        "edits": {"type": "array", "items": EDIT_SCHEMA, "minItems": 1},
    },
    "required": ["hypothesis", "dimension", "cluster", "target_tasks", "predicted_flips", "at_risk", "edits"],
    "additionalProperties": False,
}

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"proposals": {"type": "array", "items": PROPOSAL_SCHEMA}},
    "required": ["proposals"],
    "additionalProperties": False,
}

REVISE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"give_up": {"type": "boolean"}, "proposal": PROPOSAL_SCHEMA},
    "additionalProperties": False,
}

ROUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "variant": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["variant", "confidence"],
    "additionalProperties": False,
}

SCHEMAS: dict[str, dict[str, Any]] = {"plan": PLAN_SCHEMA, "revise": REVISE_SCHEMA, "route": ROUTE_SCHEMA}
"""stage → the JSON schema its reply must match."""

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _type_name(value: Any) -> str:
    return next((name for name, test in _JSON_TYPES.items() if test(value)), type(value).__name__)


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema``: the subset of JSON Schema the stage schemas use (type,
    enum, minimum/maximum, required, properties, additionalProperties: false, items,
    minItems). jsonschema is not a dependency, and the messages go back to the model verbatim,
    so each names the JSON path."""
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if not any(_JSON_TYPES[t](value) for t in allowed):
            return [f"{path}: expected {' or '.join(allowed)}, got {_type_name(value)}"]
    errors: list[str] = []
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        errors.append(f"{path}: must be one of {schema['enum']}, got {value!r}")
    if _JSON_TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: must be <= {schema['maximum']}, got {value}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing required property {name!r}" for name in schema.get("required", [])
                   if name not in value]
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                errors.append(f"{path}: unexpected properties {extra}; allowed: {sorted(props)}")
        for name, sub in props.items():
            if name in value:
                errors += schema_errors(value[name], sub, f"{path}.{name}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: needs at least {schema['minItems']} item(s), got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def parse_reply(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(data, None) or (None, error). Tolerates code fences and prose around the first JSON object,
    which small models often add; the schema decides whether the content is usable."""
    body = text.strip()
    start = body.find("{")
    if start < 0:
        return None, f"the reply holds no JSON object (it starts {body[:60]!r})"
    try:
        data, _ = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError as err:
        return None, f"invalid JSON: {err}"
    errors = schema_errors(data, schema)
    if errors:
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        return None, "the JSON does not match the schema: " + "; ".join(errors[:5]) + more
    return data, None


# -------------------------------------------------------------------------------------- clients
class ChatClient(Protocol):
    """Turns chat messages into a reply. ``model`` identifies the model in cache keys."""

    model: str

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any], stage: str) -> tuple[str, int, int]:
        """(reply text, prompt tokens, completion tokens). ``schema`` may be enforced by the
        server; the agent validates the reply either way."""
        ...


class LLMConnectionError(MetaAgentError, ConnectionError):
    """The endpoint could not be reached; the message names the URL and the timeout."""


def _unsupported_format(err: Exception) -> bool:
    """Whether a 400 error says the server does not support the requested response_format."""
    text = str(err).lower()
    about_format = any(w in text for w in ("response_format", "json_schema", "response format", "structured"))
    unsupported = any(w in text for w in ("unsupported", "not supported", "does not support", "not support"))
    return about_format and unsupported


def _excerpt(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut at ``limit`` characters: a server's error page can be long HTML."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OpenAIClient:
    """An OpenAI-compatible chat endpoint through the ``openai`` package.

    The API key is read from the environment variable ``api_key_env`` at each call and lives only
    in a local client, so it never reaches this object's attributes, ``repr``, logs or the cache
    (unset: a placeholder, as local vLLM servers need none). Structured output is requested with a
    JSON schema and downgraded once to ``json_object`` if the server says it does not support it.

    Transient failures (connection errors, timeouts, HTTP 408, 409, 429 and 5xx) are retried by
    the SDK itself, ``request_retries`` times with its exponential backoff (or the server's
    Retry-After); each request waits at most ``timeout_s``. Whatever still fails, and a 200 whose
    body is not a chat completion (which the SDK does not retry), is a ``MetaAgentError`` naming
    the URL: AEGIS then goes on without this call's proposals (``coevo.evolution.engine``).
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = MetaAgentConfig.api_key_env,
                 timeout_s: float = MetaAgentConfig.timeout_s, request_retries: int = 2, *,
                 temperature: float = 0.0) -> None:
        if not base_url:
            raise ValueError("base_url must be a URL such as http://localhost:8000/v1")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if request_retries < 0:
            raise ValueError(f"request_retries must be >= 0, got {request_retries}")
        from coevo.optional import require

        require("openai", "the openai meta-agent (meta_agent=openai)")  # fail when built, not mid-round
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.request_retries = request_retries
        self.temperature = float(temperature)
        self.json_schema_supported = True

    def __repr__(self) -> str:
        return (f"OpenAIClient(base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env!r}, timeout_s={self.timeout_s}, "
                f"request_retries={self.request_retries})")

    def _response_format(self, schema: dict[str, Any], stage: str) -> dict[str, Any]:
        if self.json_schema_supported:
            return {"type": "json_schema", "json_schema": {"name": f"coevo_{stage}", "schema": schema, "strict": False}}
        return {"type": "json_object"}

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any], stage: str) -> tuple[str, int, int]:
        import openai

        api_key = os.environ.get(self.api_key_env) or "unused"
        with openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=self.timeout_s,
                           max_retries=self.request_retries) as client:
            while True:
                try:
                    response = client.chat.completions.create(
                        model=self.model, messages=messages, temperature=self.temperature,
                        response_format=self._response_format(schema, stage),
                    )
                    break
                except openai.APIConnectionError as err:  # APITimeoutError included
                    attempts = 1 + self.request_retries
                    raise LLMConnectionError(
                        f"could not reach {self.base_url} (timeout {self.timeout_s:g}s) after {attempts} "
                        f"attempt{'s' if attempts > 1 else ''}: {type(err).__name__}: {err}") from err
                except openai.APIStatusError as err:
                    if (isinstance(err, openai.BadRequestError) and self.json_schema_supported
                            and _unsupported_format(err)):
                        log.info("%s does not support json_schema output; using json_object", self.base_url)
                        self.json_schema_supported = False
                        continue
                    # the SDK's message reads "Error code: 500 - <the server's message>"
                    message = _excerpt(err.message)
                    raise MetaAgentError(f"{self.base_url} failed the {stage} request: {message}") from err
                except json.JSONDecodeError as err:
                    raise MetaAgentError(f"{self.base_url} answered the {stage} request with a body that is not "
                                         f"JSON: {err}") from err
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list):  # a JSON body of another shape, or text under another content type
            raise MetaAgentError(f"{self.base_url} answered the {stage} request with something that is not a chat "
                                 f"completion: {_excerpt(repr(response))}")
        text = (choices[0].message.content or "") if choices else ""
        usage = getattr(response, "usage", None)
        return text, int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)


class HFClient:
    """A local transformers model: the tokenizer's chat template, then greedy generation.

    Token counts are exact: the prompt ids fed to ``generate`` and the ids it returned. There is
    no constrained decoding, so the schema reaches the model only through the prompt. The model
    is loaded on the first call (``coevo.policy.load.load_model``: a name such as ``smollm2`` or
    ``tiny``, or a local directory).
    """

    def __init__(self, model_name_or_path: str, device: str = "cpu", max_new_tokens: int = 512, *,
                 seed: int = 0) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model_name_or_path
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self._lm: Any = None
        self._tok: Any = None

    def __repr__(self) -> str:
        return f"HFClient(model={self.model!r}, device={self.device!r}, max_new_tokens={self.max_new_tokens})"

    def loaded(self) -> tuple[Any, Any]:
        """(model, tokenizer), loading them on first use."""
        if self._lm is None:
            from coevo.policy.load import load_model

            self._lm, self._tok = load_model(self.model, device=self.device, seed=self.seed)
        return self._lm, self._tok

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The exact ids the model is prompted with."""
        _, tok = self.loaded()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any], stage: str) -> tuple[str, int, int]:
        import torch

        lm, tok = self.loaded()
        prompt = self.prompt_ids(messages)
        limit = getattr(lm.config, "max_position_embeddings", None)
        if limit is not None and len(prompt) + self.max_new_tokens > limit:
            raise MetaAgentError(
                f"{stage} prompt of {len(prompt)} tokens + max_new_tokens {self.max_new_tokens} exceeds the "
                f"context of {self.model!r} ({limit} tokens)")
        ids = torch.tensor([prompt], device=lm.device)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        with torch.no_grad():
            out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                              do_sample=False, pad_token_id=pad, eos_token_id=tok.eos_token_id)
        completion = out[0, len(prompt):].tolist()  # one sequence: no padding to strip
        return tok.decode(completion, skip_special_tokens=True), len(prompt), len(completion)


# -------------------------------------------------------------------------------------- prompts
def harness_summary(harness: Harness) -> str:
    """One line per processor: instance name, kind, hook, dimension, group, every parameter."""
    lines = [f"harness {harness.id} ({len(harness)} processors, in firing order):"]
    for p in harness:
        group = f", group {p.group}" if p.group else ""
        lines.append(f"- {p.name}: kind {p.kind} at {p.hook.value} ({p.dimension.value}{group}); "
                     f"params {json.dumps(dict(p.config), default=str)}")
    return "\n".join(lines)


def processor_catalogue() -> str:
    """Every processor kind a spec may name, with its hook, parameters and what it does."""
    def order(kind: str) -> tuple[int, str]:
        hook = getattr(PROCESSORS[kind], "hook", None)
        return (HOOK_ORDER.index(hook) if hook in HOOK_ORDER else len(HOOK_ORDER), kind)

    lines = []
    for kind in sorted(PROCESSORS, key=order):
        cls = PROCESSORS[kind]
        hook = getattr(cls, "hook", None)
        where = (f"at {hook.value} ({cls.dimension.value})" if hook is not None
                 else "at the hook its base class declares")
        group = f", singleton group {cls.group}" if cls.group else ""
        after = f", runs after {sorted(cls.runs_after)}" if cls.runs_after else ""
        lines.append(f"- {kind} {where}{group}{after}: {cls.description}")
        for p in cls.params:
            choices = f" one of {list(p.choices)}" if p.choices else ""
            lines.append(f"    {p.name} ({p.type}{choices}, default {json.dumps(p.default)}): {p.description}")
    return "\n".join(lines)


def _task_ids(digest: Digest) -> str:
    lines = [f"- {c.cause}: {', '.join(c.task_ids)}" for c in digest.clusters]
    lines.append(f"- passed: {', '.join(digest.passed_task_ids) or '(none)'}")
    return "\n".join(lines)


def _demo_text(turns: list[dict[str, Any]]) -> str:
    """One demonstration, a turn a line: the JSON a ``few_shot`` ``turns`` edit may quote as it is."""
    return "- " + "\n  ".join(json.dumps(t, ensure_ascii=False) for t in turns)


def _context_text(context: PlanContext) -> str:
    demos = "\n".join(_demo_text(d) for d in context.demos)
    lessons = "\n".join(f"- {x}" for x in context.lessons)
    rejected = "\n".join(f"- {k}" for k in sorted(context.rejected))
    return (
        f"variant: {context.variant}, round {context.round}\n"
        f"dimension priorities (default 1.0): {json.dumps(context.priorities, sort_keys=True)}\n"
        f"environment tools: {', '.join(context.tools) or '(none)'}\n"
        f"demonstrations you may quote (from reference trajectories; as few_shot turns, one turn a line):\n"
        f"{demos or '(none)'}\n"
        f"lessons from earlier verdicts:\n{lessons or '(none)'}\n"
        f"rejected edits (do not propose again):\n{rejected or '(none)'}"
    )


EDIT_RULES = (
    "Edits apply in order:\n"
    '- {"op": "insert", "processor": NEW_NAME, "spec": {"kind": KIND, "name": NEW_NAME, "params": {...}}} adds a '
    'processor of a catalogue kind at its hook (optionally "after": EXISTING_NAME or "index": position in the hook);\n'
    '- {"op": "set_param", "processor": EXISTING_NAME, "param": PARAM, "value": VALUE} changes one parameter;\n'
    '- {"op": "replace", "processor": EXISTING_NAME, "spec": {...}} swaps a processor for one at the same hook;\n'
    '- {"op": "remove", "processor": EXISTING_NAME}.\n'
    "Use only catalogue kinds, their parameter names and types; address existing processors by instance name; a "
    "singleton group admits one processor; never repeat a rejected edit; the only task text an edit may quote is "
    "the demonstrations given. On small models one worked demonstration of the answer format moves pass rates "
    "more than any instruction, so context, tool and answer-format edits come first."
)


def _system(role: str, schema: dict[str, Any]) -> dict[str, str]:
    return {"role": "system", "content": f"{role}\n\nReply with one JSON object and nothing else, matching this "
                                         f"JSON schema:\n{json.dumps(schema)}"}


def plan_messages(digest: Digest, harness: Harness, context: PlanContext) -> list[dict[str, str]]:
    role = (
        "You are the Planner of AEGIS, which evolves the harness around a small language-model agent: the "
        "processors that assemble its prompt, parse its replies, run its tools and end its episodes. From a digest "
        "of the last round's failures, propose hypotheses, each tested by typed edits to the harness, with its "
        "scope: the failure cluster it addresses, target_tasks and predicted_flips (failed task ids it should fix) "
        "and at_risk (passed task ids it could break).\n" + EDIT_RULES
    )
    user = (
        f"## Digest\n{digest.text()}\n\n## Task ids\n{_task_ids(digest)}\n\n## Harness\n{harness_summary(harness)}\n\n"
        f"## Processor catalogue\n{processor_catalogue()}\n\n## Context\n{_context_text(context)}\n\n"
        f"Propose at most {context.max_proposals} proposal(s), most promising first."
    )
    return [_system(role, PLAN_SCHEMA), {"role": "user", "content": user}]


def revise_messages(proposal: Proposal, reason: str, digest: Digest, harness: Harness,
                    context: PlanContext) -> list[dict[str, str]]:
    role = (
        "You are the reviser of AEGIS. The Critic rejected a proposed harness edit before running it. Answer its "
        'reason with a revised proposal, {"proposal": {...}}, whose edits differ from the rejected ones, or give up '
        'with {"give_up": true} when the idea cannot be saved.\n' + EDIT_RULES
    )
    shown = {k: v for k, v in proposal.to_dict().items() if k in PROPOSAL_SCHEMA["properties"]}
    user = (
        f"## Rejected proposal\n{json.dumps(shown, indent=1, default=str)}\n\n## Critic's reason\n{reason}\n\n"
        f"## Digest\n{digest.text()}\n\n## Task ids\n{_task_ids(digest)}\n\n## Harness\n{harness_summary(harness)}\n\n"
        f"## Processor catalogue\n{processor_catalogue()}\n\n## Context\n{_context_text(context)}"
    )
    return [_system(role, REVISE_SCHEMA), {"role": "user", "content": user}]


def route_messages(task_text: str, options: dict[str, str], lessons: list[str]) -> list[dict[str, str]]:
    role = (
        "You route a task to the harness variant most likely to solve it. Each variant is a harness evolved for "
        "some kind of task; its record says how it did. Give the variant's name and your confidence in [0, 1]."
    )
    variants = "\n".join(f"- {name}: {record}" for name, record in options.items())
    user = (f"## Task\n{task_text}\n\n## Variants\n{variants}\n\n## Routing lessons\n"
            + ("\n".join(f"- {x}" for x in lessons) or "(none)"))
    return [_system(role, ROUTE_SCHEMA), {"role": "user", "content": user}]


def _follow_up(error: str, accepted: int = 0) -> str:
    kept = (f"{accepted} proposal(s) were accepted; send corrected versions of the others only. "
            if accepted else "")
    return f"Your reply could not be used: {error}\n{kept}Reply again with the corrected JSON object only."


# ---------------------------------------------------------------------------------------- agent
class LLMMetaAgent:
    """Planner, reviser and router over a ``ChatClient``, with validation, retries, a token
    ledger per stage and an optional disk cache of calls (``cache_dir``)."""

    def __init__(self, client: ChatClient, *, cache_dir: str | os.PathLike[str] | None = None,
                 max_retries: int = MetaAgentConfig.max_retries, name: str = "llm") -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
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
        """One model call, answered from the cache when the same prompt was seen (0 tokens)."""
        schema = SCHEMAS[stage]
        model = str(getattr(self.client, "model", type(self.client).__name__))
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
                            {"role": "user", "content": _follow_up(error, accepted())}]
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
        model never gives a usable answer, or its endpoint fails (``MetaAgentError``): the first
        option with confidence 0.0 (no opinion), so a router can fall back on prior records and the
        rollout goes on."""
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
            log.warning("%s router: no usable answer (%s); falling back to %r with no confidence",
                        self.name, error, next(iter(options)))
            return next(iter(options)), 0.0
        return choice


# ----------------------------------------------------------------------------------- backends
def openai_meta_agent(base_url: str, model: str, *, api_key_env: str = MetaAgentConfig.api_key_env,
                      timeout_s: float = MetaAgentConfig.timeout_s, cache_dir: str | os.PathLike[str] | None = None,
                      max_retries: int = MetaAgentConfig.max_retries) -> LLMMetaAgent:
    """The ``openai`` backend: any OpenAI-compatible endpoint (OpenAI, a vLLM server, ...)."""
    client = OpenAIClient(base_url, model, api_key_env=api_key_env, timeout_s=timeout_s)
    return LLMMetaAgent(client, cache_dir=cache_dir, max_retries=max_retries, name="openai")


def hf_meta_agent(model_name_or_path: str = "smollm2", *, device: str = "cpu", max_new_tokens: int = 512,
                  cache_dir: str | os.PathLike[str] | None = None,
                  max_retries: int = MetaAgentConfig.max_retries) -> LLMMetaAgent:
    """The ``hf`` backend: a local transformers model."""
    client = HFClient(model_name_or_path, device=device, max_new_tokens=max_new_tokens)
    return LLMMetaAgent(client, cache_dir=cache_dir, max_retries=max_retries, name="hf")
