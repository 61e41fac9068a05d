"""The engine's running batch: its request rows and their shared, left-padded KV cache.

`_Row` is one request's state; `_Batch` holds the rows with one KV cache and an
attention mask, merges newly prefilled rows in (left-padding the shorter cache)
and drops finished rows (trimming the leading columns no remaining row attends to).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class _Row:
    """One request in the engine: queued, then a row of the running batch."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    stop_ids: frozenset[int]
    seed: int | None
    future: Future
    generator: torch.Generator | None = None
    version: int = -1
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class _Batch:
    """The running batch: rows, their shared KV cache and attention mask ``[B, T]``."""

    rows: list[_Row] = field(default_factory=list)
    cache: object | None = None
    mask: torch.Tensor | None = None

    def merge(self, other: _Batch) -> None:
        """Append ``other``'s rows, left-padding the shorter cache to the longer one."""
        if not self.rows:
            self.rows, self.cache, self.mask = other.rows, other.cache, other.mask
            return
        width = max(self.mask.shape[1], other.mask.shape[1])

        def cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cat([_left_pad(a, width), _left_pad(b, width)])

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys, mine.values = cat(mine.keys, theirs.keys), cat(mine.values, theirs.values)
        self.mask = cat(self.mask, other.mask)
        self.rows = self.rows + other.rows

    def drop(self, indices: list[int]) -> None:
        """Remove finished rows and the leading columns no remaining row attends to."""
        gone = set(indices)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            return
        index = torch.tensor(keep)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask[index]
        unused = int((self.mask.sum(0) == 0).long().cumprod(0).sum())
        self.mask = self.mask[:, unused:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index.to(layer.keys.device), :, unused:]
            layer.values = layer.values[index.to(layer.values.device), :, unused:]


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence axis (-2 for ``[B, H, T, D]`` caches, -1 for ``[B, T]`` masks)."""
    axis = -1 if x.dim() == 2 else -2
    missing = width - x.shape[axis]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[axis] = missing
    return torch.cat([x.new_zeros(shape), x], dim=axis)
