"""The GRPO objective, written once: each piece a pure torch function, chosen in one literal table.

Why one module: the reference path (full logits, autograd), the chunked torch path and the Triton
kernel all compute the same per-token loss ℓ. The torch paths both call ``token_loss`` here — the
reference differentiates its value with autograd, the chunked path uses the derivative written out
beside each value (it never builds a graph over the logits) — so the tests, which hold every path
to the float64 reference, compare the hand-written dℓ/dlogp with autograd's. The Triton kernel
keeps the same formulas in registers (``triton_grpo``) and is held to the same reference.

Why the chunked path does not take dℓ/dlogp from autograd on its [n] vectors too: where
r = exp(logp − old_logp) overflows and a clip holds the token, the chain rule gives 0 · inf = nan,
which would poison the whole step's gradient; the written-out slope is exactly 0 there.

``VARIANTS`` selects the pieces (as verl's ``core_algos.py`` does: plain functions over tensors, a
plain dict from name to function):

- "clip" (r = exp(logp − old_logp), A the advantage; an old_logp of nan marks a token the harness
  forced rather than any policy sampled, rated against the current policy: r = 1, gradient −A·∇logp): "ppo"
  max(−r·A, −clip(r, 1−ε_low, 1+ε_high)·A)
  (ε_high > ε_low is DAPO's clip-higher); "dual" also caps it at −c·A for A < 0 (dual-clip PPO, chosen
  by ``LossParams.dual_clip = c``). Where a clip is active the token has no gradient.
- "kl", an estimate of KL(π ‖ π_ref) per token from the log-ratio x = logp − ref_logp (Schulman's
  estimators; as penalties their gradients, on samples from π, estimate different things):
  "k3" exp(−x) + x − 1 (the default; ≥ 0 and low-variance as a value; its gradient is that of
  KL(π_ref ‖ π)), "k2" x²/2 (its gradient is that of KL(π ‖ π_ref)), "k1" x (unbiased as a value;
  its gradient ∇logp has zero mean).
- "aggregation", the weight of each token in the step's scalar loss (``token_weights``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class LossParams:
    """Hyper-parameters of the per-token objective, validated once at construction.

    ``dual_clip`` is the constant c > 1 of dual-clip PPO (None: off); ``beta`` weighs the KL
    estimate named by ``kl_estimator`` into ℓ (with beta = 0 the KL is only reported).
    """

    # the objective's usual settings (PPO's clip below, DAPO's clip-higher above, no dual clip, no KL
    # in the loss); trainer.* starts from the same ones (a test holds them equal)
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if not self.eps_high >= 0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        pick("kl", self.kl_estimator)

    @property
    def clip(self) -> str:
        """The "clip" entry of VARIANTS these settings select."""
        return "ppo" if self.dual_clip is None else "dual"

    @property
    def ratio_low(self) -> float:
        return 1.0 - self.eps_low

    @property
    def ratio_high(self) -> float:
        return 1.0 + self.eps_high


class TokenTerms(NamedTuple):
    """Per-token quantities of a block of rows, all [n]."""

    logp: torch.Tensor  # [n] log π(target) at the token's temperature
    ratio: torch.Tensor  # [n] exp(logp − old_logp)
    clipped: torch.Tensor  # [n] bool: a clip (ratio or dual) was active, so the surrogate had no gradient
    kl: torch.Tensor | None  # [n] the KL estimate; None without ref_logp
    loss: torch.Tensor  # [n] ℓ, before token weighting
    dloss_dlogp: torch.Tensor  # [n] dℓ/dlogp, written out (the chunked path needs it without autograd)


# ------------------------------------------------- clipping: (ratio, A, params) -> (ℓ, dℓ/dlogp, clipped)
def clip_ppo(ratio: torch.Tensor, adv: torch.Tensor, params: LossParams) -> tuple[torch.Tensor, ...]:
    """PPO's clipped surrogate. It equals −r·A (slope −r·A, as dr/dlogp = r) except where the clip is
    active — A > 0 and r > 1+ε_high, or A < 0 and r < 1−ε_low — where it is constant (slope 0)."""
    pg = -ratio * adv  # [n] the unclipped surrogate; also its slope in logp
    loss = torch.maximum(pg, -ratio.clamp(params.ratio_low, params.ratio_high) * adv)  # [n]
    clipped = ((adv > 0) & (ratio > params.ratio_high)) | ((adv < 0) & (ratio < params.ratio_low))  # [n]
    return loss, torch.where(clipped, torch.zeros_like(pg), pg), clipped


def clip_dual(ratio: torch.Tensor, adv: torch.Tensor, params: LossParams) -> tuple[torch.Tensor, ...]:
    """PPO's clip, then for A < 0 capped at the constant −c·A, so that a token whose ratio has exploded
    cannot push the policy arbitrarily far (slope 0 where the cap is active)."""
    loss, slope, clipped = clip_ppo(ratio, adv, params)
    cap = -params.dual_clip * adv  # type: ignore[operator]  # [n]; selected only when dual_clip is set
    dual_active = (adv < 0) & (loss > cap)  # [n]
    loss = torch.where(dual_active, cap, loss)
    slope = torch.where(dual_active, torch.zeros_like(slope), slope)
    return loss, slope, clipped | dual_active


# ------------------------------------------------- KL estimators: (logp, ref_logp) -> (kl, dkl/dlogp)
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = logp − ref_logp, slope 1."""
    return logp - ref_logp, torch.ones_like(logp)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x²/2, slope x."""
    log_ratio = logp - ref_logp  # [n]
    return 0.5 * log_ratio * log_ratio, log_ratio


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(ref − logp) − (ref − logp) − 1, slope 1 − exp(ref − logp)."""
    log_ref_ratio = ref_logp - logp  # [n]
    ref_ratio = torch.exp(log_ref_ratio)  # [n]
    return ref_ratio - log_ref_ratio - 1, 1 - ref_ratio


# ------------------------------------------------- aggregation: (lengths [S], step) -> per-token weight of each [S]
class StepTotals(NamedTuple):
    """What an aggregation normalises by: totals over the whole optimizer step (every micro-batch on
    every process), so the step loss does not depend on how the step is split."""

    tokens: float  # trainable tokens in the step
    sequences: float  # non-empty sequences in the step
    horizon: float | None  # Dr. GRPO's constant: the completion budget in tokens


def token_mean(lengths: torch.Tensor, step: StepTotals) -> torch.Tensor:
    """DAPO's token-level loss: every token of the step weighs 1/(tokens in the step); long
    completions count more."""
    return torch.full_like(lengths, 1.0 / max(step.tokens, 1.0))


def sequence_mean(lengths: torch.Tensor, step: StepTotals) -> torch.Tensor:
    """GRPO's original mean of per-sequence token means: each model call weighs the same, so a token
    of a long completion counts less (the length bias Dr. GRPO removes)."""
    return 1.0 / (max(step.sequences, 1.0) * lengths.clamp(min=1))


def dr_grpo(lengths: torch.Tensor, step: StepTotals) -> torch.Tensor:
    """Dr. GRPO: each sequence's token sum over the step's sequences, normalised by a constant horizon
    instead of the sequence's own length, so no sequence's tokens weigh more for being short."""
    if step.horizon is None or not step.horizon >= 1:
        raise ValueError(f"aggregation dr_grpo needs a horizon >= 1 (the completion budget), got {step.horizon}")
    return torch.full_like(lengths, 1.0 / (max(step.sequences, 1.0) * step.horizon))


# ------------------------------------------------- the one table
VARIANTS: dict[str, dict[str, Callable[..., Any]]] = {
    "clip": {"ppo": clip_ppo, "dual": clip_dual},
    "kl": {"k3": kl_k3, "k2": kl_k2, "k1": kl_k1},
    "aggregation": {"token_mean": token_mean, "sequence_mean": sequence_mean, "dr_grpo": dr_grpo},
}
AGGREGATIONS = tuple(VARIANTS["aggregation"])
KL_ESTIMATORS = tuple(VARIANTS["kl"])


def pick(kind: str, name: str) -> Callable[..., Any]:
    """VARIANTS[kind][name], or a ValueError naming the choices."""
    table = VARIANTS[kind]
    if name not in table:
        raise ValueError(f"{kind} must be one of {list(table)}, got {name!r}")
    return table[name]


def token_loss(
    logp: torch.Tensor,  # [n] may require grad (the reference path differentiates the value)
    old_logp: torch.Tensor,  # [n] behaviour log-probs
    advantages: torch.Tensor,  # [n]
    ref_logp: torch.Tensor | None,  # [n] reference-model log-probs, for the KL
    params: LossParams,
) -> TokenTerms:
    """ℓ = surrogate of the selected clip + beta · the selected KL estimate, and dℓ/dlogp, in logp's dtype."""
    adv = advantages.to(logp.dtype)  # [n]
    old = old_logp.to(logp.dtype)  # [n]; nan: a token no policy sampled, rated against the current one
    ratio = torch.exp(logp - torch.where(torch.isnan(old), logp.detach(), old))  # [n]
    loss, slope, clipped = VARIANTS["clip"][params.clip](ratio, adv, params)  # [n] each
    kl = None
    if ref_logp is not None:
        kl, kl_slope = VARIANTS["kl"][params.kl_estimator](logp, ref_logp.to(logp.dtype))  # [n] each
        if params.beta:
            loss = loss + params.beta * kl
            slope = slope + params.beta * kl_slope
    return TokenTerms(logp, ratio, clipped, kl, loss, slope)


def token_weights(
    seq_lengths: Sequence[int],
    mode: str,
    *,
    step_tokens: int | None = None,
    step_sequences: int | None = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """Per-token weights [sum(seq_lengths)] for sequences of the given (trainable) lengths.

    The loss kernels take aggregation as these weights (Σ_i w_i ℓ_i), so one kernel serves every
    mode and micro-batching cannot change the loss. ``step_tokens`` / ``step_sequences`` are the
    totals over the whole optimizer step; they default to this call's own (a step seen whole).
    ``horizon`` is dr_grpo's constant normaliser.
    """
    aggregate = pick("aggregation", mode)
    lengths = torch.as_tensor(list(seq_lengths), dtype=torch.float32)  # [S]
    if (lengths < 0).any():
        raise ValueError("sequence lengths must be >= 0")
    step = StepTotals(
        tokens=float(step_tokens if step_tokens is not None else lengths.sum()),
        sequences=float(step_sequences if step_sequences is not None else (lengths > 0).sum()),
        horizon=float(horizon) if horizon is not None else None,
    )
    return torch.repeat_interleave(aggregate(lengths, step), lengths.long())  # [N]
