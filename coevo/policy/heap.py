"""The process heap under glibc: what a decode batch's freed buffers leave behind, handed back.

A decode batch allocates its past and its transients (hundreds of MB for long prompts) and frees
them when it ends; glibc keeps freed memory in its arenas instead of returning it, so without a
trim the process grows to the high-water mark of every batch so far, not of what is alive.
Measured on the BFCL-sized eval (docs/PERF.md): a trim after each batch took its peak from about
2.1 to 1.8-2.0 GiB at the same speed. Nothing happens where the C library is not glibc.

Also the process's peak resident memory, which the loop reads phase by phase (``PhaseClock``): the
kernel's high-water mark, reset at each phase's start, so a round's record says which phase set
its peak (rollout, the Critic's re-runs, the GRPO step) without a sampler thread.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Return freed heap pages to the system (glibc's ``malloc_trim``): after a decode batch, and
    before a training step."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter: the size from which a block gets pages of its own."""

STEP_MMAP_THRESHOLD = 128 << 10
"""Bytes from which a training step's blocks are mapped on their own (``blocks_mapped``): glibc's
own starting value. 1 MiB left a distill step at 3,245 MiB against 2,413 (docs/PERF.md): blocks of
a few hundred KiB (a row's [T, 576] states) fragment the arenas too."""

HEAP_MMAP_THRESHOLD = 32 << 20
"""The threshold outside a step: the value glibc's own adjustment ends at on 64-bit systems."""


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


@contextmanager
def blocks_mapped(nbytes: int = STEP_MMAP_THRESHOLD) -> Iterator[None]:
    """Inside the block every allocation of ``nbytes`` or more that the arenas' free chunks cannot
    hold gets pages of its own, handed back the moment it is freed; after it, the heap is trimmed
    (glibc consults the threshold only when its bins and the heap's top are too small, so what an
    earlier phase freed and left in the arenas is reused first).

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), so after the
    first few activations a training step's tensors all come from the heap arenas, where the
    freed blocks of one micro-batch's sizes stay resident while the next micro-batch asks for
    other sizes. A fixed threshold turns that adjustment off. Measured on a distill run's step
    (docs/PERF.md): its peak went from 3,407 to 2,413 MiB with 999 MiB of activations alive,
    at about 25% more step time (each block is faulted in anew); the arithmetic is untouched.
    Outside a step the threshold is fixed at glibc's own ceiling, so decoding (whose growing
    caches would be mapped and faulted in anew at every token under a low one) keeps the heap's
    reuse. Nothing changes where the C library is not glibc."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, nbytes)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
        trim_heap()


_STATUS, _CLEAR_REFS = "/proc/self/status", "/proc/self/clear_refs"


def status_kib(field: str) -> int | None:
    """A memory figure of ``/proc/self/status`` in KiB (``VmRSS``: resident now; ``VmHWM``: the peak
    since the last ``reset_high_water``, which the kernel keeps exactly: no sampling misses a short
    spike); None where /proc does not say."""
    try:
        with open(_STATUS) as f:
            line = next((x for x in f if x.startswith(field + ":")), None)
    except OSError:
        return None
    return int(line.split()[1]) if line else None


def high_water_mb() -> float | None:
    """The peak resident memory since the last ``reset_high_water`` in MB (10^6 bytes), or None."""
    kib = status_kib("VmHWM")
    return kib * 1024 / 1e6 if kib is not None else None


def reset_high_water() -> bool:
    """Start a new peak at the current resident memory (writing 5 to ``/proc/self/clear_refs``);
    False where the kernel does not allow it (the peak then runs from the process's start)."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True
