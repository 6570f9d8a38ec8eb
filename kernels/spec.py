"""What every GRPO loss path accepts and returns: the hyper-parameters, the input checks, the output.

The reference, chunked and Triton paths share these definitions so that they cannot drift apart in
what they accept or how they report it, and so that the tests compare like with like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch


class GRPOLossOutput(NamedTuple):
    """The scalar loss (differentiable w.r.t. hidden and weight) and detached per-token diagnostics."""

    loss: torch.Tensor  # [] Σ_i token_weights_i · ℓ_i
    logp: torch.Tensor  # [N] log π(target | context) at the given temperature, detached
    ratio: torch.Tensor  # [N] exp(logp − old_logp), detached
    clipped: torch.Tensor  # [N] bool: the ratio clip (or the dual clip) was active, so ℓ_clip had no gradient
    kl: torch.Tensor | None  # [N] k3 estimate of KL(π ‖ π_ref), detached; None without ref_logp


@dataclass(frozen=True)
class LossParams:
    """Scalar settings of the clipped GRPO objective, validated once at construction.

    ``temperature`` is the one temperature of every row; per-row temperatures (a batch whose calls
    were sampled at different temperatures) travel as a tensor beside it (``row_temperatures``).

    ``dual_clip`` is the constant c > 1 of dual-clip PPO: for A < 0 the per-token loss is capped at
    −c·A, so a token whose ratio has exploded cannot push the policy arbitrarily far.
    """

    temperature: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    beta: float = 0.0

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a positive finite number, got {self.temperature}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if not self.eps_high >= 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")

    @property
    def ratio_low(self) -> float:
        return 1.0 - self.eps_low

    @property
    def ratio_high(self) -> float:
        return 1.0 + self.eps_high


def row_temperatures(
    temperature: float | torch.Tensor, n: int, device: torch.device
) -> tuple[float, torch.Tensor | None]:
    """(scalar temperature for ``LossParams``, [N] per-row temperatures or None).

    A tensor must hold one positive, finite temperature per row, on the rows' device; the scalar
    returned beside it is 1.0 (rows are scaled by their own). Raises ValueError otherwise.
    """
    if not isinstance(temperature, torch.Tensor):
        return float(temperature), None
    if temperature.shape != (n,) or not temperature.is_floating_point():
        raise ValueError(f"temperature must be a number or a floating tensor of shape [{n}], got "
                         f"{temperature.dtype} {tuple(temperature.shape)}")
    if temperature.device != device:
        raise ValueError(f"temperature is on {temperature.device}, hidden on {device}")
    if n and not (bool((temperature > 0).all()) and bool(torch.isfinite(temperature).all())):
        raise ValueError("temperature must be positive and finite in every row")
    return 1.0, temperature


def check_inputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    token_weights: torch.Tensor,
    ref_logp: torch.Tensor | None,
    params: LossParams,
) -> None:
    """Raise ValueError on shapes, dtypes or devices that would otherwise fail deep inside a kernel."""
    if hidden.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    n, h = hidden.shape
    if weight.shape[1] != h:
        raise ValueError(f"hidden size mismatch: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or not hidden.is_floating_point():
        raise ValueError(f"hidden and weight must share one floating dtype, got {hidden.dtype} and {weight.dtype}")
    per_token = {"targets": targets, "old_logp": old_logp, "advantages": advantages, "token_weights": token_weights}
    if ref_logp is not None:
        per_token["ref_logp"] = ref_logp
    for name, t in per_token.items():
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape [{n}], got {tuple(t.shape)}")
        if t.device != hidden.device or weight.device != hidden.device:
            raise ValueError(f"all inputs must be on one device; {name} is on {t.device}, hidden on {hidden.device}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64 (or int32) token ids, got {targets.dtype}")
    # One host sync per call, worth it: an out-of-range id would make a Triton kernel read past the row.
    if n and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"targets must lie in [0, {weight.shape[0]})")
    if params.beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp for the KL penalty")
