"""coevo.kernels: the GRPO loss without ever holding the full [tokens × vocab] logits.

Why: at a 151936-token vocabulary the logits of a 1024-token micro-batch are 0.6 GiB in float32, and
the obvious autograd graph holds three or four tensors of that size at once; the LM-head loss, not
the model, sets the memory ceiling of a GRPO step. The chunked paths hold one [chunk × V] tile plus
the weight gradient and compute the same loss and gradients (tests/kernels holds them to a float64
reference).

Installed as ``coevo.kernels`` (see pyproject's package-dir). Modules, one job each:

- ``objective``: the per-token loss written once (clip, KL estimators, each value with its
  derivative), the aggregations, the one ``VARIANTS`` table choosing them, and ``LossParams``;
- ``spec``: the per-token inputs (``Tokens``), input checks, the ``GRPOLossOutput`` tuple;
- ``reference``: the plain version (full logits, autograd) — baseline and float64 ground truth;
- ``rows_torch`` / ``triton_grpo``: row kernels turning a logits tile into token terms and dL/dlogits;
- ``chunked``: the autograd function that walks row tiles and accumulates the gradients;
- ``select``: which path ``impl="auto"`` runs (on a GPU, the fastest that fits, measured once per shape class).
"""

from __future__ import annotations

import torch

from .chunked import DEFAULT_CHUNK_SIZE, DEFAULT_WORKSPACE_MIB, grpo_loss_chunked
from .objective import AGGREGATIONS, KL_ESTIMATORS, VARIANTS, LossParams, token_loss, token_weights
from .reference import grpo_loss_reference
from .select import auto_impl
from .spec import GRPOLossOutput, Tokens
from .triton_grpo import TRITON_AVAILABLE, grpo_loss_triton

IMPLS = ("auto", "reference", "chunked", "triton")

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_WORKSPACE_MIB",
    "IMPLS",
    "KL_ESTIMATORS",
    "TRITON_AVAILABLE",
    "VARIANTS",
    "auto_impl",
    "GRPOLossOutput",
    "LossParams",
    "Tokens",
    "grpo_loss",
    "grpo_loss_chunked",
    "grpo_loss_reference",
    "grpo_loss_triton",
    "token_loss",
    "token_weights",
]


def grpo_loss(
    hidden: torch.Tensor,  # [N, H] final hidden states at the positions that predict the targets
    weight: torch.Tensor,  # [V, H] LM head, no bias
    targets: torch.Tensor,  # [N] int64 token ids
    old_logp: torch.Tensor,  # [N] behaviour log-probs
    advantages: torch.Tensor,  # [N] per token (each token carries its sequence's advantage)
    token_weights: torch.Tensor,  # [N] ≥ 0, detached: aggregation weight × importance correction
    *,
    ref_logp: torch.Tensor | None = None,  # [N] reference-model log-probs, for the KL
    temperature: float | torch.Tensor = 1.0,  # one T for every token, or [N]: the T that sampled each
    params: LossParams = LossParams(),
    impl: str = "auto",
    chunk_size: int | None = None,
    workspace_mib: float = DEFAULT_WORKSPACE_MIB,
) -> GRPOLossOutput:
    """GRPO loss Σ_i token_weights_i · ℓ_i, differentiable w.r.t. hidden and weight.

    Per token, logp = log_softmax(hidden · weightᵀ / T_i)[target] (T_i = ``temperature``, or its
    i-th entry when it is a tensor: a batch may mix calls sampled at different temperatures) and ℓ
    is ``objective.token_loss``: the clipped surrogate chosen by ``params`` plus beta × its KL estimate.

    Aggregation (``objective.token_weights``) is entirely the caller's choice of ``token_weights``,
    so one kernel serves every mode and micro-batching cannot change the loss. ``impl``: "reference"
    materialises the logits; "chunked" and "triton" never do; "auto" is chunked on a CPU and on a
    GPU the fastest path that fits (``select.auto_impl``). ``chunk_size`` rows form one logits tile
    in the chunked paths; None sizes it for the device (``chunked.tile_rows``: 128 rows on a CPU, on
    a GPU what fits in ``workspace_mib``).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    tokens = Tokens(targets, old_logp, advantages, token_weights, ref_logp, temperature)
    resolved = auto_impl(hidden, weight, params) if impl == "auto" else impl
    if resolved == "reference":
        return grpo_loss_reference(hidden, weight, tokens, params)
    tiles = {"chunk_size": chunk_size, "workspace_mib": workspace_mib}
    if resolved == "triton":
        return grpo_loss_triton(hidden, weight, tokens, params, **tiles)
    return grpo_loss_chunked(hidden, weight, tokens, params, **tiles)
