"""A Policy over a transformers causal LM: batched chat generation with exact ids and log-probs.

The trainer later computes importance ratios against these numbers, so the contract is strict:
``completion_ids`` are the tokens the model produced (up to and including EOS, or up to the
token that completed a stop string), ``text`` is exactly their decoding (special tokens
skipped), and ``logprobs[i]`` is log softmax(logits / T) of token i, the sampling distribution
before top-p truncation (T = 1 for greedy decoding). A request's ``reply_prefix`` is prefilled:
its tokens end ``prompt_ids`` (``coevo.policy.chat.render_prompt``) and are never part of the completion.

Requests are grouped by sampling parameters and run in batches of at most ``max_batch_size``.
Two engines produce the same ids and log-probs:

* ``cached`` (the default): ``coevo.policy.decode`` starts every row from the longest prefix whose
  key/value states it already holds (``coevo.policy.prefix_cache``): the harness's system prompt,
  tool hints and demonstrations are read once per weight version, and an episode's next call
  continues from its previous one. It keeps only the sampled tokens' log-probs.
* ``hf``: ``model.generate``, which re-reads every prompt and keeps ``[batch, new tokens, vocab]``
  logits to get the log-probs. It is the reference the cached engine is checked against, and the
  engine for models with sliding-window attention, whose states the prefix cache cannot splice.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from coevo.agent.policy import ChatRequest, Generation, Policy
from coevo.config.schema import RolloutConfig
from coevo.harness.events import Message, SamplingParams
from coevo.policy.chat import prefix_ids, render_prompt
from coevo.policy.decode import RaceSampling, Report, batch_tokens, batches_within, decode, kv_bytes_per_token
from coevo.policy.heap import trim_heap
from coevo.policy.prefix_cache import Entry, PrefixCache, common_prefix_len

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

ENGINES = ("cached", "hf")
"""Generation paths, the same completions from the same seed: ``cached`` (``coevo.policy.decode``,
reusing prompt-prefix key/value states; what runs use) and ``hf`` (``model.generate``, re-reading
every prompt; the reference the tests hold ``cached`` to)."""
KV_MIB = RolloutConfig.kv_mib
"""Key/value memory the policy holds at once: the prefix cache's states and the decode batch's past
(rows x their longest prompt plus the completion budget). The cache gives way to each batch, so the
two never add up beyond it: the main job's 32 rows of ~1k tokens (SmolLM2, fp32: 46 KB a token) go
in two batches, 8 BFCL prompts of ~4.7k tokens 3 rows at a time, and memory stays flat in prompt
length."""
HEARTBEAT_S = 30.0
"""A long model call says how far it is at most this often (``on_progress``)."""
SHARED_PREFIX_MIN = 32
"""Prompts of one batch that share at least this many leading tokens get that prefix read once."""


class TransformersPolicy(Policy):
    """Generates with the model object the trainer updates, so rollouts see new weights without
    any copy. The prefix cache notices updates by itself: its states are dropped whenever a
    parameter's in-place version counter (bumped by every optimizer step and ``load_state_dict``)
    or ``model_version`` changes."""

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_version: str = "0",
        max_batch_size: int = RolloutConfig.batch_size,  # defaults: the schema's, stated there only
        tool_role: bool = False,
        seed: int = 0,
        engine: str = ENGINES[0],
        kv_mib: float = KV_MIB,
        prefix_cache_mb: float | None = None,
    ) -> None:
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; TransformersPolicy renders chats with it")
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r}; choose one of {list(ENGINES)}")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.model, self.tokenizer = model, tokenizer
        self.model_version = model_version
        self.max_batch_size = max_batch_size
        self.tool_role = tool_role
        self.seed = seed
        self._calls = 0
        self.seconds = 0.0  # wall time spent generating, for the round's time breakdown
        eos = model.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.engine = "hf" if engine == "cached" and _sliding_window(model.config) else engine
        self.kv_bytes = int(kv_mib * 2**20)
        # the prefix cache shares the key/value budget (``prefix_cache_mb`` caps it lower; 0 turns it off)
        cache_mb = kv_mib if prefix_cache_mb is None else min(prefix_cache_mb, kv_mib)
        self.cache = PrefixCache(int(cache_mb * 2**20))
        self._call_began = 0.0
        self._last_said = time.perf_counter()  # the last progress line, across calls: never dark for long
        self._calls_done = self._tokens_done = 0
        # prompt tokens rendered into requests vs read by the model (the rest came from the cache)
        self.prompt_tokens = 0
        self.prompt_tokens_computed = 0

    def release(self) -> None:
        """Before a training step (the loop's ``release_rollout``): drop the prefix cache, whose states
        belong to the weights the step is about to change (up to ``kv_mib``), and hand the
        freed heap back to the system, so the step's activations do not stack on the rollout's memory."""
        self.cache.clear()
        trim_heap()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_ids(self, messages: Sequence[Message], reply_prefix: str = "") -> list[int]:
        return render_prompt(self.tokenizer, messages, self.tool_role, reply_prefix)

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream at ``seed``: the co-evolution loop reseeds at each phase of a
        round, so a resumed run samples exactly what an uninterrupted one did."""
        self.seed, self._calls = seed, 0

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation | BaseException]:
        """One completion per request, in order; a request over the context window gets its
        ``ValueError`` in its place (the runtime ends that episode only) and the others are generated."""
        began = self._call_began = time.perf_counter()
        results: list[Generation | BaseException | None] = [None] * len(requests)

        def key(i: int) -> tuple:
            s = requests[i].sampling
            return (s.temperature, s.top_p, s.max_new_tokens, tuple(s.stop))

        run = self._generate_cached if self.engine == "cached" else self._generate_hf
        rendered = [self.prompt_ids(r.messages, r.reply_prefix) for r in requests]
        refused = self._check_context(requests, rendered)  # before any generation, so nothing is wasted
        for i, err in refused.items():
            results[i] = err
        fits = [i for i in range(len(requests)) if i not in refused]
        for _, group in itertools.groupby(sorted(fits, key=key), key=key):
            idx = list(group)
            for start in range(0, len(idx), self.max_batch_size):
                chunk = idx[start : start + self.max_batch_size]
                prompts = [rendered[i] for i in chunk]
                self.prompt_tokens += sum(map(len, prompts))
                # one noise stream per call: a resumed run replays the same calls and so the same samples
                generator = torch.Generator(device=self.device).manual_seed(self.seed + self._calls)
                self._calls += 1
                for i, gen in zip(chunk, run(prompts, requests[chunk[0]].sampling, generator), strict=True):
                    gen.prefix_tokens = len(prefix_ids(self.tokenizer, requests[i].reply_prefix))
                    results[i] = gen
        self.seconds += time.perf_counter() - began
        done = [r for r in results if r is not None]
        self._calls_done += len(done)
        self._tokens_done += sum(len(r.completion_ids) for r in done if isinstance(r, Generation))
        self._say(f"model calls: {self._calls_done:,} done, {self._tokens_done:,} tokens generated")
        return done

    def _say(self, text: str) -> None:
        """``text`` to ``on_progress`` when ``HEARTBEAT_S`` have passed since the last line: episodes
        of many short calls end late, and a call of a long prompt takes minutes on a CPU."""
        now = time.perf_counter()
        if self.on_progress is not None and now - self._last_said >= HEARTBEAT_S:
            self._last_said = now
            self.on_progress(text)

    def _check_context(self, requests: Sequence[ChatRequest], prompts: list[list[int]]) -> dict[int, ValueError]:
        """The requests whose prompt plus completion budget exceeds the model's context window
        (``config.max_position_embeddings``, when the config has one), each with its error: past it
        positions the model never saw give garbage or an index error deep in the forward pass."""
        limit = self.context_window
        refused: dict[int, ValueError] = {}
        if limit is None:
            return refused
        for i, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
            budget = request.sampling.max_new_tokens
            if len(prompt) + budget > limit:
                who = f"task {request.task_id!r}" if request.task_id else f"request {i}"
                refused[i] = ValueError(
                    f"{who}: the prompt has {len(prompt)} tokens and max_new_tokens is {budget}, "
                    f"{len(prompt) + budget} in all, over the model's context window of {limit} tokens "
                    f"(config.max_position_embeddings); shorten the context (a memory processor, fewer "
                    f"or shorter tool schemas or demonstrations) or lower sampling.max_new_tokens"
                )
        return refused

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens (``config.max_position_embeddings``), or None."""
        limit = getattr(self.model.config, "max_position_embeddings", None)  # absent from some architectures' configs
        return limit if isinstance(limit, int) and limit > 0 else None

    def _weights_fingerprint(self) -> tuple[str, int]:
        return self.model_version, sum(p._version for p in self.model.parameters())

    def _generate_cached(self, prompts: list[list[int]], sampling: SamplingParams,
                         generator: torch.Generator) -> list[Generation]:
        cache = self.cache
        cache.validate(self._weights_fingerprint())
        if cache.enabled:
            self._read_shared_prefixes(prompts)
        matches = [cache.match(p, len(p) - 1) if cache.enabled else (None, 0) for p in prompts]
        self.prompt_tokens_computed += sum(len(p) - n for p, (_, n) in zip(prompts, matches, strict=True))
        cached = [n for _, n in matches]
        out: list[Generation | None] = [None] * len(prompts)
        state = generator.get_state()
        pinned = cache.pinned([m for m, _ in matches])  # held by this call's rows until it ends
        batches = self._batches(prompts, cached, sampling.max_new_tokens, pinned)
        for k, batch in enumerate(batches):  # one batch's past at a time: copies of the cached states included
            g = torch.Generator(device=generator.device)
            g.set_state(state)  # every batch of a split call draws the call's noise block, its rows' rows of it
            part = [prompts[i] for i in batch]
            self._make_room(prompts, cached, sampling.max_new_tokens, batch, pinned)
            rows = decode(
                self.model, part, [cache.states(matches[i][0], cached[i]) if matches[i][0] is not None else None
                                   for i in batch],
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                eos_ids=self.eos_ids,
                pad_id=self.tokenizer.pad_token_id,
                finished=self._stop_check(part, sampling.stop),
                generator=g,
                keep_from=[cached[i] for i in batch] if cache.enabled else None,
                noise_rows=batch, noise_width=len(prompts),
                report=self._heartbeat(len(prompts), k, len(batches)),
            )
            for i, row in zip(batch, rows, strict=True):
                if row.kv is not None:  # the states of everything read: the episode's next call continues here
                    cache.insert(prompts[i] + row.ids[:-1], row.kv, matches[i][0], cached[i])
                out[i] = self._one(prompts[i], row.ids, row.logprobs, sampling.stop)
            del rows, row  # the states the cache did not keep go before the next batch allocates its past
            trim_heap()  # and the heap the batch's transients grew goes back to the system, not to the next batch
        return [gen for gen in out if gen is not None]

    def _read_shared_prefixes(self, prompts: list[list[int]]) -> None:
        """Read once the prefixes several prompts of this batch share and the cache lacks.

        Neighbours in sorted order share the longest prefixes, so their common prefixes are the
        candidates. They are read shortest first, in waves, so a longer one (two attempts of one
        task) continues from a shorter one (the harness prompt they both start with).
        """
        order = sorted(prompts)
        wanted: set[tuple[int, ...]] = set()
        for a, b in itertools.pairwise(order):
            n = min(common_prefix_len(a, b), len(a) - 1, len(b) - 1)
            if n >= SHARED_PREFIX_MIN:
                wanted.add(tuple(a[:n]))
        pending = sorted((w for w in wanted if self.cache.match(w)[1] < len(w)), key=len)
        while pending:
            wave = [w for w in pending if not any(len(v) < len(w) and w[: len(v)] == v for v in pending)]
            matches = [self.cache.match(w, len(w) - 1) for w in wave]
            cached = [n for _, n in matches]
            pinned = self.cache.pinned([m for m, _ in matches])
            batches = self._batches(wave, cached, 0, pinned)
            for k, batch in enumerate(batches):
                self._make_room(wave, cached, 0, batch, pinned)
                rows = decode(
                    self.model, [wave[i] for i in batch],
                    [self.cache.states(matches[i][0], cached[i]) if matches[i][0] is not None else None
                     for i in batch],
                    max_new_tokens=0, temperature=0.0, top_p=1.0, eos_ids=self.eos_ids,
                    pad_id=self.tokenizer.pad_token_id, keep_from=[cached[i] for i in batch],
                    report=self._heartbeat(len(wave), k, len(batches), "shared prefixes"),
                )
                for i, row in zip(batch, rows, strict=True):
                    self.cache.insert(wave[i], row.kv, matches[i][0], cached[i])
                    self.prompt_tokens_computed += len(wave[i]) - cached[i]
                del rows, row
            pending = [w for w in pending if w not in wave]

    def _batches(self, prompts: list[list[int]], cached: list[int], max_new_tokens: int,
                 pinned: set[Entry] | frozenset[Entry] = frozenset()) -> list[list[int]]:
        """The rows of each decode batch of one call (``decode.batches_within``): the states of each
        batch and the cached prefixes the call's rows read (``pinned``) within ``kv_mib``."""
        per_token = kv_bytes_per_token(self.model)
        room = self.kv_bytes - sum(e.nbytes for e in pinned)
        return batches_within([len(p) for p in prompts], cached, max_new_tokens, room // per_token,
                              keep=self.cache.enabled)

    def _make_room(self, prompts: list[list[int]], cached: list[int], max_new_tokens: int, batch: list[int],
                   pinned: set[Entry] | frozenset[Entry]) -> None:
        """Evict the cache's least recently used states until it and ``batch``'s states (its past and
        the copies it keeps for the cache) fit in ``kv_mib`` together. The prefixes this call's rows
        read stay (``pinned``): evicting them would free nothing while the call holds them."""
        held = batch_tokens([len(p) for p in prompts], cached, max_new_tokens, batch, keep=self.cache.enabled)
        self.cache.shrink_to(self.kv_bytes - held * kv_bytes_per_token(self.model), keep=pinned)

    def _heartbeat(self, requests: int, batch: int, batches: int, what: str = "model call") -> Report | None:
        """A ``decode`` report that tells ``on_progress`` how far the call is (``_say``: at most every
        ``HEARTBEAT_S`` seconds)."""
        if self.on_progress is None:
            return None
        began = self._call_began
        part = f", batch {batch + 1}/{batches}" if batches > 1 else ""

        def report(phase: str, done: int, total: int) -> None:
            unit = "prompt tokens read" if phase == "prefill" else "tokens generated"
            self._say(f"{what} ({requests} request(s){part}): {done:,}/{total:,} {unit}, "
                      f"{time.perf_counter() - began:.0f} s into the call")

        return report

    def _stop_check(self, prompts: list[list[int]], stops: list[str]) -> Callable[[int, list[int]], bool] | None:
        """``finished(row, ids)``: whether a stop string ends within the completion, with the same
        rule as ``_one`` (a stop string may begin in the prompt's last characters)."""
        if not stops:
            return None
        tails = [self.tokenizer.decode(p[-32:], skip_special_tokens=False) for p in prompts]

        def finished(row: int, ids: list[int]) -> bool:
            tail = tails[row]
            text = tail + self.tokenizer.decode(ids, skip_special_tokens=False)
            return any(text.find(s, max(0, len(tail) - len(s) + 1)) != -1 for s in stops)

        return finished

    @torch.no_grad()
    def _generate_hf(self, prompts: list[list[int]], sampling: SamplingParams,
                     generator: torch.Generator) -> list[Generation]:
        """``model.generate`` on left-padded prompts, log-probs from the kept per-step logits. It
        decodes greedily over ``RaceSampling`` scores, which samples like the cached engine."""
        self.prompt_tokens_computed += sum(map(len, prompts))
        width = max(map(len, prompts))
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        greedy = sampling.temperature <= 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=True,
            output_logits=True,
        )
        if not greedy:
            kwargs["logits_processor"] = [RaceSampling(sampling.temperature, sampling.top_p, generator)]
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
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
            for b in range(len(prompts))
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


def _sliding_window(config: PretrainedConfig) -> bool:
    """Whether some layer attends within a sliding window (the prefix cache assumes full attention)."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return True
    return bool(getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None))
