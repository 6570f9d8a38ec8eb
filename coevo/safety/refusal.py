"""Refusing a config, a command-line override or a starting harness file that holds a secret.

A run writes its config three times (Hydra's ``.hydra/{config,overrides,hydra}.yaml``, our
``config.yaml`` and the W&B run config) and W&B's own files (its run log records the command line,
group and tags). Keys come from the environment only, so a config that holds one is **refused**,
before anything is written: ``refuse_secrets`` names every offending field (never the value) and
says where the key belongs. Hydra writes ``.hydra/`` and names sweep directories before the task
function runs, so the check also runs as a Hydra callback (``RefuseSecrets``, registered in
``configs/train.yaml``) on the composed config and the raw command-line overrides; ``coevo.run``
runs it again on the typed config for callers that bypass Hydra. Refusing (rather than redacting,
``coevo.safety.secrets``) is the choice because a redacted value would silently change what the run does,
and a resumed run could not compare configs.

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

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from hydra.experimental.callback import Callback

from coevo.safety.secrets import contains_secret, holds_secret, is_secret_name

if TYPE_CHECKING:
    from omegaconf import Container, DictConfig, DictKeyType

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


def _secret_env_names(environ: Mapping[str, str] | None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {v: k for k, v in sorted(env.items()) if holds_secret(k, v)}


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


def find_secrets(config: object, environ: Mapping[str, str] | None = None, prefix: str = "") -> list[tuple[str, str]]:
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
        if secret in text or contains_secret(parsed, [secret]):
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

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        self._check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        self._check(config)

    @staticmethod
    def _check(config: DictConfig) -> None:
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


def _leaves(config: Container, key: DictKeyType) -> object:
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
