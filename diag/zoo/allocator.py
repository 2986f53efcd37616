"""glibc's allocator told to keep freed memory for reuse while the zoo builds.

A training step on the 2-core CPU allocates and frees tensors of a few MB (the drafter's
logits over its hot vocabulary: 5 x 256 x 1536 floats, 7.9 MB, several per step). glibc
serves an allocation above its mmap threshold (128 KB, raised on each free up to 32 MB)
with a fresh mmap, and hands freed heap above its trim threshold back to the kernel, so
such a tensor faults its pages in anew, zero-filled, at every step. For the llama-tiny
drafters that was a fifth of the step (97 -> 70-74 ms, measured back to back; the loss
alone 18 -> 5-8 ms).

keep_freed_memory() fixes both thresholds: allocations up to 32 MB (glibc's largest
mmap threshold) come from the heap, and freed heap is kept. Page placement only: every
result is the same bits. The process keeps its peak heap until it exits (about 1 GB for
the zoo), which the build's own peak needs anyway.

A no-op where the C library has no mallopt (musl, macOS, Windows). This module knows the
allocator; it knows nothing about torch or the zoo.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1            # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20        # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; larger is refused
TRIM_THRESHOLD = (1 << 31) - 1   # mallopt takes an int: keep up to 2 GiB of freed heap

_done = False


def keep_freed_memory() -> bool:
    """Set both thresholds once per process. Returns whether glibc accepted them."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
