"""Chunked GRPO loss: the gradient is formed tile by tile, never over the full [N × V] logits.

Rows are processed ``chunk_size`` at a time. For each chunk one GEMM gives its logits tile; a row
kernel (``rows_torch.torch_rows`` on CPU, ``triton_grpo.triton_rows`` on CUDA) turns the tile into
the per-token loss and overwrites it with dL/dlogits; two more GEMMs add the chunk's share of
grad_hidden and grad_weight. Only one tile, the per-token vectors and the gradients are ever live.

One pass or recompute?
    The gradients are computed during the forward (as Liger's fused-linear losses do) rather than by
    recomputing every tile's logits in the backward (as TRL's ChunkedLogProbFunction does). The loss
    is a scalar, so its backward only rescales the stored gradients by the incoming grad_output.
    Measured with ``scripts/bench_loss.py --methods naive,ours,ours-recompute --shapes main`` on the
    2-core CPU machine (fp32, N=1024 rows, H=896, V=151936, chunk_size=128, median of 3 interleaved
    rounds): one pass 7.95 s (7.86–8.62) and 600 MiB peak above the inputs; recompute 12.8 s
    (10.1–13.3) and 601 MiB; naive 10.3 s (9.3–10.7) and 1790 MiB. Both chunked variants hold the same
    tile and the same fp32 weight gradient, so memory is a draw; the recompute pays a fourth
    N·H·V GEMM (+33 % FLOPs) and more, hence the one-pass choice. Its price: grad_weight lives from
    the forward to the backward instead of only in the backward, and a forward that is never
    back-propagated would still pay for the gradient GEMMs, so ``grpo_loss_chunked`` only forms
    gradients when autograd will ask for them (grad mode on and the input requires grad).

Temperature is folded into the hidden rows (z = (h / T) · Wᵀ), which costs a [chunk × H] scale
instead of a pass over the [chunk × V] tile; by the chain rule grad_weight = Gᵀ · (h / T) reuses the
scaled rows and grad_hidden = (G · W) / T. T may differ per row (each token at the temperature that
sampled it): the scale is then a [chunk × 1] column, and the row kernels never see T at all.

Precision and the tensor cores. All three GEMMs run in the inputs' dtype: in bf16/fp16 that is the
tensor cores' format, and the GEMM sums its products in float32 inside (cuBLAS, oneDNN). The row
kernels work in float32 and hand dL/dz back in the tile's dtype (the same rounding the reference's
bf16 logits get), so no float32 copy of a [rows × V] tile ever feeds a GEMM. The weight gradient
sums over chunks in float32 (float64 for float64 inputs): on CUDA each chunk's GEMM writes into it
directly (``addmm`` with ``out_dtype=float32``), elsewhere the chunk's product is added to it. It is
cast to the inputs' dtype once at the end, so half-precision inputs do not round every chunk's sum.

Tile height. On a CPU, 128 rows (``DEFAULT_CHUNK_SIZE``: the measured optimum below). On a GPU the
tile is sized from a memory budget (``workspace_mib``, 512 MiB by default): the rows whose tile, with
the row kernel's float32 work copy where it makes one, fit in it. Per-chunk overhead (three GEMM
launches, two row kernels, a thin GEMM's poor tensor-core occupancy) is then paid a handful of times
per batch instead of once per 128 rows: at 8,192 tokens and V=151936 in bf16, 1,728-row tiles make
5 chunks where 128 rows made 64.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol

import torch

from .objective import LossParams, TokenTerms
from .rows_torch import torch_rows
from .spec import GRPOLossOutput, Tokens, check_inputs

if TYPE_CHECKING:
    from torch.autograd.function import FunctionCtx

# Rows per tile. At V=151936 a float32 tile is 74 MiB beside the 519 MiB fp32 weight gradient every path must
# hold: peak 600 MiB, 0.34x the naive path's. Taller tiles make the CPU GEMMs more efficient (interleaved runs,
# same machine and shape as above: 256 rows ~6 % faster at 676 MiB = 0.38x, 512 rows ~15 % faster at 826 MiB
# = 0.46x), so this is the tallest tile that keeps the peak near a third of the naive path's.
DEFAULT_CHUNK_SIZE = 128
# A GPU's tile budget: the logits tile (and a float32 work copy where the row kernel makes one). At V=151936 in
# bf16, 512 MiB is 1,728 rows (a multiple of TILE_ALIGN) beside the 519 MiB float32 weight gradient.
DEFAULT_WORKSPACE_MIB = 512
TILE_ALIGN = 64  # GPU tile heights are multiples of this: whole tensor-core tiles for the GEMMs' M dimension


def tile_rows(n_rows: int, vocab: int, dtype: torch.dtype, device: torch.device, *,
              workspace_mib: float = DEFAULT_WORKSPACE_MIB, float32_work: bool = False) -> int:
    """Rows per logits tile: ``DEFAULT_CHUNK_SIZE`` on a CPU; on other devices as many as fit in
    ``workspace_mib`` (whole multiples of ``TILE_ALIGN``, at least one multiple), counting
    ``float32_work``: the row kernel's float32 copy of a half-precision tile (the torch row kernel
    makes one; the Triton one works in the tile). Never more than ``n_rows`` (at least 1)."""
    if workspace_mib <= 0:
        raise ValueError(f"workspace_mib must be > 0, got {workspace_mib}")
    if device.type == "cpu":
        return max(1, min(DEFAULT_CHUNK_SIZE, n_rows))
    size = torch.empty(0, dtype=dtype).element_size()
    per_row = vocab * (size + (4 if float32_work and size < 4 else 0))
    rows = int(workspace_mib * 2**20) // max(per_row, 1) // TILE_ALIGN * TILE_ALIGN
    return max(1, min(max(rows, TILE_ALIGN), n_rows))


@functools.cache
def wide_output_gemm(device: torch.device) -> bool:
    """Whether ``torch.addmm(..., out_dtype=torch.float32)`` runs on half-precision inputs on this
    device, writing into its float32 input (CUDA builds of torch ≥ 2.8; a CPU build has no such
    kernel). Tried once per device on a 2×2 product, so an older torch falls back instead of failing."""
    if device.type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
        out = torch.ones(2, 2, device=device)
        torch.addmm(out, a, a, out_dtype=torch.float32, out=out)
        return bool((out == 3).all())
    except (RuntimeError, TypeError):
        return False


def mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool) -> None:
    """``out`` = a · b (``accumulate``: ``out`` += a · b), the GEMM in a's and b's dtype with the result
    kept in ``out``'s wider one: a half-precision GEMM on the tensor cores, never a float32 copy of a or b."""
    beta = 1 if accumulate else 0
    if a.dtype == out.dtype:
        out.addmm_(a, b, beta=beta)
    elif wide_output_gemm(out.device):
        torch.addmm(out, a, b, out_dtype=out.dtype, beta=beta, out=out)
    elif accumulate:
        out.add_(torch.mm(a, b))  # the product rounded once to a's dtype, then summed in out's
    else:
        out.copy_(torch.mm(a, b))


class RowKernel(Protocol):
    """Per-token loss of a logits tile and, when asked, dL/dlogits (usually written over the tile)."""

    def __call__(
        self,
        tile: torch.Tensor,  # [n, V] z = logits / temperature
        tokens: Tokens,  # [n] each: the tile's rows
        params: LossParams,
        with_grad: bool,
    ) -> tuple[TokenTerms, torch.Tensor | None]: ...


def chunk_pass(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    tokens: Tokens,  # [N] each
    params: LossParams,
    *,
    rows: RowKernel,
    chunk_size: int,
    grad_hidden: torch.Tensor | None = None,  # [N, H] float32/64, fully overwritten
    grad_weight: torch.Tensor | None = None,  # [V, H] float32/64, fully overwritten
) -> TokenTerms:
    """Per-token terms of all rows; fills grad_hidden / grad_weight with dL/dhidden, dL/dweight if given."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    acc = torch.promote_types(hidden.dtype, torch.float32)
    # 1/T as a float, or per row as an [N, 1] column in the accumulation dtype
    t = tokens.temperature
    inv_t: float | torch.Tensor = 1.0 / t.to(acc)[:, None] if isinstance(t, torch.Tensor) else 1.0 / float(t)
    with_grad = grad_hidden is not None or grad_weight is not None
    out = {name: torch.empty(n_rows, dtype=acc, device=hidden.device) for name in ("logp", "ratio", "loss", "slope")}
    clipped = torch.empty(n_rows, dtype=torch.bool, device=hidden.device)  # [N]
    kl = torch.empty(n_rows, dtype=acc, device=hidden.device) if tokens.ref_logp is not None else None  # [N]
    # Vocabulary-major tiles on CPU: MKL forms W · hᵀ ([V, n], packing the small operand) ~25 % faster than
    # h · Wᵀ ([n, V], which repacks all of W on every call); GPUs keep row-major tiles for coalesced row reads.
    vocab_major = hidden.device.type == "cpu"
    tile_storage = hidden.new_empty(min(chunk_size, n_rows) * vocab)  # one [C × V] tile, reused by every chunk
    if grad_weight is not None and n_rows == 0:
        grad_weight.zero_()

    for start in range(0, n_rows, chunk_size):
        rows_ = slice(start, min(start + chunk_size, n_rows))
        inv_t_rows = inv_t[rows_] if isinstance(inv_t, torch.Tensor) else inv_t  # [n, 1] or a float
        h_scaled = (hidden[rows_] * inv_t_rows).to(hidden.dtype)  # [n, H], rounded once like the scalar scale
        n = h_scaled.shape[0]
        if vocab_major:
            tile = torch.mm(weight, h_scaled.t(), out=tile_storage[: n * vocab].view(vocab, n)).t()  # [n, V]
        else:
            tile = torch.mm(h_scaled, weight.t(), out=tile_storage[: n * vocab].view(n, vocab))  # [n, V]
        terms, grad = rows(tile, tokens.rows(rows_), params, with_grad)
        if grad is not None and grad.dtype != tile.dtype:  # a float32 work tile: back to the GEMMs' dtype,
            grad = tile.copy_(grad)  # written over the logits tile it came from, not into a new buffer
        out["logp"][rows_] = terms.logp
        out["ratio"][rows_] = terms.ratio
        out["loss"][rows_] = terms.loss
        out["slope"][rows_] = terms.dloss_dlogp
        clipped[rows_] = terms.clipped
        if kl is not None and terms.kl is not None:
            kl[rows_] = terms.kl
        if grad is None:
            continue
        if grad_hidden is not None:  # dL/dh = (dL/dz · W) / T   [n, H]
            if vocab_major:  # formed as (Wᵀ · dL/dzᵀ)ᵀ: MKL runs that orientation ~15 % faster
                torch.mul(torch.mm(weight.t(), grad.t()).t(), inv_t_rows, out=grad_hidden[rows_])
            else:
                mm_into(grad_hidden[rows_], grad, weight, accumulate=False)
                grad_hidden[rows_] *= inv_t_rows
        if grad_weight is not None:
            # dL/dW += (dL/dz)ᵀ · (h / T)   [V, H]; the first chunk overwrites, so no zero-fill pass
            mm_into(grad_weight, grad.t(), h_scaled, accumulate=start > 0)
    return TokenTerms(out["logp"], out["ratio"], clipped, kl, out["loss"], out["slope"])


class _ChunkedGRPOLoss(torch.autograd.Function):
    """Autograd node whose forward already holds the gradients; backward only scales them."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        hidden: torch.Tensor,  # [N, H]
        weight: torch.Tensor,  # [V, H]
        tokens: Tokens,  # [N] each; not differentiated
        params: LossParams,
        rows: RowKernel,
        chunk_size: int,
        want_grad_hidden: bool,
        want_grad_weight: bool,
    ) -> tuple[torch.Tensor, ...]:
        acc = torch.promote_types(hidden.dtype, torch.float32)
        grad_hidden = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if want_grad_hidden else None
        grad_weight = torch.empty(weight.shape, dtype=acc, device=weight.device) if want_grad_weight else None
        terms = chunk_pass(
            hidden, weight, tokens, params, rows=rows, chunk_size=chunk_size, grad_hidden=grad_hidden,
            grad_weight=grad_weight,
        )  # fmt: skip
        loss = (tokens.token_weights.to(acc) * terms.loss).sum()  # []
        # Cast once, then drop the float32 copy before anything else is allocated.
        grad_hidden = grad_hidden.to(hidden.dtype) if grad_hidden is not None else None
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        # save_for_backward (not ctx attributes): autograd releases saved tensors right after backward,
        # so AccumulateGrad can adopt grad_weight as .grad instead of cloning 0.5 GiB.
        ctx.save_for_backward(grad_hidden, grad_weight)
        kl = terms.kl if terms.kl is not None else terms.logp.new_empty(0)
        ctx.mark_non_differentiable(terms.logp, terms.ratio, terms.clipped, kl)
        return loss, terms.logp, terms.ratio, terms.clipped, kl

    @staticmethod
    def backward(ctx: FunctionCtx, grad_loss: torch.Tensor, *_unused: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        # The common case (loss.backward()) passes exactly 1: skip a full-size multiply of grad_weight.
        if float(grad_loss) != 1.0:
            grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
            grad_weight = grad_weight * grad_loss.to(grad_weight.dtype) if grad_weight is not None else None
        return (grad_hidden, grad_weight) + (None,) * 6


def grpo_loss_chunked(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    tokens: Tokens,  # [N] each
    params: LossParams,
    *,
    chunk_size: int | None = None,
    workspace_mib: float = DEFAULT_WORKSPACE_MIB,
    rows: RowKernel = torch_rows,
) -> GRPOLossOutput:
    """The GRPO loss over ``chunk_size``-row tiles (None: ``tile_rows`` for this device, sized on a GPU
    from ``workspace_mib``); gradients only when autograd will ask for them."""
    check_inputs(hidden, weight, tokens, params)
    if chunk_size is None:
        chunk_size = tile_rows(hidden.shape[0], weight.shape[0], hidden.dtype, hidden.device,
                               workspace_mib=workspace_mib, float32_work=rows is torch_rows)
    grad_enabled = torch.is_grad_enabled()
    loss, logp, ratio, clipped, kl = _ChunkedGRPOLoss.apply(
        hidden, weight, tokens, params, rows, chunk_size,
        grad_enabled and hidden.requires_grad, grad_enabled and weight.requires_grad,
    )  # fmt: skip
    return GRPOLossOutput(loss, logp, ratio, clipped, kl if tokens.ref_logp is not None else None)
