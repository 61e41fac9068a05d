"""Freed tensors handed back to the system after each update (glibc's ``malloc_trim``).

glibc serves a request from its heap once a block of that size has been freed (its mmap
threshold follows the largest freed block, up to 32 MiB), and gives heap memory back to
the system only from the top. A learner's update frees gigabytes of activations after
each micro-batch's backward; they stay resident, and the next update's land beside them.
`release_freed_memory` (``malloc_trim(0)``: every free page of the heaps back to the
system) runs at the end of each update, so each starts from what is live.

Measured on one update of 40 real episodes (5 groups of 8, 39,240 tokens; SmolLM2 under
autocast, the shared prompt, micro-batches of 2,048 tokens, before `_shared_prefix` ran
each group to its own width): 162 s and 13.8 GB peak with glibc's defaults; fixing the
mmap threshold at 64 KiB instead (every block mapped apart and unmapped when freed) cut
the peak to 11.4 GB but took 257 s, the pages faulted in afresh for every tensor
(bench/results/rl60-full-s1/README.md). A trim per update costs one such refault per
update.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["release_freed_memory"]


def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc: musl and others have no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Give the heaps' free pages back to the system; False where the C library is not
    glibc (nothing to do there) or nothing could be given back."""
    return _TRIM is not None and _TRIM(0) == 1
