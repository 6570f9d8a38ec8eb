"""Chat clients of the LLM meta-agent: the ``ChatClient`` protocol and its two implementations,
``OpenAIClient`` (any OpenAI-compatible endpoint, e.g. a vLLM server) and ``HFClient`` (a local
transformers model).

A client only turns messages into text and token counts; prompts, validation, retries, the
token ledger and the cache belong to the agent (``coevo.meta.llm``), so the ``openai`` and ``hf``
backends differ only by their client and a test can drive the agent with a scripted fake one. A
failure of the endpoint itself is a ``MetaAgentError`` (``LLMConnectionError`` when it cannot be
reached) naming the URL.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from coevo.config.schema import MetaAgentConfig
from coevo.evolution.meta_agent import MetaAgentError

if TYPE_CHECKING:
    import openai
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The OpenAI client's constants (defaults of its arguments; no config field: a run does not tune them).
TIMEOUT_S = 60.0
"""Seconds each HTTP request to the endpoint may take."""
REQUEST_RETRIES = 2
"""Retries of a failed request (connection error, timeout, HTTP 408, 409, 429, 5xx) by the SDK, with
its exponential backoff: the SDK's own default."""

log = logging.getLogger("coevo.meta")


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


def server_message(err: openai.APIStatusError) -> str:
    """What the server said in an error response: its ``error.message`` (the SDK's own message
    wraps the whole body, and differently across SDK versions), else the SDK's message."""
    body = err.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return inner["message"]
    return err.message


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
                 timeout_s: float = TIMEOUT_S,
                 request_retries: int = REQUEST_RETRIES, *,
                 temperature: float = 0.0) -> None:
        if not base_url:
            raise ValueError("base_url must be a URL such as http://localhost:8000/v1")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if request_retries < 0:
            raise ValueError(f"request_retries must be >= 0, got {request_retries}")
        from coevo.config.optional import require

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
        from openai.types import CompletionUsage
        from openai.types.chat import ChatCompletion

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
                    message = _excerpt(f"Error code: {err.status_code} - {server_message(err)}")
                    raise MetaAgentError(f"{self.base_url} failed the {stage} request: {message}") from err
                except json.JSONDecodeError as err:
                    raise MetaAgentError(f"{self.base_url} answered the {stage} request with a body that is not "
                                         f"JSON: {err}") from err
        # The SDK builds its models without validating the body: a body that is not JSON comes back as its text,
        # JSON that is not an object as it is, and a field the server left out reads None.
        choices = response.choices if isinstance(response, ChatCompletion) else None
        if not isinstance(choices, list):  # a JSON body of another shape, or text under another content type
            raise MetaAgentError(f"{self.base_url} answered the {stage} request with something that is not a chat "
                                 f"completion: {_excerpt(repr(response))}")
        text = (choices[0].message.content or "") if choices else ""
        usage = response.usage if isinstance(response.usage, CompletionUsage) else None  # or of a shape of its own
        if usage is None:
            return text, 0, 0
        return text, int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)


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
        self._loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None

    def __repr__(self) -> str:
        return f"HFClient(model={self.model!r}, device={self.device!r}, max_new_tokens={self.max_new_tokens})"

    def loaded(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """(model, tokenizer), loading them on first use."""
        if self._loaded is None:
            from coevo.policy.load import load_model

            self._loaded = load_model(self.model, device=self.device, seed=self.seed)
        return self._loaded

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The exact ids the model is prompted with."""
        _, tok = self.loaded()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any], stage: str) -> tuple[str, int, int]:
        import torch

        lm, tok = self.loaded()
        prompt = self.prompt_ids(messages)
        limit = getattr(lm.config, "max_position_embeddings", None)  # not every architecture's config has one
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
