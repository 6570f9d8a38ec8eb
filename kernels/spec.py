"""What every GRPO loss path accepts and returns: the per-token inputs, the input checks, the output.

The reference, chunked and Triton paths share these definitions (and ``objective.LossParams`` for
the hyper-parameters) so that they cannot drift apart in what they accept or how they report it,
and so that the tests compare like with like.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .objective import LossParams


class Tokens(NamedTuple):
    """The per-token inputs of N rows: what the loss needs beside the hidden states and the LM head."""

    targets: torch.Tensor  # [N] int64 (or int32) token ids
    old_logp: torch.Tensor  # [N] behaviour log-probs
    advantages: torch.Tensor  # [N] per token (each token carries its sequence's advantage)
    token_weights: torch.Tensor  # [N] ≥ 0, detached: aggregation weight × importance correction
    ref_logp: torch.Tensor | None = None  # [N] reference-model log-probs, for the KL
    # One T for every row, or [N]: the T that sampled each row (a batch may mix temperatures). A float
    # keeps the scalar path, whose rounding of 1/T differs from a per-row float32 column.
    temperature: float | torch.Tensor = 1.0

    def rows(self, index: slice) -> Tokens:
        """The inputs of rows ``index``."""
        t = self.temperature
        return Tokens(
            self.targets[index], self.old_logp[index], self.advantages[index], self.token_weights[index],
            self.ref_logp[index] if self.ref_logp is not None else None,
            t[index] if isinstance(t, torch.Tensor) else t,
        )  # fmt: skip


class GRPOLossOutput(NamedTuple):
    """The scalar loss (differentiable w.r.t. hidden and weight) and detached per-token diagnostics."""

    loss: torch.Tensor  # [] Σ_i token_weights_i · ℓ_i
    logp: torch.Tensor  # [N] log π(target | context) at the given temperature, detached
    ratio: torch.Tensor  # [N] exp(logp − old_logp), detached
    clipped: torch.Tensor  # [N] bool: the ratio clip (or the dual clip) was active, so ℓ_clip had no gradient
    kl: torch.Tensor | None  # [N] KL estimate (LossParams.kl_estimator), detached; None without ref_logp


def check_inputs(hidden: torch.Tensor, weight: torch.Tensor, tokens: Tokens, params: LossParams) -> None:
    """Raise ValueError on shapes, dtypes, devices or temperatures that would otherwise fail deep
    inside a kernel (or silently give a wrong loss)."""
    if hidden.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    n, h = hidden.shape
    if weight.shape[1] != h:
        raise ValueError(f"hidden size mismatch: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or not hidden.is_floating_point():
        raise ValueError(f"hidden and weight must share one floating dtype, got {hidden.dtype} and {weight.dtype}")
    per_token = {name: t for name, t in tokens._asdict().items() if isinstance(t, torch.Tensor)}
    for name, t in per_token.items():
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape [{n}], got {tuple(t.shape)}")
        if t.device != hidden.device or weight.device != hidden.device:
            raise ValueError(f"all inputs must be on one device; {name} is on {t.device}, hidden on {hidden.device}")
    if tokens.targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64 (or int32) token ids, got {tokens.targets.dtype}")
    # One host sync per call, worth it: an out-of-range id would make a Triton kernel read past the row.
    if n and (int(tokens.targets.min()) < 0 or int(tokens.targets.max()) >= weight.shape[0]):
        raise ValueError(f"targets must lie in [0, {weight.shape[0]})")
    check_temperature(tokens.temperature)
    if params.beta > 0 and tokens.ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp for the KL penalty")


def check_temperature(temperature: float | torch.Tensor) -> None:
    """A positive, finite temperature: one number, or one floating value per row (shape checked above)."""
    if not isinstance(temperature, torch.Tensor):
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a positive finite number, got {temperature}")
        return
    if not temperature.is_floating_point():
        raise ValueError(f"temperature must be a number or a floating tensor, got {temperature.dtype}")
    if temperature.numel() and not (bool((temperature > 0).all()) and bool(torch.isfinite(temperature).all())):
        raise ValueError("temperature must be positive and finite in every row")
