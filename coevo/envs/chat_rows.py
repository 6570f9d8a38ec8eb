"""Dataset rows of chat prompts as coevo tasks: what the ecosystem adapters (verifiers, skyrl-gym) share.

RL environment libraries keep a task as a row whose ``prompt`` is a list of OpenAI-style messages.
coevo's harness owns the system prompt and shows the task as one instruction, so a row's messages
become text: the environment's own system message first (it usually states the answer format its
reward checks), then the user turn. A task's id hashes the row's content, so the same row has the
same id and split on every machine whatever else the dataset holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coevo.envs.base import assign_split

if TYPE_CHECKING:
    from pydantic import BaseModel


def _field(message: Mapping[str, Any] | BaseModel, name: str) -> Any:
    """A message's field, whether the message is a dict or a pydantic model."""
    return message.get(name) if isinstance(message, Mapping) else getattr(message, name, None)


def content_text(content: str | Iterable[Mapping[str, Any] | BaseModel] | None) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [_field(part, "text") for part in content]
    return "\n".join(p for p in parts if p)


def messages_text(messages: Sequence[Any]) -> str:
    """The text an agent is shown for ``messages``: one user (or tool) turn as written; several,
    each under its role. System messages come first, as written."""
    system = [content_text(_field(m, "content")) for m in messages if _field(m, "role") == "system"]
    rest = [m for m in messages if _field(m, "role") != "system"]
    if len(rest) == 1:
        body = content_text(_field(rest[0], "content"))
    else:
        body = "\n\n".join(f"{_field(m, 'role')}: {content_text(_field(m, 'content'))}" for m in rest)
    return "\n\n".join([*system, body]) if body else "\n\n".join(system)


def row_task_id(env_name: str, row: Mapping[str, Any], taken: set[str]) -> str:
    """``<env>-<hash of the row>``; a row identical to an earlier one gets ``-2``, ``-3``... (in row order)."""
    digest = hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:12]
    task_id, n = f"{env_name}-{digest}", 1
    while task_id in taken:
        n += 1
        task_id = f"{env_name}-{digest}-{n}"
    taken.add(task_id)
    return task_id


def split_rows(train: Iterable[Mapping[str, Any]] | None, evaluation: Iterable[Mapping[str, Any]] | None,
               env_name: str, seed: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(task id, split, row) for every row. With both sets, evaluation rows are the sealed test split
    and training rows are hashed into train and val (3:1); with one set, its rows are hashed into
    train, val and test (3:1:1)."""
    taken: set[str] = set()
    out = []
    train_rows = [dict(r) for r in train or ()]
    eval_rows = [dict(r) for r in evaluation or ()]
    both = bool(train_rows) and bool(eval_rows)
    for row in train_rows or eval_rows:
        task_id = row_task_id(env_name, row, taken)
        split = assign_split(task_id, seed, (0.75, 0.25, 0.0) if both else (0.6, 0.2, 0.2))
        out.append((task_id, split, row))
    if both:
        out += [(row_task_id(env_name, row, taken), "test", row) for row in eval_rows]
    return out
