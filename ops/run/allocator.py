"""glibc's allocator told to give freed tensors back to the system.

glibc serves a request from its heap once a block of that size has been freed: its mmap
threshold follows the largest freed block, up to 32 MiB. Memory on the heap goes back to
the system only from its top, so the activations of a learner's micro-batch (tensors of
1-10 MiB, ~1.5 MiB per token of SmolLM2 without gradient checkpointing) stayed resident
after its backward pass, and the next micro-batch's landed beside them: one update of 40
real episodes grew past 18 GB, where with the threshold fixed its peak was 11.5 GB and
fell back between micro-batches (bench/results/rl60-full-s1/README.md). A run of 64
episodes per update was killed by the kernel's OOM killer at 23.8 GB.

`return_freed_memory` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, 64 KiB)``): every
block above it is mapped on its own and unmapped when freed. The run's processes call it
at start (``agentrl-supervisor``, ``agentrl``); ``MALLOC_MMAP_THRESHOLD_=65536`` in the
environment does the same.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["MMAP_THRESHOLD", "return_freed_memory"]

M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter number (malloc.h)."""

MMAP_THRESHOLD = 64 * 1024
"""Bytes: blocks from this size up are mapped apart and unmapped when freed."""


def return_freed_memory(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` for this process; False where the C
    library is not glibc (nothing to do there)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc: musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1
