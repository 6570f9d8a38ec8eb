"""Triton row kernels for the chunked GRPO loss (CUDA; CPU tensors under TRITON_INTERPRET=1).

The chunked path (``chunked.py``) keeps its structure — the three GEMMs per tile stay in torch, where
cuBLAS is hard to beat — and only swaps its row kernel. On a GPU the torch row kernel's five passes
over each [rows × V] tile are five launches and five round trips through HBM; here they are two:

- ``_forward_kernel``: one program per row streams the row in BLOCK-wide slices with an online
  max / sum-exp (so any V fits in registers), then gathers the target logit and computes, in
  registers, logp, the ratio, the clip and dual clip, the KL estimate, ℓ and dℓ/dlogp;
- ``_grad_kernel``: one program per (row, BLOCK slice) overwrites the tile with
  dL/dz = w·dℓ/dlogp·(onehot − exp(z − lse)), in the tile's dtype (Liger-style: no second buffer).

The per-token formulas are a register-level copy of ``objective.token_loss`` — the one torch
definition, where each value's derivative is written beside it — for the variants this kernel knows
(``CLIPS``, ``KL_CODES``; any other raises). The tests hold this kernel to the float64 reference,
which differentiates that definition with autograd. Triton is optional: without it this module
still imports, ``TRITON_AVAILABLE`` is False and ``triton_rows`` raises.
"""

from __future__ import annotations

import os

import torch

from .chunked import DEFAULT_WORKSPACE_MIB, grpo_loss_chunked
from .objective import LossParams, TokenTerms
from .spec import GRPOLossOutput, Tokens

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch row kernel serves instead
    triton = None
    tl = None

TRITON_AVAILABLE = triton is not None
# triton.jit picks compiled or interpreted kernels when this module is imported, so the variable is read once,
# here, with the values triton accepts, rather than at call time.
INTERPRETED = TRITON_AVAILABLE and os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")

# Widest slice a program holds at once: 4096 fp32 values fill 32 registers per thread at 4 warps, and
# V=151936 then takes 38 steps of the online max / sum-exp.
MAX_BLOCK = 4096
# The VARIANTS entries the forward kernel implements: clip names, and KL estimators by their constexpr code.
CLIPS = ("ppo", "dual")
KL_CODES = {"k1": 1, "k2": 2, "k3": 3}


def triton_usable(device: torch.device) -> bool:
    """Whether the kernels can run on tensors of this device: CUDA, or anything under the interpreter."""
    if not TRITON_AVAILABLE:
        return False
    return INTERPRETED or device.type == "cuda"


if TRITON_AVAILABLE:

    @triton.jit
    def _forward_kernel(
        tile_ptr,
        row_stride,
        col_stride,
        targets_ptr,
        old_logp_ptr,
        advantages_ptr,
        ref_logp_ptr,
        lse_ptr,
        logp_ptr,
        ratio_ptr,
        clipped_ptr,
        kl_ptr,
        loss_ptr,
        slope_ptr,
        n_cols,
        ratio_low,
        ratio_high,
        dual_clip,
        beta,
        HAS_DUAL_CLIP: tl.constexpr,
        HAS_REF: tl.constexpr,
        HAS_KL_LOSS: tl.constexpr,
        KL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        row_ptr = tile_ptr + row * row_stride
        running_max = float("-inf")
        sum_exp = 0.0
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(row_ptr + cols * col_stride, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(z, axis=0))
            sum_exp = sum_exp * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), axis=0)
            running_max = new_max
        lse = running_max + tl.log(sum_exp)

        logp = tl.load(row_ptr + tl.load(targets_ptr + row) * col_stride).to(tl.float32) - lse
        adv = tl.load(advantages_ptr + row).to(tl.float32)
        old = tl.load(old_logp_ptr + row).to(tl.float32)
        ratio = tl.exp(logp - tl.where(old != old, logp, old))  # nan: forced, rated against the current policy
        pg = -ratio * adv  # unclipped surrogate, and its slope in logp
        loss = tl.maximum(pg, -tl.minimum(tl.maximum(ratio, ratio_low), ratio_high) * adv)
        clipped = ((adv > 0) & (ratio > ratio_high)) | ((adv < 0) & (ratio < ratio_low))
        if HAS_DUAL_CLIP:
            cap = -dual_clip * adv
            dual_active = (adv < 0) & (loss > cap)
            loss = tl.where(dual_active, cap, loss)
            clipped = clipped | dual_active
        slope = tl.where(clipped, 0.0, pg)
        if HAS_REF:
            log_ref_ratio = tl.load(ref_logp_ptr + row).to(tl.float32) - logp
            if KL == 3:
                ref_ratio = tl.exp(log_ref_ratio)
                kl = ref_ratio - log_ref_ratio - 1.0
                kl_slope = 1.0 - ref_ratio
            elif KL == 2:
                kl = 0.5 * log_ref_ratio * log_ref_ratio
                kl_slope = -log_ref_ratio
            else:
                kl = -log_ref_ratio
                kl_slope = 1.0
            tl.store(kl_ptr + row, kl)
            if HAS_KL_LOSS:
                loss += beta * kl
                slope += beta * kl_slope
        tl.store(lse_ptr + row, lse)
        tl.store(logp_ptr + row, logp)
        tl.store(ratio_ptr + row, ratio)
        tl.store(clipped_ptr + row, clipped.to(tl.int8))
        tl.store(loss_ptr + row, loss)
        tl.store(slope_ptr + row, slope)

    @triton.jit
    def _grad_kernel(
        tile_ptr,
        row_stride,
        col_stride,
        targets_ptr,
        lse_ptr,
        dlogp_ptr,
        n_cols,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        ptrs = tile_ptr + row * row_stride + cols * col_stride
        z = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        softmax = tl.exp(z - tl.load(lse_ptr + row))
        is_target = (cols == tl.load(targets_ptr + row)).to(tl.float32)
        grad = tl.load(dlogp_ptr + row) * (is_target - softmax)
        tl.store(ptrs, grad.to(tile_ptr.dtype.element_ty), mask=mask)


def triton_rows(
    tile: torch.Tensor,  # [n, V] z = logits / temperature; overwritten with dL/dz when with_grad
    tokens: Tokens,  # [n] each: the tile's rows
    params: LossParams,
    with_grad: bool,
) -> tuple[TokenTerms, torch.Tensor | None]:
    """Row kernel of the chunked path, in Triton; token terms are float32 whatever the tile dtype.

    Any tile strides work (the CPU tiles under the interpreter are vocabulary-major); on CUDA the
    vocabulary stride is 1, which Triton specialises on, so the loads stay contiguous.
    """
    if not triton_usable(tile.device):
        raise RuntimeError("Triton row kernels need triton and a CUDA device (or TRITON_INTERPRET=1)")
    if params.clip not in CLIPS or params.kl_estimator not in KL_CODES:
        raise NotImplementedError(f"the Triton kernel has no clip {params.clip!r} or KL {params.kl_estimator!r}; "
                                  "use impl='chunked'")
    targets, ref_logp = tokens.targets, tokens.ref_logp
    n, vocab = tile.shape
    block = min(MAX_BLOCK, triton.next_power_of_2(max(vocab, 1)))
    f32 = {"dtype": torch.float32, "device": tile.device}
    lse, logp, ratio, loss, slope = (torch.empty(n, **f32) for _ in range(5))  # [n] each
    kl = torch.empty(n, **f32) if ref_logp is not None else None  # [n]
    clipped = torch.empty(n, dtype=torch.int8, device=tile.device)  # [n]
    targets = targets.contiguous()
    if n:
        _forward_kernel[(n,)](
            tile, tile.stride(0), tile.stride(1), targets, tokens.old_logp.contiguous(),
            tokens.advantages.contiguous(), ref_logp.contiguous() if ref_logp is not None else tokens.old_logp,
            lse, logp, ratio, clipped, kl if kl is not None else lse, loss, slope,
            vocab, params.ratio_low, params.ratio_high, params.dual_clip or 0.0, params.beta,
            HAS_DUAL_CLIP=params.clip == "dual", HAS_REF=ref_logp is not None,
            HAS_KL_LOSS=ref_logp is not None and params.beta > 0, KL=KL_CODES[params.kl_estimator], BLOCK=block,
        )  # fmt: skip
    terms = TokenTerms(logp, ratio, clipped.bool(), kl, loss, slope)
    if not with_grad:
        return terms, None
    dlogp = (tokens.token_weights.float() * slope).contiguous()  # [n] dL/dlogp
    if n:
        _grad_kernel[(n, triton.cdiv(vocab, block))](
            tile, tile.stride(0), tile.stride(1), targets, lse, dlogp, vocab, BLOCK=block
        )
    return terms, tile


def grpo_loss_triton(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    tokens: Tokens,  # [N] each (the chunked pass applies the temperature)
    params: LossParams,
    *,
    chunk_size: int | None = None,
    workspace_mib: float = DEFAULT_WORKSPACE_MIB,
) -> GRPOLossOutput:
    """The chunked GRPO loss with the Triton row kernels (see the module docstring)."""
    if not TRITON_AVAILABLE:
        raise RuntimeError("impl='triton' needs triton, which is not installed: pip install triton (PyPI's CUDA "
                           "torch wheels for Linux bring it), or use impl='chunked' (trainer.kernel=chunked)")
    if not triton_usable(hidden.device):
        raise RuntimeError(
            f"impl='triton' needs CUDA tensors (got {hidden.device}); set TRITON_INTERPRET=1 before importing "
            "coevo.kernels to run on CPU, or use impl='chunked'"
        )
    return grpo_loss_chunked(hidden, weight, tokens, params, chunk_size=chunk_size, workspace_mib=workspace_mib,
                             rows=triton_rows)
