"""Hidden states at completion positions and chunked token log-probs, without full logits.

The replay buffer's behaviour log-probs, the reference model's log-probs and the trainer's loss
all use the same path: the decoder's final (normed) hidden states, then the LM head applied in
row chunks. Using one path keeps the ratio exactly 1 on-policy up to float rounding.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from coevo.trainers.batch import TrainSequence, collate


def lm_head_weight(model: Any) -> torch.Tensor:
    """The LM head weight [V, H] of a causal LM, under PEFT and DDP wrappers."""
    base = getattr(model, "module", model)  # DDP wrapper
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    head = base.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("LM heads with a bias are not supported by the fused GRPO loss")
    return head.weight


def completion_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
    """[N, H] hidden states that predict each completion token.

    It calls the model's own forward (so DDP/FSDP wrappers see the forward they need for gradient
    synchronisation) with ``logits_to_keep=1``, so the LM head runs on one position only; the
    final normed hidden states come back as the last entry of ``hidden_states``.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1,
                use_cache=False)
    return out.hidden_states[-1][rows, positions]  # [N, H]


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


def logprob_fn(model: Any, pad_id: int, *, temperature: float, batch_size: int
               ) -> Callable[[Sequence[Sequence[Any]]], list[list[float]]]:
    """The replay buffer's LogprobFn: behaviour log-probs of ``LogprobQuery`` items (prompt ids,
    completion ids, temperature) under ``model`` as it is now, each at its own temperature, in
    batches of ``batch_size`` sequences (one forward per batch). ``temperature`` is the run's
    rollout temperature, for items without one (None, or plain (prompt, completion) pairs). Neither has a
    default here: a run passes ``buffer.logprob_batch_size`` and its rollout temperature."""

    @torch.no_grad()
    def fn(pairs: Sequence[Sequence[Any]]) -> list[list[float]]:
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
                hidden = completion_hidden(model, batch.input_ids, batch.attention_mask, batch.rows, batch.positions)
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
