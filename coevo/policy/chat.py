"""A conversation as the ids a chat model conditions on: what both policies (transformers, vLLM) render.

The harness's messages carry roles small chat templates never saw (``tool``) and notes of its own;
both policies must render them the same way, or the trainer's log-probs would be of other prompts
than the ones sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from coevo.harness.events import HARNESS, Message, is_harness_note

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def to_template_messages(messages: Sequence[Message], tool_role: bool) -> list[dict[str, str]]:
    """Messages a chat template accepts. Small chat models never saw a ``tool`` role, so by
    default tool results are shown as user turns that say which tool answered; the harness's own
    notes (``harness_note``) are user turns marked ``[harness]``, apart from the user's."""
    out = []
    for m in messages:
        if m["role"] == "tool" and not tool_role:
            out.append({"role": "user", "content": f"[{m.get('name', 'tool')} result]\n{m['content']}"})
        elif is_harness_note(m):
            out.append({"role": "user", "content": f"[{HARNESS}] {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], tool_role: bool,
                  reply_prefix: str = "") -> list[int]:
    """The ids a policy conditions on: the chat template with its generation prompt, then the
    tokens of ``reply_prefix`` (no special tokens), the start of the assistant turn the model
    continues from. Only the ids generated after them are the completion."""
    rendered = to_template_messages(messages, tool_role)
    ids = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return ids + prefix_ids(tokenizer, reply_prefix)


def prefix_ids(tokenizer: PreTrainedTokenizerBase, reply_prefix: str) -> list[int]:
    """The ids ``render_prompt`` appends for ``reply_prefix`` (none for "")."""
    return list(tokenizer.encode(reply_prefix, add_special_tokens=False)) if reply_prefix else []
