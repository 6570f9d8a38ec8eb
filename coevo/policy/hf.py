"""A Policy over a transformers causal LM: batched chat generation with exact ids and log-probs.

The trainer later computes importance ratios against these numbers, so the contract is strict:
``completion_ids`` are the tokens the model produced (up to and including EOS, or up to the
token that completed a stop string), ``text`` is exactly their decoding (special tokens
skipped), and ``logprobs[i]`` is log softmax(logits / T) of token i, the sampling distribution
before top-p truncation (T = 1 for greedy decoding).

Requests are grouped by sampling parameters (one ``generate`` call needs one configuration) and
run in left-padded batches of at most ``max_batch_size``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

import torch

from coevo.agent.policy import ChatRequest, Generation
from coevo.harness.events import Message


def to_template_messages(messages: Sequence[Message], tool_role: bool) -> list[dict[str, str]]:
    """Messages a chat template accepts. Small chat models never saw a ``tool`` role, so by
    default tool results are shown as user turns that say which tool answered."""
    out = []
    for m in messages:
        if m["role"] == "tool" and not tool_role:
            out.append({"role": "user", "content": f"[{m.get('name', 'tool')} result]\n{m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


class TransformersPolicy:
    """Generates with ``model.generate``; the model object is shared with the trainer, so
    updates are visible to the next rollout without any weight copy."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_version: str = "0",
        max_batch_size: int = 32,
        tool_role: bool = False,
        seed: int = 0,
    ) -> None:
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; TransformersPolicy renders chats with it")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.model, self.tokenizer = model, tokenizer
        self.model_version = model_version
        self.max_batch_size = max_batch_size
        self.tool_role = tool_role
        self.seed = seed
        self._calls = 0
        self.seconds = 0.0  # wall time spent in generate(), for the round's time breakdown
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        rendered = to_template_messages(messages, self.tool_role)
        ids = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream at ``seed``: the co-evolution loop reseeds at each phase of a
        round, so a resumed run samples exactly what an uninterrupted one did."""
        self.seed, self._calls = seed, 0

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        began = time.perf_counter()
        results: list[Generation | None] = [None] * len(requests)

        def key(i: int) -> tuple:
            s = requests[i].sampling
            return (s.temperature, s.top_p, s.max_new_tokens, tuple(s.stop))

        for _, group in itertools.groupby(sorted(range(len(requests)), key=key), key=key):
            idx = list(group)
            for start in range(0, len(idx), self.max_batch_size):
                chunk = idx[start : start + self.max_batch_size]
                for i, gen in zip(chunk, self._generate_batch([requests[i] for i in chunk]), strict=True):
                    results[i] = gen
        self.seconds += time.perf_counter() - began
        return [r for r in results if r is not None]

    @torch.no_grad()
    def _generate_batch(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        sampling = requests[0].sampling
        prompts = [self.prompt_ids(r.messages) for r in requests]
        width = max(map(len, prompts))
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        greedy = sampling.temperature <= 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        torch.manual_seed(self.seed + self._calls)  # reproducible sampling for a given call sequence
        self._calls += 1
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        self.model.train(was_training)
        new = out.sequences[:, width:]  # [B, T_new]
        logits = torch.stack(out.logits, dim=1).float()  # [B, T_new, V]
        temperature = 1.0 if greedy else sampling.temperature
        logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [
            self._one(prompts[b], new[b].tolist(), logp[b].tolist(), sampling.stop)
            for b in range(len(requests))
        ]

    def _one(self, prompt: list[int], ids: list[int], logps: list[float], stops: list[str]) -> Generation:
        """Cut the padded row where generation really ended (EOS, or the token completing a stop
        string) and say why. Like transformers' stop-string criterion, a stop string may begin in
        the prompt's last characters, so the search runs over the prompt tail plus the completion."""
        end = next((k + 1 for k, t in enumerate(ids) if t in self.eos_ids), None)
        if stops:
            tail = self.tokenizer.decode(prompt[-32:], skip_special_tokens=False)

            def completed(k: int) -> bool:  # a stop string ends within the first k completion tokens
                text = tail + self.tokenizer.decode(ids[:k], skip_special_tokens=False)
                return any(text.find(s, max(0, len(tail) - len(s) + 1)) != -1 for s in stops)

            hi = end or len(ids)
            if completed(hi):
                lo = 1
                while lo < hi:  # completion only grows with k: binary search the first k
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if completed(mid) else (mid + 1, hi)
                end = lo
        finish = "stop" if end is not None else "length"
        ids = ids[:end] if end is not None else ids
        return Generation(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            prompt_ids=prompt,
            completion_ids=ids,
            logprobs=logps[: len(ids)],
            finish_reason=finish,
        )
