"""The process heap under glibc: what a decode batch's freed buffers leave behind, handed back.

A decode batch allocates its past and its transients (hundreds of MB for long prompts) and frees
them when it ends; glibc keeps freed memory in its arenas instead of returning it, so without a
trim the process grows to the high-water mark of every batch so far, not of what is alive.
Measured on the BFCL-sized eval (docs/PERF.md): a trim after each batch took its peak from about
2.1 to 1.8-2.0 GiB at the same speed. Nothing happens where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


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
