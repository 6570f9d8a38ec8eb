"""The GRPO loss written the obvious way: full logits, log_softmax, gather, ``objective.token_loss``.

It materialises the [N, V] logits (and autograd keeps a log-softmax of the same size for the
backward), so it is the memory baseline the chunked paths are measured against. Its gradients come
from autograd through the value of ``token_loss`` — never from the derivative written out beside it
— which is what makes it the ground truth: run in float64 it checks the analytic dℓ/dlogits of the
other paths.
"""

from __future__ import annotations

import torch

from .objective import LossParams, token_loss
from .spec import GRPOLossOutput, Tokens, check_inputs


def grpo_loss_reference(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    tokens: Tokens,  # [N] each
    params: LossParams,
) -> GRPOLossOutput:
    """Σ_i token_weights_i · ℓ_i over full logits, differentiable by autograd.

    Works in the inputs' dtype for the matmul and in at least float32 for everything after it (in
    float64 when the inputs are float64).
    """
    check_inputs(hidden, weight, tokens, params)
    acc = torch.promote_types(hidden.dtype, torch.float32)
    t = tokens.temperature
    t = t.to(acc).unsqueeze(-1) if isinstance(t, torch.Tensor) else float(t)  # [N, 1] or a float
    logits = (hidden @ weight.T).to(acc) / t  # [N, V]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens.targets.long().unsqueeze(-1)).squeeze(-1)  # [N]
    terms = token_loss(logp, tokens.old_logp, tokens.advantages, tokens.ref_logp, params)
    loss = (tokens.token_weights.to(acc) * terms.loss).sum()  # []
    return GRPOLossOutput(
        loss=loss,
        logp=logp.detach(),
        ratio=terms.ratio.detach(),
        clipped=terms.clipped,
        kl=terms.kl.detach() if terms.kl is not None else None,
    )
