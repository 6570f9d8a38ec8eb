"""Secret names, secret values, and their redaction from plain data and log records.

A run writes its config, logs, records, reports and trace exports; keys come from the environment
only (``meta_agent.api_key_env`` names the variable; wandb and huggingface_hub read theirs
themselves). This module says what a secret is and scrubs it from what a run writes:

- **names and values**: ``is_secret_name`` (whether a key or variable name names a secret),
  ``holds_secret`` (whether an environment variable holds one), ``secret_env_values`` (the values
  of such variables, plus those the environment held when the run started, ``remember_secrets``);
- **redaction** of what a run writes: ``redact`` replaces every secret value in the strings of a
  structure, ``redact_text`` in one string, ``contains_secret`` is the cheap test before a copy,
  and ``install_log_redaction`` filters log records (``RedactingFilter``; ``start_redaction`` also
  remembers the values, what a command does first). The write points call them: references
  (``ReferenceStore.put``), harness YAML (``Harness.to_yaml``: lineage, W&B artifacts),
  ``rounds.jsonl`` / ``lineage.jsonl``, checkpoint state, the meta-agent's call cache, the report,
  exports, ``config.yaml`` and the W&B config (``coevo.report.tracking.scrub``), W&B metrics and tables,
  ``coevo eval``'s and ``coevo stream``'s own files, and the meta-agent's prompts before they are
  sent (``coevo.meta.prompts.withhold_secrets``).

Two neighbours build on it: ``coevo.safety.traces`` (``redact_trace``: a trace's strings *and*
token ids, for the replay buffer and exports) and ``coevo.safety.refusal`` (configs, command-line
overrides and starting harness files that hold a secret are refused before anything is written,
rather than redacted). All three import nothing else of coevo.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
MIN_SECRET_LEN = 8
"""Shorter environment values ("1", "true") would collide with ordinary config values."""

_SECRET_WORD = re.compile(
    r"(?:^|_)(api_?key|key|token|secrets?|passwords?|passwd|pwd|passphrase|auth|authorization|credentials?|cookie|dsn)"
    r"(?:_|$)", re.IGNORECASE)
_SECRET_PART = re.compile(r"password|passwd|secret|credential|passphrase|api_?key|private_?key|access_?key",
                          re.IGNORECASE)
"""Words that name a secret wherever they stand (``PGPASSWORD``, ``MYSECRET``, ``DBPASSWD``)."""
_LOCATION_NAME = re.compile(r"_(?:PATH|FILE|DIR|HOME|SOCK|SOCKET|URL|URI|HOST|ENDPOINT|PORT|ENV)$", re.IGNORECASE)
"""Names that say where a secret lives or which variable holds it (``HF_TOKEN_PATH``,
``SSH_AUTH_SOCK``, ``meta_agent.api_key_env``), not a secret themselves."""
_NOT_SECRET = {"PWD", "OLDPWD"}  # the shell's working directories


# ---------------------------------------------------------------------------------- names and values
@functools.lru_cache(maxsize=4096)
def is_secret_name(name: object) -> bool:
    """Whether a key or variable name names a secret: a whole ``_``-separated word such as ``key``,
    ``token``, ``secret``, ``password``, ``pwd``, ``auth``, ``credentials`` (camelCase split first), or
    ``password`` / ``secret`` / ``credential`` / ``apikey`` anywhere in it. So ``hf_token``, ``apiKey``,
    ``OPENAI_API_KEY``, ``SERVICE_KEY`` and ``PGPASSWORD`` match, but ``max_new_tokens``,
    ``tokenizer`` and ``keyboard`` do not, nor do names of locations (``*_PATH``, ``*_FILE``,
    ``*_DIR``, ``*_SOCK``, ``*_URL``...), of other variables (``*_env``: ``meta_agent.api_key_env``
    holds a variable's name) and ``PWD``."""
    text = str(name)
    if text in _NOT_SECRET or _LOCATION_NAME.search(text):
        return False
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text).replace("-", "_").replace(".", "_")
    return _SECRET_WORD.search(snake) is not None or _SECRET_PART.search(snake) is not None


def holds_secret(env_name: str, value: str) -> bool:
    """Whether an environment variable holds a secret: a secret name (``OPENAI_API_KEY``, ``HF_TOKEN``,
    ``PGPASSWORD``) and 8+ characters. Variables that say where a secret lives (``HF_TOKEN_PATH``,
    ``WANDB_IDENTITY_TOKEN_FILE``, ``SSH_AUTH_SOCK``), and values that are an existing absolute path
    (``GOOGLE_APPLICATION_CREDENTIALS=/home/me/gcp.json``), hold a location, which may legitimately
    appear in configs and traces."""
    if len(value) < MIN_SECRET_LEN or not is_secret_name(env_name):
        return False
    return not (value.startswith("/") and os.path.exists(value))


_REMEMBERED: set[str] = set()
"""Secret values ``remember_secrets`` found, redacted for the rest of the process."""


def remember_secrets() -> None:
    """Keep redacting the secret values the environment holds now for the rest of the process, even
    if their variables are unset later (a run calls this when it starts)."""
    _REMEMBERED.update(secret_env_values())


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment variables that hold secrets (``holds_secret``), longest first so a
    key that contains another is replaced whole. Without ``environ`` (the process's environment),
    the values ``remember_secrets`` kept are included too."""
    env = os.environ if environ is None else environ
    found = {v for k, v in env.items() if holds_secret(k, v)}
    if environ is None:
        found |= _REMEMBERED
    return sorted(found, key=len, reverse=True)


# ---------------------------------------------------------------------------------- redaction
def redact_text(text: str, secrets: Sequence[str] | None = None) -> str:
    """``text`` with every secret value (default: ``secret_env_values()``) replaced by ``<redacted>``."""
    for secret in secret_env_values() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: object, secrets: Sequence[str] | None = None, *, by_name: bool = False) -> Any:
    """A copy of ``value`` (dicts, lists, tuples, strings at any depth) with secret values redacted.

    ``secrets`` defaults to ``secret_env_values()``. With ``by_name``, every value under a
    secret-named key becomes ``"<redacted>"`` too (what a config needs; a trace's data does not).
    Non-string leaves (token ids, log-probs) are returned as they are.
    """
    found = secret_env_values() if secrets is None else list(secrets)
    return _redact(value, found, by_name)


def _redact(value: object, secrets: list[str], by_name: bool) -> object:
    if isinstance(value, str):
        return redact_text(value, secrets) if secrets else value
    if isinstance(value, Mapping):
        return {_redact(k, secrets, False): REDACTED if by_name and is_secret_name(k) else _redact(v, secrets, by_name)
                for k, v in value.items()}
    if isinstance(value, list):
        if all(type(v) in (int, float) for v in value):
            return list(value)  # token ids / log-probs: nothing to redact, no per-item recursion
        return [_redact(v, secrets, by_name) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, secrets, by_name) for v in value)
    return value


_NUMERIC_FIELDS = {"prompt_ids", "completion_ids", "sampler_logprobs", "behaviour_logprobs"}


def contains_secret(value: object, secrets: Sequence[str] | None = None) -> bool:
    """Whether any string of ``value`` (dicts with their keys, lists, tuples, dataclasses such as a
    ``Trace``, at any depth) holds a secret value. The cheap test before a copy: it stops at the
    first hit, copies nothing and skips token-id and log-prob arrays."""
    found = secret_env_values() if secrets is None else list(secrets)
    return bool(found) and _contains(value, found)


def _contains(value: object, secrets: list[str]) -> bool:
    if isinstance(value, str):
        return any(s in value for s in secrets)
    if isinstance(value, Mapping):
        return any(_contains(k, secrets) or _contains(v, secrets) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if value and type(value[0]) in (int, float):
            return False  # ids / log-probs
        return any(_contains(v, secrets) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_contains(getattr(value, f.name), secrets) for f in dataclasses.fields(value)
                   if f.name not in _NUMERIC_FIELDS)
    return False


# ---------------------------------------------------------------------------------- log records
class RedactingFilter(logging.Filter):
    """A logging filter that redacts secret environment values from a record's message."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = secret_env_values()
        if secrets:
            message = record.getMessage()
            clean = redact_text(message, secrets)
            if clean != message:
                record.msg, record.args = clean, None
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a ``RedactingFilter`` to every handler of ``logger`` (default: the root logger, whose
    handlers Hydra points at the console and ``train.log``); idempotent."""
    target = logging.getLogger() if logger is None else logger
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def start_redaction() -> None:
    """What a command that writes files does first: redact log records and remember the secret values
    the environment holds now, so a variable an env or a client library unsets after reading it is
    still redacted from what the command writes (``coevo eval`` and ``coevo stream``; ``coevo.run``
    does the same for ``train.py`` and ``coevo evolve``)."""
    install_log_redaction()
    remember_secrets()
