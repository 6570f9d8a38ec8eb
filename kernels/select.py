"""Which loss path ``impl="auto"`` runs: the fastest that fits, measured once per shape class.

On a CPU there is nothing to choose: the chunked torch path runs at or below the full-logits path's
time at about a third of its memory (docs/PERF.md, ``scripts/bench_loss.py --shapes main``).

On a GPU the answer depends on the shape and the card. The full-logits reference is one large GEMM
and a fused log-softmax: where its [N × V] logits fit and N is small, per-chunk launches can make a
fused path slower; at training batch sizes the fused paths read and write far fewer bytes. A rule
fitted to one card would be wrong on the next, so ``auto`` times the candidates that fit, once per
shape class (device, dtype, V, H, and N rounded up to a power of two), forward and backward on
random inputs of that class, and keeps the fastest for the life of the process; ``choices()`` lists
what it picked and the times it measured. The fused path (Triton where installed, else chunked
torch) comes first and wins ties. A candidate fits when its estimated peak leaves a quarter of the
device's free memory (the caching allocator's spare blocks included) unused; the fused paths'
peak is one bounded tile plus the gradients, the reference's the logits in their dtype plus three
float32 tensors of that size (their copy, the log-softmax, its gradient).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from .chunked import grpo_loss_chunked
from .objective import LossParams
from .reference import grpo_loss_reference
from .spec import Tokens
from .triton_grpo import TRITON_AVAILABLE, grpo_loss_triton

log = logging.getLogger(__name__)
FREE_FRACTION = 0.75  # of the free memory a candidate's estimated peak may take while it is timed


class ShapeClass(NamedTuple):
    device: str
    dtype: str
    vocab: int
    hidden: int
    rows: int  # N rounded up to a power of two


class Choice(NamedTuple):
    impl: str
    ms: dict[str, float | None]  # per candidate: median ms of the timed runs, None where it did not fit or run


_CHOSEN: dict[ShapeClass, Choice] = {}


def shape_class(hidden: torch.Tensor, weight: torch.Tensor) -> ShapeClass:
    n = hidden.shape[0]
    return ShapeClass(str(hidden.device), str(hidden.dtype).removeprefix("torch."), weight.shape[0], hidden.shape[1],
                      1 << max(n - 1, 0).bit_length())


def reference_peak_bytes(rows: int, vocab: int, dtype: torch.dtype) -> int:
    """The full-logits path's working set: the logits in ``dtype`` and three float32 tensors of that size."""
    return rows * vocab * (torch.empty(0, dtype=dtype).element_size() + 12)


def fastest(candidates: Sequence[str], time_of: Callable[[str], float | None]) -> Choice:
    """The candidate with the smallest time (the earlier one on a tie); ``time_of`` answers None for a
    candidate that does not fit or cannot run this case. The first candidate when none could be timed."""
    ms = {impl: time_of(impl) for impl in candidates}
    timed = [impl for impl in candidates if ms[impl] is not None]
    return Choice(min(timed, key=lambda impl: ms[impl]) if timed else candidates[0], ms)


def auto_impl(hidden: torch.Tensor, weight: torch.Tensor, params: LossParams) -> str:
    """What ``impl="auto"`` runs for these inputs (see the module docstring)."""
    if hidden.device.type != "cuda":
        return "chunked"
    key = shape_class(hidden, weight)
    if key not in _CHOSEN:
        fused = "triton" if TRITON_AVAILABLE else "chunked"
        candidates = [fused, "reference"] + (["chunked"] if fused == "triton" else [])
        _CHOSEN[key] = fastest(candidates, lambda impl: _time_on_cuda(impl, key, weight, params))
        log.info("loss kernel auto: %s for %s (ms %s)", _CHOSEN[key].impl, key, _CHOSEN[key].ms)
    return _CHOSEN[key].impl


def choices() -> dict[ShapeClass, Choice]:
    """What ``auto`` has picked in this process, by shape class."""
    return dict(_CHOSEN)


def _spare_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _time_on_cuda(impl: str, key: ShapeClass, weight: torch.Tensor, params: LossParams, runs: int = 3) -> float | None:
    """Median ms of ``runs`` forward + backward passes of ``impl`` on random inputs of ``key``'s shape
    (after one untimed run: Triton compiles, cuBLAS picks its algorithms); None when it does not fit
    or cannot run these params. Its own generator, so the run's random stream is left as it was."""
    device, dtype = weight.device, weight.dtype
    if impl == "reference" and reference_peak_bytes(key.rows, key.vocab, dtype) > FREE_FRACTION * _spare_bytes(device):
        return None
    g = torch.Generator(device=device).manual_seed(0)
    n = key.rows
    hidden = torch.randn(n, key.hidden, device=device, generator=g).to(dtype).requires_grad_()
    head = weight.detach().requires_grad_()  # the real head's values, a leaf of its own: no grad reaches it
    tokens = Tokens(torch.randint(0, key.vocab, (n,), device=device, generator=g),
                    -torch.rand(n, device=device, generator=g) * 8, torch.randn(n, device=device, generator=g),
                    torch.full((n,), 1.0 / n, device=device),
                    torch.zeros(n, device=device) if params.beta > 0 else None)
    run = {"reference": grpo_loss_reference, "chunked": grpo_loss_chunked, "triton": grpo_loss_triton}[impl]
    times = []
    try:
        with torch.enable_grad():
            for i in range(runs + 1):
                hidden.grad = head.grad = None
                torch.cuda.synchronize(device)
                start = time.perf_counter()
                run(hidden, head, tokens, params).loss.backward()
                torch.cuda.synchronize(device)
                if i:
                    times.append(time.perf_counter() - start)
    except NotImplementedError:  # a loss variant the Triton kernel lacks
        return None
    except torch.cuda.OutOfMemoryError:  # the estimate was short: give the blocks back to the step that follows
        torch.cuda.empty_cache()
        return None
    finally:
        hidden.grad = head.grad = None
    return 1000 * sorted(times)[len(times) // 2]
