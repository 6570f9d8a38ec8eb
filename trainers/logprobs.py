"""Hidden states at completion positions and chunked token log-probs, without full logits.

The replay buffer's behaviour log-probs, the reference model's log-probs and the trainer's loss
all use the same path: the decoder's final (normed) hidden states, then the LM head applied in
row chunks. Using one path keeps the ratio exactly 1 on-policy up to float rounding.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import torch

from coevo.trainers import zero
from coevo.trainers.batch import TrainSequence, collate

if TYPE_CHECKING:
    from transformers.cache_utils import DynamicLayer

Query = tuple[Sequence[int], Sequence[int]] | tuple[Sequence[int], Sequence[int], float | None]
"""What ``logprob_fn``'s function scores: a ``LogprobQuery`` (prompt ids, completion ids, temperature or
None) or a plain (prompt ids, completion ids) pair."""


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP (or DataParallel) wrapper or a DeepSpeed engine, which hold it as
    ``module``; any other model as it is."""
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)) or zero.is_engine(model):
        return model.module
    return model


def lm_head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The LM head weight [V, H] of a causal LM, under PEFT and DDP wrappers."""
    base = _unwrapped(model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    head = base.get_output_embeddings()  # an nn.Linear [V, H]
    if head.bias is not None:
        raise ValueError("LM heads with a bias are not supported by the fused GRPO loss")
    return head.weight


MIN_SHARED_PREFIX = 32
"""Shortest common prefix (tokens) worth its own forward pass; below it one pass reads every row."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> int:
    """Tokens at the start of every row of a batch, up to the first position whose hidden state is
    needed (hidden states from ``positions.min()`` on must come from the rows' own pass).

    A group's attempts share their prompt, and a harness's prompts share its system prompt and
    demonstrations: under the tool-path harness 420 of a 468-token row are common to all rows."""
    if input_ids.shape[0] < 2:
        return 0
    limit = min(int(attention_mask.sum(1).min()), int(positions.min()))
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(0)  # [limit]
    return int(same.long().cumprod(0).sum())


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The forward argument that takes a KV cache: ``cache`` in newer transformers, ``past_key_values``
    before (an unknown keyword would be swallowed by ``**kwargs`` and the prefix silently ignored)."""
    base = _unwrapped(model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def completion_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                      positions: torch.Tensor, *, share_prefix: bool = False) -> torch.Tensor:
    """[N, H] hidden states that predict each completion token.

    It calls the model's own forward (so DDP/FSDP wrappers see the forward they need for gradient
    synchronisation) with ``logits_to_keep=1``, so the LM head runs on one position only; the
    final normed hidden states come back as the last entry of ``hidden_states``.

    With ``share_prefix`` the tokens every row starts with (``shared_prefix_length``) are read once:
    one pass over the prefix fills a KV cache, which is repeated over the batch for the rows' own
    pass. Causal attention makes this the same computation (the cache keeps the autograd graph, so
    the prefix's gradients are the sum over rows), ~1e-6 apart in fp32 from reading every row whole.
    """
    shared = shared_prefix_length(input_ids, attention_mask, positions) if share_prefix else 0
    if shared < MIN_SHARED_PREFIX:
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                    logits_to_keep=1, use_cache=False)
        return out.hidden_states[-1][rows, positions]  # [N, H]
    from transformers import DynamicCache

    key = _cache_kwarg(model)
    # The prefix pass goes to the wrapped module: a DDP wrapper must see exactly one forward per backward.
    inner = _unwrapped(model)
    cache = DynamicCache()  # filled in place by the prefix pass
    with _checkpointing_off(inner):  # a checkpointed prefix pass would write the cache again when recomputed
        inner(input_ids=input_ids[:1, :shared], use_cache=True, logits_to_keep=1, **{key: cache})
    cache.batch_repeat_interleave(input_ids.shape[0])  # [1, heads, S, d] -> [B, heads, S, d] per layer
    for layer in cache.layers:  # the rows only read the prefix: a recomputed (checkpointed) layer reads it alike
        layer.update = partial(_read_prefix, layer)  # type: ignore[method-assign,union-attr,arg-type]  # this cache
    out = model(input_ids=input_ids[:, shared:], attention_mask=attention_mask, output_hidden_states=True,
                logits_to_keep=1, use_cache=False, **{key: cache})  # read only: nothing to return
    return out.hidden_states[-1][rows, positions - shared]  # [N, H]


def _read_prefix(layer: DynamicLayer, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
                 **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's ``update`` that returns the prefix's keys and values followed by the new ones
    [B, heads, S + s, d] without storing them, so a layer run twice (forward, then its checkpointed
    recompute) sees the same prefix both times."""
    assert layer.keys is not None and layer.values is not None  # the prefix pass filled them
    return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


@contextmanager
def _checkpointing_off(model: torch.nn.Module) -> Iterator[None]:
    """``model``'s checkpointed layers run as plain layers inside the block (transformers'
    ``GradientCheckpointingLayer.gradient_checkpointing``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    for m in layers:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True


def allow_prefix_reads(model: torch.nn.Module) -> None:
    """Let ``model``'s checkpointed layers keep the KV cache they are handed: the shared-prefix pass
    hands them a cache that only reads (``_read_prefix``), so a recompute gives the same states.
    Without it transformers drops the cache under checkpointing and the rows would lose their prefix."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache"):  # before transformers 5.x
        raise ValueError("trainer.gradient_checkpointing needs transformers >= 5.19: older checkpointed layers drop "
                         "the shared prompt's KV cache, and the rows would be read without their prompt")
    for m in model.modules():
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing:
            m._can_checkpoint_with_cache = True


@torch.no_grad()
def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float | torch.Tensor = 1.0, chunk: int = 256) -> torch.Tensor:
    """[N] log softmax(hidden @ weight.T / T)[target], ``chunk`` rows at a time; ``temperature`` is
    one T for all rows or a [N] tensor with each row's own."""
    out = torch.empty(targets.shape[0], dtype=torch.float32, device=hidden.device)
    per_row = isinstance(temperature, torch.Tensor)
    for s in range(0, targets.shape[0], chunk):
        t = temperature[s : s + chunk, None].float() if per_row else temperature  # [c, 1] or a float
        logits = (hidden[s : s + chunk] @ weight.T).float() / t  # [c, V]
        out[s : s + chunk] = logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - logits.logsumexp(-1)
    return out


LOGPROB_BATCH_SIZE = 8
"""Sequences per forward when a run caches behaviour log-probs (``logprob_fn``'s ``batch_size``). No
config field."""


def logprob_fn(model: torch.nn.Module, pad_id: int, *, temperature: float, batch_size: int,
               share_prefix: bool = False) -> Callable[[Sequence[Query]], list[list[float]]]:
    """The replay buffer's LogprobFn: behaviour log-probs of ``LogprobQuery`` items (prompt ids,
    completion ids, temperature) under ``model`` as it is now, each at its own temperature, in
    batches of ``batch_size`` sequences (one forward per batch). ``temperature`` is the run's
    rollout temperature, for items without one (None, or plain (prompt, completion) pairs). Neither has a
    default here: a run passes ``LOGPROB_BATCH_SIZE`` and its rollout temperature.
    ``share_prefix``: read each batch's common prefix once (``completion_hidden``; the same log-probs
    within fp32 rounding): a run passes True, the tests prove the equivalence with False."""

    @torch.no_grad()
    def fn(pairs: Sequence[Query]) -> list[list[float]]:
        was_training = model.training
        model.eval()
        out: list[list[float]] = []
        device = next(model.parameters()).device
        weight = lm_head_weight(model)
        try:
            for s in range(0, len(pairs), batch_size):
                chunk = [TrainSequence(0, list(q[0]), list(q[1]), [0.0] * len(q[1]), None, 0.0, 1.0,
                                       temperature if len(q) < 3 or q[2] is None else float(q[2]))
                         for q in pairs[s : s + batch_size]]
                nonempty = [q for q in chunk if q.completion_ids]
                if not nonempty:
                    out.extend([] for _ in chunk)
                    continue
                batch = collate(nonempty, pad_id, device)
                hidden = completion_hidden(model, batch.input_ids, batch.attention_mask, batch.rows, batch.positions,
                                          share_prefix=share_prefix)
                logp = token_logprobs(hidden, weight, batch.targets, batch.temperatures).tolist()
                it = iter(batch.lengths)
                for q in chunk:
                    if q.completion_ids:
                        n = next(it)
                        out.append(logp[:n])
                        logp = logp[n:]
                    else:
                        out.append([])
        finally:
            model.train(was_training)
        return out

    return fn
