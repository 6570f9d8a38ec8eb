"""The GRPO loss written the obvious way: full logits, log_softmax, gather, clipped objective.

It materialises the [N, V] logits (and autograd keeps a log-softmax of the same size for the
backward), so it is the memory baseline the chunked paths are measured against. Its gradients come
from autograd rather than from a hand-derived formula, which is what makes it the ground truth: run
in float64 it checks the analytic dℓ/dlogits of the other paths.
"""

from __future__ import annotations

import torch

from .spec import GRPOLossOutput, LossParams, check_inputs, row_temperatures


def grpo_loss_reference(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    targets: torch.Tensor,  # [N] int64
    old_logp: torch.Tensor,  # [N]
    advantages: torch.Tensor,  # [N]
    token_weights: torch.Tensor,  # [N]
    *,
    ref_logp: torch.Tensor | None = None,  # [N]
    beta: float = 0.0,
    temperature: float | torch.Tensor = 1.0,  # one T, or [N]: each row's own
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> GRPOLossOutput:
    """Σ_i token_weights_i · ℓ_i with ℓ = clipped surrogate (+ dual clip) + beta · k3 KL.

    Works in the inputs' dtype for the matmul and in at least float32 for everything after it (in
    float64 when the inputs are float64).
    """
    scalar_t, per_row = row_temperatures(temperature, hidden.shape[0], hidden.device)
    params = LossParams(scalar_t, eps_low, eps_high, dual_clip, beta)
    check_inputs(hidden, weight, targets, old_logp, advantages, token_weights, ref_logp, params)
    acc = torch.promote_types(hidden.dtype, torch.float32)

    t = per_row.to(acc).unsqueeze(-1) if per_row is not None else params.temperature  # [N, 1] or a float
    logits = (hidden @ weight.T).to(acc) / t  # [N, V]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # [N]
    adv = advantages.to(acc)  # [N]
    ratio = torch.exp(logp - old_logp.to(acc))  # [N]
    surrogate = torch.maximum(-ratio * adv, -torch.clamp(ratio, params.ratio_low, params.ratio_high) * adv)  # [N]
    clipped = ((adv > 0) & (ratio > params.ratio_high)) | ((adv < 0) & (ratio < params.ratio_low))  # [N]
    if dual_clip is not None:
        cap = -dual_clip * adv  # [N]
        dual_active = (adv < 0) & (surrogate > cap)  # [N]
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, cap), surrogate)
        clipped = clipped | dual_active
    per_token = surrogate  # [N]
    kl = None
    if ref_logp is not None:
        log_ref_ratio = ref_logp.to(acc) - logp  # [N]
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1  # [N]
        per_token = per_token + beta * kl
    loss = (token_weights.to(acc) * per_token).sum()
    return GRPOLossOutput(
        loss=loss,
        logp=logp.detach(),
        ratio=ratio.detach(),
        clipped=clipped,
        kl=kl.detach() if kl is not None else None,
    )
