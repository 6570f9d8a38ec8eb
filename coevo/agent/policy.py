"""The Policy base class and a deterministic scripted policy for tests and demos.

A policy turns a batch of chat requests into completions. It must return the exact token ids it
was conditioned on and produced, because the trainer learns from those ids: re-tokenising text
later can give different ids and silently corrupt the importance ratios.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coevo.harness.events import Message, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class ChatRequest:
    """``reply_prefix``: text the assistant turn starts with. A policy renders it after the chat
    template's generation prompt, so ``Generation.prompt_ids`` end with its tokens and the model
    continues from it; ``completion_ids`` and ``text`` are only what the model generated."""

    messages: list[Message]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    reply_prefix: str = ""
    task_id: str = ""  # the episode's task (scripted policies that replay a task's gold actions read it)
    agent: str = ""  # "": the lead agent; else the specialist whose delegated sub-episode asks
    turn: int = 0  # the user turn the episode is in (0 unless the env answers replies with a next turn)
    episode: str = ""  # the asking episode's trace id (a delegated sub-episode has its own)


@dataclass
class Generation:
    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None  # sampler log-prob of each completion token, after temperature
    finish_reason: str = "stop"  # "stop" (EOS or stop string) | "length"
    prefix_tokens: int = 0  # how many of prompt_ids (its last ones) are the request's reply_prefix
    demo_span: list[int] | None = None  # [start, end) of prompt_ids that are demonstration turns (coevo.agent.demos)
    nearest_demo_span: list[int] | None = None  # [start, end) of the demonstration nearest the task


class Policy(ABC):
    """A model as the runtime sees it: ``generate`` and ``model_version`` (the weights' version, kept on
    every trace). A policy subclasses this; the capabilities only some policies have are declared
    here with what a policy without them means, so callers never probe for them:

    - ``tokenizer``: token counts and trace rendering (None: the policy's ids are not a tokenizer's);
    - ``context_window``: prompt plus completion tokens it takes (None: not checked before a run);
    - ``seconds``: wall time spent in ``generate`` so far (the round's generation time);
    - ``on_progress``: set by a caller to hear how far a long call is (a line of text);
    - ``prompt_ids``: the ids a request's prompt renders to (None: it renders none, e.g. scripted);
    - ``reseed``: restart its sampler's stream (a deterministic policy has none);
    - ``release``: free rollout memory before a training step (a vLLM engine sleeps).
    """

    model_version: str
    tokenizer: PreTrainedTokenizerBase | None = None
    context_window: int | None = None
    seconds: float = 0.0
    on_progress: Callable[[str], None] | None = None

    @abstractmethod
    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation | BaseException]:
        """One completion per request, in order. An exception in a request's place fails that
        request's episode only (a prompt over the context window); a raised one fails the batch."""

    def prompt_ids(self, messages: Sequence[Message], reply_prefix: str = "") -> list[int] | None:
        """The token ids ``messages`` (then ``reply_prefix``) render to, as ``generate`` would prompt."""
        return None

    def reseed(self, seed: int) -> None:
        """Restart the sampler from ``seed`` (per round and phase, so a resumed run samples the same)."""

    def release(self) -> None:
        """Free what rollouts hold before the trainer needs the memory."""


def render_plain(messages: Sequence[Message]) -> str:
    """A simple chat rendering for policies without a tokenizer chat template."""
    parts = [f"<|{m['role']}|>{(':' + m['name']) if m.get('name') else ''}\n{m.get('content', '')}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ScriptedPolicy(Policy):
    """Answers with ``respond(messages)`` (a subclass: ``reply(request)``); log-probs are 0 (deterministic).

    Its tokens are UTF-8 bytes, so the completion budget ``max_new_tokens`` counts bytes, not
    model tokens: a 300-character scripted reply is cut at the harness's default budget. It
    honours that budget and stop strings like a real policy (a cut reply has
    ``finish_reason="length"``), logs a warning the first time it cuts a reply (raise the budget
    with the harness's ``sampling.max_new_tokens``, ``rollout.max_new_tokens`` in a run config or
    ``--max-new-tokens``), and records the size of every batch it was given, so tests can check
    that the runtime batches model calls.

    A request's ``reply_prefix`` is part of the prompt (its bytes end ``prompt_ids``). The scripted
    reply is the whole assistant turn: when it starts with the prefix, the generated text is the
    rest of it; when it does not, the generated text is the whole reply, so ``prefix + text`` may
    be malformed, as with a real model forced into a turn it would not have written.
    """

    cut_at_budget = True
    """Whether a reply longer than ``max_new_tokens`` is cut (a replay of reference actions is not:
    ``coevo.agent.gold.GoldPolicy``)."""

    def __init__(self, respond: Callable[[list[Message]], str], model_version: str = "scripted") -> None:
        self.respond = respond
        self.model_version = model_version
        self.batch_sizes: list[int] = []
        self.cuts = 0  # replies cut at max_new_tokens (the first one is logged as a warning)

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        self.batch_sizes.append(len(requests))
        return [self._one(r) for r in requests]

    def reply(self, request: ChatRequest) -> str:
        """The whole scripted assistant turn for ``request`` (a subclass may read more than its messages)."""
        return self.respond(request.messages)

    def _one(self, request: ChatRequest) -> Generation:
        text = self.reply(request)
        prefix = request.reply_prefix
        if prefix and text.startswith(prefix):
            text = text[len(prefix):]
        finish = "stop"
        for stop in request.sampling.stop:
            if stop and stop in text:
                text = text[: text.index(stop)]
        ids = byte_ids(text)
        if self.cut_at_budget and len(ids) > request.sampling.max_new_tokens:
            self.cuts += 1
            if self.cuts == 1:
                log.warning(
                    "ScriptedPolicy %r cut a scripted reply of %d bytes at max_new_tokens=%d (its tokens are "
                    "UTF-8 bytes); raise the budget with the harness's sampling.max_new_tokens, "
                    "rollout.max_new_tokens or --max-new-tokens. Further cuts are not logged.",
                    self.model_version, len(ids), request.sampling.max_new_tokens,
                )
            ids = ids[: request.sampling.max_new_tokens]
            text = bytes(ids).decode("utf-8", errors="ignore")
            finish = "length"
        prompt = byte_ids(render_plain(request.messages) + prefix)
        return Generation(text, prompt, ids, [0.0] * len(ids), finish, prefix_tokens=len(byte_ids(prefix)))
