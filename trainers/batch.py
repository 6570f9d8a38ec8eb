"""From traces to training sequences: one sequence per trainable model call, packed per trace.

Every model call of a trace is trained with that trace's advantage: the reward scores the whole
episode, so every call that led to it shares its credit. A sequence keeps
the exact prompt and completion ids the policy saw and produced, the behaviour log-probs cached
by the replay buffer, the sampler's log-probs when the policy gave them, and the temperature its
tokens were drawn at: the harness may sample calls at different temperatures (a temperature
schedule), and current-policy log-probs, ratios and KL must use each token's own.

A multi-turn trace's calls usually chain: call k's prompt and completion are the start of call
k + 1's prompt (the runtime extends one conversation). ``pack_calls`` trains such a chain as one
row, every completion span read off one forward pass: the same hidden states (causal attention,
the same positions) for a fraction of the tokens, since each call's prompt is no longer
re-read. The calls stay the loss's sequences (``Collated.lengths``), so every aggregation weighs
them as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from coevo.agent.trace import ModelCall, Trace


@dataclass(frozen=True)
class TrainSequence:
    trace_index: int  # position of its trace in the update's trace list
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logp: list[float]  # behaviour log-probs (buffer), one per completion token
    sampler_logp: list[float] | None
    advantage: float
    loss_weight: float
    temperature: float = 1.0  # the log-prob temperature of its tokens (ModelCall.logprob_temperature)


def training_sequences(traces: Sequence[Trace], advantages: torch.Tensor, *,
                       credit_prefill: bool = False, distill_demos: bool = False,
                       distill_prompt: str = "all") -> list[TrainSequence]:
    """Flatten the trainable, non-empty model calls of trainable traces into sequences, each scored at
    the temperature that sampled it. A call recorded without one (a record of an earlier coevo,
    before model calls kept their sampling parameters; reading such a run still works) is a
    ValueError: no temperature is guessed for it.

    ``credit_prefill``: a call whose reply the harness prefilled (a forced tool call) and whose
    trace has a positive advantage is trained with the prefix as actions, under the prompt without
    it (``credit_forced``): the decision the harness forced, credited where it led to success.

    ``distill_demos``: each call of a trace with a positive advantage whose prompt held the harness's
    demonstrations (``ModelCall.demo_span``) is trained a second time under the prompt without them
    (``distilled``), after the trace's own calls (so chained calls still pack); ``distill_prompt``:
    without every demonstration (``all``, ``ModelCall.demo_span``), without the one nearest the
    task (``nearest``, ``ModelCall.nearest_demo_span``: what the retirement's next shed shows), or
    a copy under each (``both``: the next shed's prompt and the last one's, so the weights are
    learning the prompt without any demonstration before the last shed asks for it; one copy when
    the two prompts are the same)."""
    if distill_prompt not in DISTILL_PROMPTS:
        raise ValueError(f"distill_prompt={distill_prompt!r}; choose one of {', '.join(DISTILL_PROMPTS)}")
    out: list[TrainSequence] = []
    for i, (trace, adv) in enumerate(zip(traces, advantages.tolist(), strict=True)):
        if not trace.trainable:
            continue
        copies: tuple[list[TrainSequence], list[TrainSequence]] = ([], [])  # under each distilled prompt
        if trace.behaviour_logprobs is None:
            raise ValueError(f"trace {trace.trace_id} has no behaviour log-probs; insert it through the replay buffer")
        for k, call in enumerate(trace.model_calls):
            if not call.trainable or not call.completion_ids:
                continue
            old = trace.behaviour_logprobs[k]
            if len(old) != len(call.completion_ids):
                raise ValueError(f"trace {trace.trace_id} call {k}: {len(old)} behaviour log-probs for "
                                 f"{len(call.completion_ids)} tokens")
            sampler = call.sampler_logprobs
            if sampler is not None and len(sampler) != len(call.completion_ids):  # would misalign every later token
                raise ValueError(f"trace {trace.trace_id} call {k}: {len(sampler)} sampler log-probs for "
                                 f"{len(call.completion_ids)} tokens")
            temperature = call.logprob_temperature()
            if temperature is None:
                raise ValueError(f"trace {trace.trace_id} call {k} has no sampling temperature (recorded by an earlier "
                                 "coevo): it cannot be trained at the temperature that sampled it")
            seq = TrainSequence(i, call.prompt_ids, call.completion_ids, old, sampler, float(adv), call.loss_weight,
                                temperature)
            seq = credit_forced(seq, call.prefix_tokens) if credit_prefill and adv > 0 else seq
            out.append(seq)
            if distill_demos and adv > 0:
                for under, span in zip(copies, _distill_spans(call, distill_prompt), strict=False):
                    under.append(distilled(seq, span))
        out.extend(copies[0] + copies[1])  # a prompt's copies side by side: its chained calls pack
    return out


DISTILL_PROMPTS = ("all", "nearest", "both")
"""What ``training_sequences``' distilled copies leave out of the prompt (``trainer.distill_prompt``)."""


def _distill_spans(call: ModelCall, distill_prompt: str) -> list[tuple[int, int]]:
    """The demonstration spans a call's distilled copies leave out, each once: none when its prompt
    held no demonstration."""
    spans = {"all": [call.demo_span], "nearest": [call.nearest_demo_span],
             "both": [call.nearest_demo_span, call.demo_span]}[distill_prompt]
    out: list[tuple[int, int]] = []
    for span in spans:
        if span is not None and (span[0], span[1]) not in out:
            out.append((span[0], span[1]))
    return out


FORCED = float("nan")
"""The behaviour log-prob of a token no policy sampled (the harness wrote it): the loss rates it
against the current policy (ratio 1), so its gradient is the advantage times ∇log π."""


def credit_forced(seq: TrainSequence, prefix_tokens: int) -> TrainSequence:
    """``seq`` with the last ``prefix_tokens`` of its prompt (the reply the harness prefilled) moved
    to the front of its completion, their behaviour and sampler log-probs ``FORCED``.

    Under a forced prefill the model never decides to call the tool: the call's opening is prompt,
    so no gradient reaches the decision, and an episode without the prefill that happens to call it
    is rare and mostly fails. Credited this way, a scaffolded success teaches the model to open the
    call itself, under exactly the prompt the harness without its prefill shows. The behaviour
    policy gave these tokens probability 1, so an importance ratio against it would be π itself
    (tiny where the decision is unlearned, and the PPO clip would hold it near the insertion-time
    value); rated against the current policy they get an advantage-weighted likelihood gradient,
    as off-policy guidance does for demonstrations."""
    if prefix_tokens <= 0:
        return seq
    if prefix_tokens >= len(seq.prompt_ids):
        raise ValueError(f"a prefix of {prefix_tokens} tokens in a prompt of {len(seq.prompt_ids)}")
    forced = [FORCED] * prefix_tokens
    return dataclasses.replace(
        seq, prompt_ids=seq.prompt_ids[:-prefix_tokens],
        completion_ids=seq.prompt_ids[-prefix_tokens:] + seq.completion_ids, old_logp=forced + list(seq.old_logp),
        sampler_logp=None if seq.sampler_logp is None else forced + list(seq.sampler_logp))


def distilled(seq: TrainSequence, demo_span: Sequence[int]) -> TrainSequence:
    """``seq`` under its prompt without the demonstration tokens ``prompt_ids[start:end]``, every
    completion token ``FORCED`` (context distillation). The behaviour log-probs were those of the
    prompt with the demonstrations; under the prompt without them no policy sampled these tokens, so
    they are rated against the current policy, as forced tokens are: the gradient is the advantage
    times ∇log π(reply | prompt without demonstrations), which moves the bare prompt's policy toward
    what the demonstrations made it do where that succeeded. A forced prefix already moved into the
    completion (``credit_forced``) lies after the span and stays."""
    start, end = demo_span
    if not 0 <= start < end <= len(seq.prompt_ids):
        raise ValueError(f"demonstration span [{start}, {end}) outside a prompt of {len(seq.prompt_ids)} tokens")
    forced = [FORCED] * len(seq.completion_ids)
    return dataclasses.replace(seq, prompt_ids=seq.prompt_ids[:start] + seq.prompt_ids[end:], old_logp=forced,
                               sampler_logp=None if seq.sampler_logp is None else forced)


@dataclass(frozen=True)
class PackedSequence:
    """Calls of one trace that chain (each call's prompt + completion starts the next one's prompt):
    one row of ``parts[-1].prompt_ids + parts[-1].completion_ids`` with every part's completion."""

    parts: tuple[TrainSequence, ...]

    @property
    def temperatures(self) -> set[float]:
        return {p.temperature for p in self.parts}


def pack_calls(seqs: Sequence[TrainSequence]) -> list[TrainSequence | PackedSequence]:
    """Merge consecutive sequences of the same trace whose tokens chain; others stay as they are."""
    out: list[TrainSequence | PackedSequence] = []
    chain: list[TrainSequence] = []
    for s in seqs:
        if chain:
            last = chain[-1]
            full = last.prompt_ids + last.completion_ids
            if s.trace_index == last.trace_index and s.prompt_ids[: len(full)] == full:
                chain.append(s)
                continue
            out.append(chain[0] if len(chain) == 1 else PackedSequence(tuple(chain)))
        chain = [s]
    if chain:
        out.append(chain[0] if len(chain) == 1 else PackedSequence(tuple(chain)))
    return out


def parts_of(item: TrainSequence | PackedSequence) -> tuple[TrainSequence, ...]:
    return item.parts if isinstance(item, PackedSequence) else (item,)


@dataclass
class Collated:
    input_ids: torch.Tensor  # [B, T] right-padded prompt+completion
    attention_mask: torch.Tensor  # [B, T]
    rows: torch.Tensor  # [N] batch row of each completion token
    positions: torch.Tensor  # [N] position whose hidden state predicts that token
    targets: torch.Tensor  # [N] the completion token ids
    old_logp: torch.Tensor  # [N]
    sampler_logp: torch.Tensor | None  # [N]; a sequence without them has its behaviour log-probs here (no
    # correction for its tokens); None when no sequence of the batch has them
    advantages: torch.Tensor  # [N]
    loss_weights: torch.Tensor  # [N]
    temperatures: torch.Tensor  # [N] the temperature each token was sampled at
    lengths: list[int]  # completion tokens per sequence (per call: a packed row holds several)


def collate(items: Sequence[TrainSequence | PackedSequence], pad_id: int,
            device: torch.device | str = "cpu") -> Collated:
    """One right-padded batch row per item; every completion token's (row, position, target) and
    per-token values, in item order and, within a packed item, call order."""
    full = [parts_of(item)[-1].prompt_ids + parts_of(item)[-1].completion_ids for item in items]
    width = max(len(f) for f in full)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    rows, positions = [], []
    seqs = [s for item in items for s in parts_of(item)]
    for b, (item, f) in enumerate(zip(items, full, strict=True)):
        input_ids[b, : len(f)] = torch.tensor(f)
        mask[b, : len(f)] = 1
        for s in parts_of(item):
            start = len(s.prompt_ids) - 1  # the hidden state at position p predicts token p + 1
            positions.extend(range(start, start + len(s.completion_ids)))
            rows.extend([b] * len(s.completion_ids))

    def flat(values: Sequence[Sequence[float]]) -> torch.Tensor:
        return torch.tensor([v for seq in values for v in seq], dtype=torch.float32, device=device)

    has_sampler = any(s.sampler_logp is not None for s in seqs)
    lengths = [len(s.completion_ids) for s in seqs]
    return Collated(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        rows=torch.tensor(rows, device=device),
        positions=torch.tensor(positions, device=device),
        targets=torch.tensor([t for s in seqs for t in s.completion_ids], device=device),
        old_logp=flat([s.old_logp for s in seqs]),
        sampler_logp=flat([s.old_logp if s.sampler_logp is None else s.sampler_logp for s in seqs])
        if has_sampler else None,
        advantages=flat([[s.advantage] * n for s, n in zip(seqs, lengths, strict=True)]),
        loss_weights=flat([[s.loss_weight] * n for s, n in zip(seqs, lengths, strict=True)]),
        temperatures=flat([[s.temperature] * n for s, n in zip(seqs, lengths, strict=True)]),
        lengths=lengths,
    )


def row_length(item: TrainSequence | PackedSequence) -> int:
    """Tokens in ``item``'s batch row (its last call's prompt and completion)."""
    last = parts_of(item)[-1]
    return len(last.prompt_ids) + len(last.completion_ids)


def micro_batches(rows: Sequence[TrainSequence | PackedSequence], world: int, size: int,
                  tokens: int | None = None) -> list[list[list[TrainSequence | PackedSequence]]]:
    """Each process's micro-batches of ``rows`` (process ``p`` takes ``rows[p::world]``, in order).

    A micro-batch holds at most ``size`` rows and, with ``tokens``, at most that many padded
    tokens (rows x its longest row; a row longer than the budget goes alone): memory follows the
    padded batch, and one packed row of a multi-call trace can be many times a single call's. Every
    process gets the same number of micro-batches (the shorter lists end with empty ones, which the
    trainer fills with a zero-weight forward), since each backward takes part in the gradient
    reduction."""
    per_process = []
    for p in range(world):
        out: list[list[TrainSequence | PackedSequence]] = []
        widest = 0  # the longest row of out[-1]
        for row in rows[p::world]:
            n = row_length(row)
            if out and len(out[-1]) < size and (tokens is None or max(widest, n) * (len(out[-1]) + 1) <= tokens):
                out[-1].append(row)
                widest = max(widest, n)
            else:
                out.append([row])
                widest = n
        per_process.append(out)
    count = max(1, *(len(out) for out in per_process))
    return [out + [[] for _ in range(count - len(out))] for out in per_process]
