"""coevo.kernels: the GRPO loss without ever holding the full [tokens × vocab] logits.

Why: at a 151936-token vocabulary the logits of a 1024-token micro-batch are 0.6 GiB in float32, and
the obvious autograd graph holds three or four tensors of that size at once; the LM-head loss, not
the model, sets the memory ceiling of a GRPO step. The chunked paths hold one [chunk × V] tile plus
the weight gradient and compute the same loss and gradients (tests/kernels holds them to a float64
reference).

Installed as ``coevo.kernels`` (see pyproject's package-dir). Modules, one job each:

- ``spec``: hyper-parameters, input checks, the ``GRPOLossOutput`` tuple;
- ``reference``: the plain version (full logits, autograd) — baseline and float64 ground truth;
- ``token_loss``: per-token ℓ and its hand-derived dℓ/dlogp;
- ``rows_torch`` / ``triton_grpo``: row kernels turning a logits tile into token terms and dL/dlogits;
- ``chunked``: the autograd function that walks row tiles and accumulates the gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from .chunked import DEFAULT_CHUNK_SIZE, grpo_loss_chunked
from .reference import grpo_loss_reference
from .spec import GRPOLossOutput, LossParams
from .triton_grpo import TRITON_AVAILABLE, grpo_loss_triton

IMPLS = ("auto", "reference", "chunked", "triton")

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "IMPLS",
    "TRITON_AVAILABLE",
    "GRPOLossOutput",
    "LossParams",
    "grpo_loss",
    "grpo_loss_chunked",
    "grpo_loss_reference",
    "grpo_loss_triton",
    "resolve_impl",
]


def resolve_impl(impl: str, device: torch.device) -> str:
    """The concrete path "auto" means on this device: Triton on CUDA when installed, chunked torch otherwise."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    return "triton" if TRITON_AVAILABLE and device.type == "cuda" else "chunked"


def grpo_loss(
    hidden: torch.Tensor,  # [N, H] final hidden states at the positions that predict the targets
    weight: torch.Tensor,  # [V, H] LM head, no bias
    targets: torch.Tensor,  # [N] int64 token ids
    old_logp: torch.Tensor,  # [N] behaviour log-probs
    advantages: torch.Tensor,  # [N] per token (each token carries its sequence's advantage)
    token_weights: torch.Tensor,  # [N] ≥ 0, detached: aggregation weight × importance correction
    *,
    ref_logp: torch.Tensor | None = None,  # [N] reference-model log-probs, for the k3 KL
    beta: float = 0.0,
    temperature: float | torch.Tensor = 1.0,  # one T for every token, or [N]: the T that sampled each
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    impl: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> GRPOLossOutput:
    """Clipped GRPO loss Σ_i token_weights_i · ℓ_i, differentiable w.r.t. hidden and weight.

    Per token, with logp = log_softmax(hidden · weightᵀ / T_i)[target] (T_i = ``temperature``, or its
    i-th entry when it is a tensor: a batch may mix calls sampled at different temperatures) and
    r = exp(logp − old_logp): ℓ = max(−r·A, −clip(r, 1−eps_low, 1+eps_high)·A), capped at −c·A for
    A < 0 when ``dual_clip=c``, plus beta·k3 with k3 = exp(ref − logp) − (ref − logp) − 1.

    Aggregation (token mean, sequence mean, DAPO) is entirely the caller's choice of
    ``token_weights``, so one kernel serves all of them and micro-batching cannot change the loss.
    ``impl``: "reference" materialises the logits; "chunked" (CPU default) and "triton" (CUDA
    default) never do; ``chunk_size`` rows form one logits tile in the chunked paths.
    """
    resolved = resolve_impl(impl, hidden.device)
    common: dict[str, Any] = {
        "ref_logp": ref_logp,
        "beta": beta,
        "temperature": temperature,
        "eps_low": eps_low,
        "eps_high": eps_high,
        "dual_clip": dual_clip,
    }
    if resolved == "reference":
        return grpo_loss_reference(hidden, weight, targets, old_logp, advantages, token_weights, **common)
    if resolved == "triton":
        return grpo_loss_triton(
            hidden, weight, targets, old_logp, advantages, token_weights, chunk_size=chunk_size, **common
        )
    return grpo_loss_chunked(
        hidden, weight, targets, old_logp, advantages, token_weights, chunk_size=chunk_size, **common
    )
