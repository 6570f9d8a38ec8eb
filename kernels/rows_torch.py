"""Row kernel in plain torch: per-token loss and dL/dlogits for one tile of logits, in place.

This is the chunked path's per-row work on devices without Triton (the CPU default). It overwrites
the tile instead of allocating beside it: exp(z − max) is computed in place, summed for the
log-normaliser, then rescaled into the gradient. Each tile is therefore walked five times (max, sub,
exp, sum, scale) and no second [rows × V] buffer is ever live, which is what keeps the chunked
path's peak at one tile plus the weight gradient. ℓ and dℓ/dlogp per token are
``objective.token_loss``'s; this module adds only the log-normaliser and the chain rule through it.
"""

from __future__ import annotations

import torch

from .objective import LossParams, TokenTerms, token_loss
from .spec import Tokens


def torch_rows(
    tile: torch.Tensor,  # [n, V] z = logits / temperature; overwritten when with_grad
    tokens: Tokens,  # [n] each: the tile's rows
    params: LossParams,
    with_grad: bool,
) -> tuple[TokenTerms, torch.Tensor | None]:
    """Token terms of the tile's rows and, when with_grad, dL/dz = w·dℓ/dlogp·(onehot − softmax(z)).

    The gradient is returned in at least float32: a half-precision tile is upcast to a float32 work
    tile (the gradient is then also rounded once fewer times before the weight-gradient GEMM).
    """
    acc = torch.promote_types(tile.dtype, torch.float32)
    work = tile if tile.dtype == acc else tile.to(acc)  # [n, V]
    index = tokens.targets.long().unsqueeze(1)  # [n, 1]
    target_z = work.gather(1, index).squeeze(1)  # [n]
    row_max = work.amax(dim=1)  # [n]
    exp_shifted = work.sub_(row_max.unsqueeze(1)).exp_()  # [n, V] exp(z − max), in place
    sum_exp = exp_shifted.sum(dim=1)  # [n]
    logp = target_z - row_max - sum_exp.log()  # [n]
    terms = token_loss(logp, tokens.old_logp, tokens.advantages, tokens.ref_logp, params)
    if not with_grad:
        return terms, None
    dlogp = tokens.token_weights.to(acc) * terms.dloss_dlogp  # [n] dL/dlogp
    grad = exp_shifted.mul_((-dlogp / sum_exp).unsqueeze(1))  # [n, V] −dL/dlogp · softmax
    grad.scatter_add_(1, index, dlogp.unsqueeze(1))  # + dL/dlogp at the target
    return terms, grad
