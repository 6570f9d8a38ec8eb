"""A batched decode loop over a causal LM that starts from already-computed prefix states.

``transformers``' ``generate`` cannot start rows from different cached prefixes, and to return
behaviour log-probs it keeps every step's logits (``[batch, new tokens, vocab]``). This loop does
the two things the rollout needs and nothing else:

* Each row ``b`` may come with the key/value states of its first ``c_b`` prompt tokens. The batch
  is laid out as ``[pad | cached_b | pad | rest of prompt_b]``: cached states right-aligned in a
  past of width ``max c_b``, the uncached rest left-padded in the input. The attention mask hides
  the holes and explicit position ids count only real tokens, so every row computes what it would
  compute alone.
* Each step samples from ``softmax(logits / T)`` (after top-p) and keeps only the sampled token's
  log-prob under ``log_softmax(logits / T)``, the number the trainer's importance ratios need;
  peak memory holds one step's ``[batch, vocab]`` logits. Finished rows leave the batch when
  the steps they would still ride along cost more than copying the past without them.

Sampling is the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``, with a ``[batch, vocab]`` noise
block drawn per step for every row of the call (running or not) from a generator seeded per
call. A row's tokens then depend on the seed, the call, its position in the batch and its own
logits, not on how its prompt was split into cached and uncached parts, and ``transformers``'
``generate`` reproduces them with ``RaceSampling`` as a logits processor.

The past lives in buffers allocated once for the whole call (``PreallocatedLayer``): a growing
cache that concatenates a column per step copies the whole past every step, which measured more
than half of a decode step's time at 12 rows x 700 tokens on a CPU.

Memory stays flat in prompt length: the uncached prompt is read in chunks of ``PREFILL_CHUNK``
columns (one forward holds a chunk's activations, not the whole prompt's), and a caller that splits
a call's rows into several ``decode`` calls (to bound the past's size, ``kv_bytes_per_token``) gives
each the call's noise rows (``noise_rows`` of ``noise_width``) and an equally seeded generator, so
every row samples what it would have sampled in one batch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from coevo.policy.prefix_cache import ChainStates, LayerKV

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

PREFILL_CHUNK = 512
"""Prompt columns read per forward: a chunk's activations (``[rows, chunk, 1536]`` in SmolLM2's MLP)
instead of the whole prompt's, at a few forwards more for prompts longer than it."""

Report = Callable[[str, int, int], None]
"""``report(phase, done, total)``: ``("prefill", prompt tokens read, to read)`` after each chunk and
``("decode", steps done, max_new_tokens)`` after each step, for progress inside a long call."""


@dataclass
class Row:
    """What one row produced: sampled ids and their log-probs, and the key/value states of every
    token the model read (the prompt and all sampled tokens but the last), from ``keep_from`` on."""

    ids: list[int]
    logprobs: list[float]
    kv: LayerKV | None


def cache_kwarg(model: PreTrainedModel | PeftModel) -> str:
    """The forward argument that takes a cache: ``cache`` in transformers >= 5.x, before that
    ``past_key_values``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_kwarg(type(base))


@functools.cache
def _cache_kwarg(cls: type) -> str:  # once per model class, not per decode call
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` [B, V] with the tokens outside the nucleus zeroed: the nucleus is the smallest set
    of most likely tokens whose probability reaches ``top_p`` (at least one token)."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    drop_sorted = sorted_p.cumsum(-1) - sorted_p >= top_p  # tokens after the nucleus is full
    return probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)


def draw(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Tokens [B] drawn from unnormalised ``probs`` [B, V] with Exp(1) ``noise`` [B, V]: the
    exponential race ``argmax(p / E)`` picks token i with probability p_i / sum(p). A draw moves
    only if two tokens' ``p / E`` are within rounding of each other, so two computations of the
    same logits that differ in the last bits draw the same token; inverting a CDF instead flipped
    tokens in the long tail of a 49k vocabulary, where thousands of tokens share each 1e-5 of
    probability mass."""
    return (probs / noise).argmax(-1)


def sample(logits: torch.Tensor, temperature: float, top_p: float,
           noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and their log-probs [B] under ``log_softmax(logits / T)`` (T = 1 when
    greedy), the sampling distribution before top-p truncation. ``noise`` [B, V] holds Exp(1)
    draws (unused when greedy)."""
    logits = logits.float()  # [B, V]
    if temperature <= 0:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
    else:
        logp = torch.log_softmax(logits / temperature, -1)
        tokens = draw(sampling_probs(logp, top_p), noise)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def sampling_probs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """The distribution a row samples from [B, V], from its tempered log-probs: top-p truncated,
    not renormalised (the race does not need it)."""
    probs = logp.exp()
    return nucleus(probs, top_p) if top_p < 1.0 else probs


class RaceSampling:
    """A ``transformers`` logits processor that turns greedy ``generate`` into the sampler above:
    it returns ``p / E`` with the same noise stream, so both engines draw the same tokens."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator) -> None:
        self.temperature, self.top_p, self.generator = temperature, top_p, generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        noise = torch.empty(scores.shape, device=scores.device).exponential_(generator=self.generator)
        logp = torch.log_softmax(scores.float() / self.temperature, -1)
        return sampling_probs(logp, self.top_p) / noise


class PreallocatedLayer(DynamicLayer):
    """One decoder layer's past in buffers ``[batch, heads, capacity, head_dim]`` allocated at the
    first update: each step writes its column in place and attention reads a view of the filled
    part."""

    def __init__(self, capacity: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        super().__init__()
        self.capacity, self.filled = capacity, 0
        self.kbuf = self.vbuf = None
        if keys is not None:
            self._allocate(keys)
            self.filled = keys.shape[2]
            self.kbuf[:, :, : self.filled] = keys
            self.vbuf[:, :, : self.filled] = values
            self._views()

    def _allocate(self, like: torch.Tensor) -> None:
        B, H, _, D = like.shape
        # uninitialised: attention only ever reads the filled columns, each written before
        self.kbuf = like.new_empty(B, H, self.capacity, D)
        self.vbuf = like.new_empty(B, H, self.capacity, D)
        self.device, self.is_initialized = like.device, True

    def _views(self) -> None:
        self.keys, self.values = self.kbuf[:, :, : self.filled], self.vbuf[:, :, : self.filled]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if self.kbuf is None:
            self._allocate(key_states)
        n = key_states.shape[2]
        if self.filled + n > self.capacity:
            raise RuntimeError(f"decode cache full: {self.filled} + {n} > capacity {self.capacity}")
        self.kbuf[:, :, self.filled : self.filled + n] = key_states
        self.vbuf[:, :, self.filled : self.filled + n] = value_states
        self.filled += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
        self._views()


def kv_bytes_per_token(model: PreTrainedModel | PeftModel) -> int:
    """Bytes of key/value states one token adds to the past: layers x 2 x kv heads x head dim x
    the dtype's size (46,080 for SmolLM2-135M in fp32)."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    itemsize = next(model.parameters()).element_size()
    return config.num_hidden_layers * 2 * kv_heads * head_dim * itemsize


def batch_tokens(lengths: Sequence[int], cached: Sequence[int], max_new_tokens: int, rows: Sequence[int],
                 keep: bool = False) -> int:
    """Tokens of key/value states a decode batch of ``rows`` holds at its end: its past, rows x (longest
    cached + longest uncached + ``max_new_tokens``), and with ``keep`` (states kept for the prefix
    cache, ``decode(keep_from=...)``) each row's copy of what it read beyond its cached part."""
    past = len(rows) * (max(cached[i] for i in rows) + max(lengths[i] - cached[i] for i in rows) + max_new_tokens)
    return past + (sum(lengths[i] - cached[i] + max_new_tokens for i in rows) if keep else 0)


def batches_within(lengths: Sequence[int], cached: Sequence[int], max_new_tokens: int, tokens: int,
                   keep: bool = False) -> list[list[int]]:
    """The rows (indices) of each decode batch of one call that may hold ``tokens`` tokens of states
    (``batch_tokens``: what ``decode`` allocates, and the copies it returns with ``keep``). All of
    them in order when they fit, else shortest first, as many as fit (a row alone always goes)."""

    def size(rows: list[int]) -> int:
        return batch_tokens(lengths, cached, max_new_tokens, rows, keep)

    everything = list(range(len(lengths)))
    if size(everything) <= tokens:
        return [everything]
    batches: list[list[int]] = []
    for i in sorted(everything, key=lambda i: lengths[i]):
        if batches and size(batches[-1] + [i]) <= tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _past_tokens(past: LayerKV | ChainStates) -> int:
    """Tokens a row's past holds: a ``ChainStates`` says so without gathering a layer."""
    return past.tokens if isinstance(past, ChainStates) else past[0][0].shape[1]


def _layer_states(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]  # [B, heads, filled, head_dim]


@torch.no_grad()
def decode(
    model: PreTrainedModel | PeftModel,
    prompts: Sequence[Sequence[int]],
    past: Sequence[LayerKV | ChainStates | None],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: set[int],
    pad_id: int,
    finished: Callable[[int, list[int]], bool] | None = None,
    generator: torch.Generator | None = None,
    keep_from: Sequence[int] | None = None,
    noise_rows: Sequence[int] | None = None,
    noise_width: int | None = None,
    report: Report | None = None,
) -> list[Row]:
    """Sample up to ``max_new_tokens`` per row after ``prompts``.

    ``past[b]`` holds the states of ``prompts[b][:c_b]`` (``[heads, c_b, head_dim]`` per layer) or
    None; at least one prompt token per row must be uncached. ``finished(b, ids)`` says whether a
    row's completion is done besides EOS (stop strings). With ``max_new_tokens = 0`` the prompts
    are only read. ``keep_from[b]``, when given, asks for the states of the read tokens from that
    position on in ``Row.kv`` (for the prefix cache). ``noise_rows[b]``: row
    ``b``'s row of the ``[noise_width, V]`` noise block each step draws (default: its own index of
    this batch), for a call split over several batches. ``report``: progress (``Report``).
    """
    device = next(model.parameters()).device
    B = len(prompts)
    cached = [0 if p is None else _past_tokens(p) for p in past]
    rest = [list(prompts[b][cached[b]:]) for b in range(B)]
    if any(len(r) == 0 for r in rest):
        raise ValueError("every row needs at least one uncached prompt token")
    W, S = max(cached), max(map(len, rest))

    # the past: [B, heads, W, head_dim] per layer, row b's states in the last c_b columns
    capacity = W + S + max_new_tokens
    n_layers = model.config.get_text_config().num_hidden_layers
    layers = []
    for layer in range(n_layers):
        if W == 0:
            layers.append(PreallocatedLayer(capacity))
            continue
        rows = {b: p[layer] for b, p in enumerate(past) if p is not None}  # this layer's states only
        k0, v0 = next(iter(rows.values()))
        k = k0.new_zeros(B, k0.shape[0], W, k0.shape[2])
        v = v0.new_zeros(B, v0.shape[0], W, v0.shape[2])
        for b, (kb, vb) in rows.items():
            k[b, :, W - cached[b]:] = kb
            v[b, :, W - cached[b]:] = vb
        del rows, k0, v0
        layers.append(PreallocatedLayer(capacity, k, v))
    cache = Cache(layers=layers)
    kw = cache_kwarg(model)

    ids = torch.full((B, S), pad_id, dtype=torch.long)
    mask = torch.zeros(B, W + S, dtype=torch.long)
    pos = torch.ones(B, S, dtype=torch.long)
    for b in range(B):
        n = len(rest[b])
        ids[b, S - n:] = torch.tensor(rest[b])
        mask[b, W - cached[b]: W] = 1
        mask[b, W + S - n:] = 1
        pos[b, S - n:] = torch.arange(cached[b], cached[b] + n)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)

    was_training = model.training
    model.eval()
    try:
        lengths = [len(r) for r in rest]  # row b's real columns are S - n_b .. S
        for start in range(0, S, PREFILL_CHUNK):  # the prompt in chunks: activations of one chunk at a time
            end = min(S, start + PREFILL_CHUNK)
            logits = model(input_ids=ids[:, start:end], attention_mask=mask[:, : W + end],
                           position_ids=pos[:, start:end], use_cache=True, logits_to_keep=1,
                           **{kw: cache}).logits[:, -1]  # [B, V]: the last chunk's is the one sampled from
            if report is not None:
                report("prefill", sum(min(n, max(0, end - (S - n))) for n in lengths), sum(lengths))
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        kv: list[LayerKV | None] = [None] * B
        active = list(range(B))  # original row of each batch row
        running = [True] * B  # per batch row: still sampling (finished rows ride along until compaction)
        next_pos = pos[:, -1] + 1  # [B]
        width = B if noise_width is None else noise_width
        # each batch row's row of the noise block (the call's row, wherever the call was split)
        rows = torch.arange(B, device=device) if noise_rows is None else torch.tensor(list(noise_rows), device=device)
        for step in range(max_new_tokens):
            noise = None
            if temperature > 0:  # a [width, V] block for every row of the call, whichever are in this batch
                noise = torch.empty(width, logits.shape[-1], device=device).exponential_(generator=generator)
                if len(active) < width:  # a split call or a compaction: these rows' noise (a copy only then)
                    noise = noise[rows]
            tokens, logp = sample(logits, temperature, top_p, noise)
            last = step == max_new_tokens - 1
            for i, (b, t, lp) in enumerate(zip(active, tokens.tolist(), logp.tolist(), strict=True)):
                if not running[i]:
                    continue
                out_ids[b].append(t)
                out_lp[b].append(lp)
                if last or t in eos_ids or (finished is not None and finished(b, out_ids[b])):
                    running[i] = False
                    if keep_from is not None:  # the states of what it read, before the row moves on
                        kv[b] = _row_states(cache, i, mask[i], keep_from[b])
            if report is not None:
                report("decode", step + 1, max_new_tokens)
            if not any(running):
                break
            riding = len(active) - sum(running)
            if riding * (max_new_tokens - step - 1) > len(active):
                # Finished rows still cost a row of every step (a step is compute-bound at a few
                # dozen rows on a CPU); dropping them copies the past, about one row-step per row.
                # So drop them when the row-steps they would still cost exceed the batch's rows.
                keep = torch.tensor([i for i, r in enumerate(running) if r], device=device)
                cache.batch_select_indices(keep)
                tokens, mask, next_pos, rows = tokens[keep], mask[keep], next_pos[keep], rows[keep]
                active = [active[i] for i in keep.tolist()]
                running = [True] * len(active)
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
            logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                           use_cache=True, **{kw: cache}).logits[:, -1]
            next_pos = next_pos + 1
        if max_new_tokens == 0 and keep_from is not None:
            kv = [_row_states(cache, b, mask[b], keep_from[b]) for b in range(B)]
    finally:
        model.train(was_training)
    return [Row(out_ids[b], out_lp[b], kv[b]) for b in range(B)]


def _row_states(cache: Cache, row: int, mask_row: torch.Tensor, keep_from: int) -> LayerKV:
    """The states of batch row ``row``'s real (unmasked) columns from position ``keep_from`` on:
    ``[heads, n, head_dim]`` per layer. ``mask_row`` is that row's attention mask, as long as the
    cache's sequence."""
    cols = mask_row.nonzero().squeeze(-1)[keep_from:]
    return [(k[row][:, cols], v[row][:, cols]) for k, v in _layer_states(cache)]
