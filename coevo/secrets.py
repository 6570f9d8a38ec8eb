"""Keeping API keys and tokens out of everything a run writes.

A run writes its config three times (Hydra's ``.hydra/{config,overrides,hydra}.yaml``, our
``config.yaml`` and the W&B run config), W&B's own files (its run log records the command line,
group and tags), logs (``train.log``), records, reports and trace exports. Keys come from the
environment only (``meta_agent.api_key_env`` names the variable; wandb and huggingface_hub read
theirs themselves), and two rules keep them there:

1. **Refuse** a config that holds a secret, before anything is written: ``refuse_secrets`` names
   every offending field (never the value) and says where the key belongs. Hydra writes
   ``.hydra/`` and names sweep directories before the task function runs, so the check also runs
   as a Hydra callback (``RefuseSecrets``, registered in ``configs/train.yaml``) on the composed
   config and the raw command-line overrides; ``coevo.run`` runs it again on the typed config for
   callers that bypass Hydra. Refusing (rather than redacting) is the choice because a redacted
   value would silently change what the run does, and a resumed run could not compare configs.
2. **Redact** what a run writes: ``redact`` replaces every secret value in the strings of a
   structure (``secret_env_values``: the values of secret-named environment variables, see
   ``holds_secret``, plus those the environment held when the run started, ``remember_secrets``),
   and ``redact_trace`` also rewrites the token ids of a trace's model calls so that none decodes
   to a secret. The write points call them: the replay buffer's traces (``coevo.loop``, right
   after the rollout), references (``ReferenceStore.put``), harness YAML (``Harness.to_yaml``:
   lineage, W&B artifacts), ``rounds.jsonl`` / ``lineage.jsonl``, checkpoint state, the
   meta-agent's call cache, the report, exports, ``config.yaml`` and the W&B config
   (``coevo.tracking.scrub``), W&B metrics and tables; ``install_log_redaction`` filters log records.

A starting harness (``harness.start``) that holds a secret value is refused like a config value:
redacting it would change what the run does, and its id (a hash of its content) with it.

What counts as a secret in a config value (``secret_reason``): the value of a secret-named
environment variable anywhere in it; a known key format (``sk-...``, ``hf_...``, ``ghp_...``,
``AKIA...``, ``xox?-...``, ``AIza...``, ``glpat-...``, ``Bearer ...``); a URL with a password or a
key-like query parameter; a whole value that is one long opaque token (24+ letters and digits
without ``_``/``-`` word breaks, e.g. a 40-hex W&B key); any value under a secret-named key
(``env.args.api_token=...``); and, for a ``*_env`` field such as ``meta_agent.api_key_env``,
anything but an environment-variable name.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from hydra.experimental.callback import Callback

REDACTED = "<redacted>"
MIN_SECRET_LEN = 8
"""Shorter environment values ("1", "true") would collide with ordinary config values."""

_SECRET_WORD = re.compile(
    r"(?:^|_)(api_?key|key|token|secrets?|passwords?|passwd|pwd|passphrase|auth|authorization|credentials?|cookie|dsn)"
    r"(?:_|$)", re.IGNORECASE)
_SECRET_PART = re.compile(r"password|passwd|secret|credential|passphrase|api_?key|private_?key|access_?key",
                          re.IGNORECASE)
"""Words that name a secret wherever they stand (``PGPASSWORD``, ``MYSECRET``, ``DBPASSWD``)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOCATION_NAME = re.compile(r"_(?:PATH|FILE|DIR|HOME|SOCK|SOCKET|URL|URI|HOST|ENDPOINT|PORT|ENV)$", re.IGNORECASE)
"""Names that say where a secret lives or which variable holds it (``HF_TOKEN_PATH``,
``SSH_AUTH_SOCK``, ``meta_agent.api_key_env``), not a secret themselves."""
_NOT_SECRET = {"PWD", "OLDPWD"}  # the shell's working directories
_KEY_FORMATS = {
    "an OpenAI/Anthropic-style key (sk-...)": re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}"),
    "a Hugging Face token (hf_...)": re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"),
    "a GitHub token": re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    "a Slack token": re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"),
    "an AWS access key id": re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])"),
    "a Google API key": re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}"),
    "a GitLab token": re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_-]{20,}"),
    "a bearer token": re.compile(r"(?i)(?<![A-Za-z0-9])bearer\s+[A-Za-z0-9._~+/=-]{16,}"),
}
_OPAQUE = re.compile(r"[A-Za-z0-9_-]{24,}")
_OPAQUE_RUN = 24  # a random key has no word breaks; run names like exp_2024_10_01_lr1e5 do
_URL_SECRET_PARAMS = {"key", "sig", "signature", "auth", "pass", "pwd", "code"}


class SecretInConfigError(ValueError):
    """A config field holds what looks like a key or token; the message names the fields, never the values."""


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


def _secret_env_names(environ: Mapping[str, str] | None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {v: k for k, v in sorted(env.items()) if holds_secret(k, v)}


# ---------------------------------------------------------------------------------- redaction
def redact_text(text: str, secrets: Sequence[str] | None = None) -> str:
    """``text`` with every secret value (default: ``secret_env_values()``) replaced by ``<redacted>``."""
    for secret in secret_env_values() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: Any, secrets: Sequence[str] | None = None, *, by_name: bool = False) -> Any:
    """A copy of ``value`` (dicts, lists, tuples, strings at any depth) with secret values redacted.

    ``secrets`` defaults to ``secret_env_values()``. With ``by_name``, every value under a
    secret-named key becomes ``"<redacted>"`` too (what a config needs; a trace's data does not).
    Non-string leaves (token ids, log-probs) are returned as they are.
    """
    found = secret_env_values() if secrets is None else list(secrets)
    return _redact(value, found, by_name)


def _redact(value: Any, secrets: list[str], by_name: bool) -> Any:
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


def contains_secret(value: Any, secrets: Sequence[str] | None = None) -> bool:
    """Whether any string of ``value`` (dicts with their keys, lists, tuples, dataclasses such as a
    ``Trace``, at any depth) holds a secret value. The cheap test before a copy: it stops at the
    first hit, copies nothing and skips token-id and log-prob arrays."""
    found = secret_env_values() if secrets is None else list(secrets)
    return bool(found) and _contains(value, found)


def _contains(value: Any, secrets: list[str]) -> bool:
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


# ---------------------------------------------------------------------------------- token ids
def redact_trace(trace: Any, tokenizer: Any | None = None, secrets: Sequence[str] | None = None) -> Any:
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
    if not found or not _contains(trace, found):
        return trace
    out = type(trace).from_dict(redact(trace.to_dict(), found))  # the trace's own class: no import of coevo.agent
    for k, (before, call) in enumerate(zip(trace.model_calls, out.model_calls, strict=True)):
        completion_changed = _redact_call_ids(before, call, tokenizer, found)
        if completion_changed:
            call.trainable, call.sampler_logprobs = False, None
            if out.behaviour_logprobs is not None and k < len(out.behaviour_logprobs):
                call.completion_ids, out.behaviour_logprobs[k] = [], []
    return out


def _redact_call_ids(before: Any, call: Any, tokenizer: Any | None, secrets: list[str]) -> bool:
    """Rewrite ``call``'s ids in place (see ``redact_trace``); whether its completion ids changed."""
    if tokenizer is None:
        if not _contains([before.messages, before.text, before.reply_prefix], secrets):
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


def _scrub_ids(ids: list[int], secrets: list[str], decode: Any, encode: Any) -> list[int] | None:
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


def _covering_run(ids: list[int], secret: str, decode: Any) -> tuple[int, int]:
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


# ---------------------------------------------------------------------------------- detection
def looks_like_key(text: str) -> str | None:
    """Why ``text`` looks like a key or token by its shape alone (None when it does not)."""
    for what, pattern in _KEY_FORMATS.items():
        if pattern.search(text):
            return what
    if "://" in text:
        reason = _url_credentials(text)
        if reason:
            return reason
    for piece in text.split(","):  # a sweep override lists values with commas
        piece = piece.strip()
        if (_OPAQUE.fullmatch(piece) and re.search(r"[0-9]", piece) and re.search(r"[A-Za-z]", piece)
                and max(len(word) for word in re.split(r"[_-]", piece)) >= _OPAQUE_RUN):
            return "a long opaque token"
    return None


def _url_credentials(text: str) -> str | None:
    for url in re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,'\"]+", text):
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            continue
        if password:
            return "a URL with a password"
        for name, value in parse_qsl(parts.query, keep_blank_values=False):
            if value and (is_secret_name(name) or name.lower() in _URL_SECRET_PARAMS):
                return f"a URL with a {name!r} query parameter"
    return None


def secret_reason(field: str, value: object, environ: Mapping[str, str] | None = None) -> str | None:
    """Why config field ``field`` (a dotted key) must not hold ``value``; None when it may."""
    if value is None or isinstance(value, (bool, int, float)):
        return None
    text = str(value)
    leaf = field.rsplit(".", 1)[-1]
    for secret, name in _secret_env_names(environ).items():
        if secret in text:
            return f"it holds the value of the environment variable {name}"
    if leaf.lower().endswith("_env"):  # names an environment variable, e.g. meta_agent.api_key_env
        if not _ENV_NAME.fullmatch(text) or looks_like_key(text):
            return "it must hold the NAME of an environment variable (e.g. OPENAI_API_KEY), not a key"
        return None
    if is_secret_name(leaf) and text.strip():
        return "a secret-named field may not hold a value; read it from the environment"
    shape = looks_like_key(text)
    return f"it looks like {shape}" if shape else None


def find_secrets(config: Any, environ: Mapping[str, str] | None = None, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted field, reason) for every leaf of a config tree (dicts and lists) that holds a secret."""
    found: list[tuple[str, str]] = []
    if isinstance(config, Mapping):
        for key, value in config.items():
            found += find_secrets(value, environ, f"{prefix}{key}.")
        return found
    if isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            found += find_secrets(value, environ, f"{prefix}{i}.")
        return found
    field = prefix.rstrip(".") or "<config>"
    reason = secret_reason(_parent_named(field), config, environ)
    return [(field, reason)] if reason else []


def _parent_named(field: str) -> str:
    """List items are judged by the name of their list (``logger.tags.0`` as ``logger.tags``)."""
    parts = field.split(".")
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return ".".join(parts)


def find_in_overrides(overrides: Iterable[str], environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(field, reason) for every command-line override (``key=value``, ``+key=value``, sweeps) that
    holds a secret. These are checked as typed, because Hydra writes them to ``.hydra/overrides.yaml``
    and sweep directory names before any task code runs."""
    found = []
    for override in overrides:
        key, sep, value = str(override).partition("=")
        if not sep:
            continue
        field = key.lstrip("+~").strip()
        reason = secret_reason(field, value, environ)
        if reason:
            found.append((f"{field} (command-line override)", reason))
    return found


def find_in_harness_file(path: str | Path, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the harness YAML file ``path`` may not start a run (None when it may): it holds the value
    of a secret environment variable (as written, or once its YAML is read). A run writes its
    harnesses to ``lineage/``, checkpoints and W&B; redacting one there would change what it does."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # not a readable harness: the harness loader says what is wrong with it
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        parsed = None
    for secret, name in _secret_env_names(environ).items():
        if secret in text or _contains(parsed, [secret]):
            return (f"the harness file holds the value of the environment variable {name}; a run writes its "
                    "harnesses to lineage/, checkpoints and W&B, so read the key from the environment instead")
    return None


def refuse_secrets(config: Mapping[str, Any], overrides: Iterable[str] = (),
                   environ: Mapping[str, str] | None = None) -> None:
    """Raise ``SecretInConfigError`` naming every field of ``config`` (and override) that holds a
    secret, and ``harness.start`` when it names a harness file that does (``find_in_harness_file``)."""
    found = find_secrets(config, environ)
    seen = {field for field, _ in found}
    found += [(f, r) for f, r in find_in_overrides(overrides, environ) if f.split(" ")[0] not in seen]
    start = (config.get("harness") or {}).get("start") if isinstance(config.get("harness"), Mapping) else None
    if isinstance(start, str) and "harness.start" not in seen and Path(start).is_file():
        reason = find_in_harness_file(start, environ)
        if reason:
            found.append(("harness.start", reason))
    if found:
        lines = "\n".join(f"  {field}: {reason}" for field, reason in found)
        raise SecretInConfigError(
            "refusing to start: these config values look like API keys or tokens, and a run writes its config to "
            f"the run directory, Hydra's .hydra/ and W&B:\n{lines}\nPut the key in an environment variable and name "
            "that variable (meta_agent.api_key_env=OPENAI_API_KEY; wandb reads WANDB_API_KEY, the hub HF_TOKEN). "
            "Nothing was written; the values are not shown.")


# ---------------------------------------------------------------------------------- Hydra hook
class RefuseSecrets(Callback):
    """Hydra callback that refuses a config holding a secret before Hydra writes anything.

    ``on_run_start`` / ``on_multirun_start`` run after composition and before Hydra creates the run
    directory, saves ``.hydra/`` or configures the ``train.log`` handler. Hydra turns an exception in a
    callback into a warning, so the refusal exits the process (``SystemExit``, status 1) instead.
    """

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config)

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._check(config)

    @staticmethod
    def _check(config: Any) -> None:
        from omegaconf import OmegaConf

        task = {k: _leaves(config, k) for k in config if k != "hydra"}
        overrides = [*OmegaConf.select(config, "hydra.overrides.task", default=[]),
                     *OmegaConf.select(config, "hydra.overrides.hydra", default=[])]
        env_set = OmegaConf.select(config, "hydra.job.env_set", default=None)
        env_set = OmegaConf.to_container(env_set, resolve=False) if env_set is not None else {}
        try:
            refuse_secrets({**task, "hydra": {"job": {"env_set": env_set}}}, overrides)
        except SecretInConfigError as err:
            raise SystemExit(f"Error: {err}") from None


def _leaves(config: Any, key: str) -> Any:
    """The value at ``key`` as plain data, each interpolation resolved where it can be (an
    ``${oc.env:...}`` would bring a key in) and left as written where it cannot yet (``${hydra:...}``)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    node = config._get_node(key)
    if isinstance(node, DictConfig):
        return {k: _leaves(node, k) for k in node}
    if isinstance(node, ListConfig):
        return [_leaves(node, i) for i in range(len(node))]
    try:
        return config[key]
    except Exception:  # noqa: BLE001 - an interpolation that resolves only inside the job
        return OmegaConf.to_container(config, resolve=False)[key]
