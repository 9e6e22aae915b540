"""Keep freed memory in the process, so large tensors do not page-fault afresh on every step.

glibc serves allocations above a threshold (128 KiB to start with) with fresh
``mmap`` pages and returns them on free, so each model step that makes
megabyte-sized activations, logits or KV buffers touches new pages, and every
4 KiB page costs a fault in the kernel (on a virtual machine a costly one).
:func:`tune_malloc` raises that threshold and the trim threshold, so such
blocks come from the heap and are reused, as jemalloc or tcmalloc would.

:func:`reserve` goes one step further for the KV cache: it touches a block of
heap memory once, at model load, and frees it; glibc keeps it mapped (it is
below the trim threshold), so the first conversations' KV buffers find
memory whose pages already exist instead of faulting in ~70 MB each time a new
conversation branches off a long shared system prompt.  This is what engines
that allocate their KV cache up front (llama.cpp) get for free; the cost is
that the process keeps that much memory.

The effect is measured in ``docs/PERFORMANCE.md``; ``BRISK_MALLOC_TUNING=0``
turns both off for comparison.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 512 << 20
RESERVE_BLOCK = 16 << 20  # below MMAP_THRESHOLD, so blocks come from (and return to) the heap


@functools.cache
def tune_malloc() -> bool:
    """Apply the thresholds once per process (glibc only); return whether they are in force."""
    if not sys.platform.startswith("linux") or os.environ.get("BRISK_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def reserve(nbytes: int) -> int:
    """Touch ``nbytes`` (at most the trim threshold) of heap memory on this thread and free it; return bytes."""
    if not tune_malloc():
        return 0
    import torch

    count = min(nbytes, TRIM_THRESHOLD - RESERVE_BLOCK) // RESERVE_BLOCK
    blocks = [torch.empty(RESERVE_BLOCK, dtype=torch.uint8).fill_(1) for _ in range(count)]
    del blocks
    return count * RESERVE_BLOCK
