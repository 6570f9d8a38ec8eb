"""Redacting secret values from a trace: its strings and the token ids of its model calls.

A trace's prompt and completion ids are exported (``grpo`` format) and trained on; an id sequence
that decodes to a key hands the key to whoever decodes it, so redacting the trace's strings
(``coevo.safety.secrets.redact``) is not enough. ``redact_trace`` rewrites the ids too, re-encoding only
the tokens that spell a secret when the policy's tokenizer is at hand. The write points call it:
the replay buffer's traces (``coevo.loop.coevolution``, right after the rollout), references
(``ReferenceStore.put``) and exports (``coevo.report.export``).

It duck-types the trace (``to_dict`` / ``from_dict``, ``model_calls``, ``behaviour_logprobs``), so
like ``coevo.safety.secrets`` it imports nothing of coevo but that module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from coevo.safety.secrets import contains_secret, redact, redact_text, secret_env_values

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TraceCall(Protocol):
    """What ``redact_trace`` reads and rewrites of a model call (a ``coevo.agent.trace.ModelCall``)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float] | None
    trainable: bool

    @property
    def messages(self) -> Sequence[Mapping[str, object]]: ...

    @property
    def text(self) -> str: ...

    @property
    def reply_prefix(self) -> str: ...


class RedactableTrace(Protocol):
    """What ``redact_trace`` needs of a trace (a ``coevo.agent.trace.Trace``)."""

    @property
    def model_calls(self) -> Sequence[TraceCall]: ...

    @property
    def behaviour_logprobs(self) -> list[list[float]] | None: ...

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self: ...


TraceT = TypeVar("TraceT", bound=RedactableTrace)


def redact_trace(trace: TraceT, tokenizer: PreTrainedTokenizerBase | None = None,
                 secrets: Sequence[str] | None = None) -> TraceT:
    """``trace`` (a ``coevo.agent.trace.Trace``) with no secret value in its strings or token ids;
    the trace itself when it holds none (the common case: one substring scan, no copy), else a copy.

    Strings are redacted by ``redact``. The token ids of each model call must not decode to a
    secret either (an export of ``prompt_ids`` would hand the key to whoever decodes them):

    - with the policy's ``tokenizer``, the shortest run of tokens whose text holds the secret is
      re-encoded from its redacted text; every other token stays as the policy saw or produced it.
      A call whose *completion* changed is no longer what the model sampled: it becomes not
      trainable and loses its sampler log-probs. A call whose prompt alone changed stays trainable
      (its completion tokens are the sampled ones; the replay buffer computes behaviour log-probs
      from the stored, redacted ids, so training is consistent with what is stored);
    - without one (or if re-encoding cannot remove the secret), a call whose text shows a secret
      loses its token ids and sampler log-probs and becomes not trainable.

    Meant for traces before they enter the replay buffer; on a trace that already has behaviour
    log-probs, a call whose completion changes loses its completion ids and their row.
    """
    found = secret_env_values() if secrets is None else list(secrets)
    if not contains_secret(trace, found):
        return trace
    out = type(trace).from_dict(redact(trace.to_dict(), found))  # the trace's own class: no import of coevo.agent
    for k, (before, call) in enumerate(zip(trace.model_calls, out.model_calls, strict=True)):
        completion_changed = _redact_call_ids(before, call, tokenizer, found)
        if completion_changed:
            call.trainable, call.sampler_logprobs = False, None
            if out.behaviour_logprobs is not None and k < len(out.behaviour_logprobs):
                call.completion_ids, out.behaviour_logprobs[k] = [], []
    return out


def _redact_call_ids(before: TraceCall, call: TraceCall, tokenizer: PreTrainedTokenizerBase | None,
                     secrets: list[str]) -> bool:
    """Rewrite ``call``'s ids in place (see ``redact_trace``); whether its completion ids changed."""
    if tokenizer is None:
        if not contains_secret([before.messages, before.text, before.reply_prefix], secrets):
            return False
        call.prompt_ids, call.completion_ids = [], []
        return True

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    changed = False
    for name in ("prompt_ids", "completion_ids"):
        ids = list(getattr(call, name))
        if not ids or not any(s in decode(ids) for s in secrets):
            continue
        clean = _scrub_ids(ids, secrets, decode, encode)
        setattr(call, name, [] if clean is None else clean)
        if name == "prompt_ids" and clean is None:
            call.completion_ids = []  # a completion without its prompt cannot be trained
            return True
        changed = changed or name == "completion_ids"
    return changed


def _scrub_ids(ids: list[int], secrets: list[str], decode: Callable[[Sequence[int]], str],
               encode: Callable[[str], list[int]]) -> list[int] | None:
    """``ids`` with each secret's shortest covering token run re-encoded from its redacted text;
    the whole text re-encoded when that does not work; None when neither removes every secret."""
    for _ in range(64):  # one occurrence (at least) per pass
        text = decode(ids)
        secret = next((s for s in secrets if s in text), None)
        if secret is None:
            return ids
        start, end = _covering_run(ids, secret, decode)
        new = ids[:start] + encode(redact_text(decode(ids[start:end]), secrets)) + ids[end:]
        if new == ids:
            break
        ids = new
    whole = encode(redact_text(decode(ids), secrets))
    return whole if not any(s in decode(whole) for s in secrets) else None


def _covering_run(ids: list[int], secret: str, decode: Callable[[Sequence[int]], str]) -> tuple[int, int]:
    """The shortest ``ids[start:end]`` whose text holds ``secret`` (its first occurrence), by two
    binary searches over decoded prefixes and suffixes (a few decodes, not one per token)."""
    lo, hi = 1, len(ids)
    while lo < hi:  # the shortest prefix holding the secret
        mid = (lo + hi) // 2
        if secret in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    end = lo
    lo, hi = 0, end - 1
    while lo < hi:  # the latest start that still holds it
        mid = (lo + hi + 1) // 2
        if secret in decode(ids[mid:end]):
            lo = mid
        else:
            hi = mid - 1
    start = lo
    if secret not in decode(ids[start:end]):  # a decoder whose prefixes are not monotone
        return 0, len(ids)
    return start, end
