"""Loss aggregation: how per-token losses of an optimizer step are weighted into one scalar.

All three modes are expressed as per-token weights over the whole optimizer step (every
micro-batch on every process), so the loss is Σ_i w_i ℓ_i whatever the micro-batching or the
number of processes — which is what makes one process with doubled accumulation equal two.

- ``token_mean``: w = 1 / (tokens in the step); long completions count more.
- ``sequence_mean``: w = 1 / (sequences in the step × tokens in that sequence); each model call
  counts the same.
- ``dapo``: w = 1 / (global token count), DAPO's token-level normalisation by the number of
  tokens over all processes (equal to token_mean when the step is seen whole; kept distinct
  because callers pass the global count explicitly when they only see their shard).
"""

from __future__ import annotations

from typing import Sequence

import torch

MODES = ("token_mean", "sequence_mean", "dapo")


def token_weights(
    seq_lengths: Sequence[int],
    mode: str,
    *,
    step_tokens: int | None = None,
    step_sequences: int | None = None,
) -> torch.Tensor:
    """Per-token weights [sum(seq_lengths)] for sequences of the given (trainable) lengths.

    ``step_tokens`` / ``step_sequences`` are the totals over the whole optimizer step; they default
    to this call's own totals (a step seen whole).
    """
    if mode not in MODES:
        raise ValueError(f"loss aggregation must be one of {MODES}, got {mode!r}")
    lengths = torch.as_tensor(list(seq_lengths), dtype=torch.float32)  # [S]
    if (lengths < 0).any():
        raise ValueError("sequence lengths must be >= 0")
    total_tokens = float(step_tokens if step_tokens is not None else lengths.sum())
    total_seqs = float(step_sequences if step_sequences is not None else (lengths > 0).sum())
    if mode in ("token_mean", "dapo"):
        per_seq = torch.full_like(lengths, 1.0 / max(total_tokens, 1.0))
    else:
        per_seq = 1.0 / (max(total_seqs, 1.0) * lengths.clamp(min=1))
    return torch.repeat_interleave(per_seq, lengths.long())  # [N]
