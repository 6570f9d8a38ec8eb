"""A disk cache of meta-agent LLM calls, keyed by the exact prompt.

Re-running an experiment (or resuming one) must not pay for the same planning call twice, and a
cached run must reproduce the same proposals. The key is the sha256 of the canonical JSON of
(model, stage, messages, schema): any change to the prompt or the output schema is a miss. Only
the response text and its token usage are stored, never the client's configuration, so nothing
secret (an API key) can end up on disk; the response text is stored with secret values redacted
(``coevo.safety.secrets.redact_text``: a reply that quoted a key from its prompt).
Writes go to a temporary file renamed into place, so a
crash or a concurrent writer never leaves a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.safety.secrets import redact_text


@dataclass(frozen=True)
class CachedCall:
    """A stored response: the raw text and the tokens the original call cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def call_key(model: str, stage: str, messages: list[dict[str, Any]], schema: dict[str, Any]) -> str:
    """sha256 hex digest of the canonical JSON of the call's inputs."""
    payload = {"model": model, "stage": stage, "messages": messages, "schema": schema}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class CallCache:
    """``directory/<first two hex digits>/<key>.json`` per call; created on first write."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"CallCache({str(self.directory)!r})"

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, model: str, stage: str, messages: list[dict[str, Any]], schema: dict[str, Any]) -> CachedCall | None:
        """The stored response, or None on a miss (an unreadable entry counts as a miss)."""
        path = self.path(call_key(model, stage, messages, schema))
        try:
            data = json.loads(path.read_text())
            return CachedCall(str(data["text"]), int(data["prompt_tokens"]), int(data["completion_tokens"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, model: str, stage: str, messages: list[dict[str, Any]], schema: dict[str, Any], text: str,
            prompt_tokens: int, completion_tokens: int) -> Path:
        """Store a response atomically; returns the entry's path."""
        key = call_key(model, stage, messages, schema)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "model": model, "stage": stage, "text": redact_text(text),
                 "prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens)}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:8]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
