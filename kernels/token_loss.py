"""Per-token GRPO terms from log-probabilities, with the derivative written out by hand.

The chunked path never builds an autograd graph over the logits, so it needs dℓ/dlogp explicitly;
chain-ruled through log-softmax it becomes dℓ/dlogits. Kept apart from the reference (which relies
on autograd) so that the tests compare two independent derivations. The Triton kernel in
``triton_grpo`` implements the same formulas; the tests hold the two together.

Derivative, with r = exp(logp − old_logp) so dr/dlogp = r:
- ℓ_clip = max(−r·A, −clip(r, 1−ε_low, 1+ε_high)·A) equals −r·A (slope −r·A) except where the clip is
  active — A > 0 and r > 1+ε_high, or A < 0 and r < 1−ε_low — where it is constant (slope 0);
- the dual clip, for A < 0, replaces ℓ_clip by the constant −c·A where ℓ_clip exceeds it;
- k3 = exp(ref − logp) − (ref − logp) − 1 has slope 1 − exp(ref − logp).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .spec import LossParams


class TokenTerms(NamedTuple):
    """Per-token quantities of one block of rows; all [n] and detached."""

    logp: torch.Tensor  # [n]
    ratio: torch.Tensor  # [n]
    clipped: torch.Tensor  # [n] bool
    kl: torch.Tensor | None  # [n]
    loss: torch.Tensor  # [n] ℓ_i, before token weighting
    dloss_dlogp: torch.Tensor  # [n] dℓ_i / dlogp_i


def token_terms(
    logp: torch.Tensor,  # [n]
    old_logp: torch.Tensor,  # [n]
    advantages: torch.Tensor,  # [n]
    ref_logp: torch.Tensor | None,  # [n]
    params: LossParams,
) -> TokenTerms:
    """ℓ and dℓ/dlogp per token, in logp's dtype."""
    adv = advantages.to(logp.dtype)  # [n]
    ratio = torch.exp(logp - old_logp.to(logp.dtype))  # [n]
    pg = -ratio * adv  # [n] the unclipped surrogate; also its slope in logp
    loss = torch.maximum(pg, -ratio.clamp(params.ratio_low, params.ratio_high) * adv)  # [n]
    clipped = ((adv > 0) & (ratio > params.ratio_high)) | ((adv < 0) & (ratio < params.ratio_low))  # [n]
    if params.dual_clip is not None:
        cap = -params.dual_clip * adv  # [n]
        dual_active = (adv < 0) & (loss > cap)  # [n]
        loss = torch.where(dual_active, cap, loss)
        clipped = clipped | dual_active
    slope = torch.where(clipped, torch.zeros_like(pg), pg)  # [n]
    kl = None
    if ref_logp is not None:
        log_ref_ratio = ref_logp.to(logp.dtype) - logp  # [n]
        ref_ratio = torch.exp(log_ref_ratio)  # [n]
        kl = ref_ratio - log_ref_ratio - 1
        if params.beta:
            loss = loss + params.beta * kl
            slope = slope + params.beta * (1 - ref_ratio)
    return TokenTerms(logp, ratio, clipped, kl, loss, slope)
