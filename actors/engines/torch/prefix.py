"""Saved KV-cache prefixes of finished requests, for reuse by later requests.

An agent's turn k+1 prompt is its turn k prompt plus the completion plus the
tool result, and the G episodes of a GRPO group (and every episode of a task)
share the system prompt and tool schema. `PrefixStore` keeps the cache of
finished sequences (least recently used first out, within a budget of
positions) and answers "which saved sequence shares the longest prefix with
this prompt": the engine copies that many positions instead of recomputing
them. The cache of position i depends only on tokens 0..i, so any saved
sequence serves any prompt it shares a prefix with, however they continue.

Entries are only valid for the weights that computed them: the engine clears
the store when it loads new weights.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import torch


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(eq=False)
class Prefix:
    tokens: np.ndarray
    """The sequence whose cache is saved, ``[T]`` int64."""
    kv: torch.Tensor
    """Its cache, ``[layers, 2, kv_heads, T, head_dim]``."""


class PrefixStore:
    """Finished sequences' KV caches, LRU within ``budget`` positions (0 disables it)."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"prefix cache budget must be >= 0, got {budget}")
        self.budget = budget
        self._entries: collections.OrderedDict[int, Prefix] = collections.OrderedDict()
        self._positions = 0
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def positions(self) -> int:
        """Positions held by all entries."""
        return self._positions

    def longest(self, prompt: np.ndarray) -> tuple[Prefix | None, int]:
        """The entry sharing the longest prefix with ``prompt``, and that length (0: none)."""
        best, best_len, best_key = None, 0, None
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, prompt)
            if n > best_len:
                best, best_len, best_key = entry, n, key
        if best_key is not None:
            self._entries.move_to_end(best_key)
        return best, best_len

    def add(self, tokens: np.ndarray, kv: torch.Tensor) -> None:
        """Save a finished sequence's cache (``kv`` holds ``len(tokens)`` positions)."""
        if not 0 < len(tokens) <= self.budget:
            return
        for key, entry in list(self._entries.items()):
            shared = common_prefix(entry.tokens, tokens)
            if shared == len(tokens):  # already covered by a longer (or equal) entry
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):  # the new sequence extends this one
                self._remove(key)
        self._entries[self._next_key] = Prefix(tokens, kv)
        self._next_key += 1
        self._positions += len(tokens)
        while self._positions > self.budget:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._positions = 0

    def _remove(self, key: int) -> None:
        self._positions -= len(self._entries.pop(key).tokens)
