"""How the torch engine runs its batch through the model: two executors, one interface.

An executor owns the running rows and their KV cache. The engine admits rows
(`admit`: prefill, logits of each new row's last prompt position), decodes one
token for every running row (`decode`: each row's input is its last sampled
token), retires finished rows (`drop`) and, after a weight load, forgets every
cache computed with the old weights (`reset`).

- `SlotExecutor` (Llama, Qwen2, Mistral): `SlotRunner`'s slot cache plus prefix
  reuse. A new row copies the longest prefix its prompt shares with a running
  row or with a finished sequence in the `PrefixStore`, and computes only the
  rest: the next turn of an episode, the other members of a GRPO group and
  every episode of a task (same system prompt and tools) all skip most of
  their prefill.
- `HFExecutor` (any causal LM): the HF model's own forward over a left-padded
  `DynamicCache` batch; no prefix reuse.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from .kvbatch import _Batch, _Row
from .llama import SlotRunner
from .prefix import PrefixStore, common_prefix


class Executor(Protocol):
    rows: list[_Row]
    """Running rows, in the order of the logits rows `decode` returns."""

    def admit(self, rows: list[_Row]) -> torch.Tensor: ...

    def decode(self) -> torch.Tensor: ...

    def drop(self, rows: list[_Row]) -> None: ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class SlotExecutor:
    """Slot KV cache with prefix reuse (see module doc)."""

    def __init__(self, model, *, slots: int, prefix_budget: int) -> None:
        self._runner = SlotRunner(model, slots=slots)
        self._store = PrefixStore(prefix_budget)
        self.rows: list[_Row] = []
        self._cached: list[list[int]] = []  # tokens whose cache slot i holds
        self._computed = 0
        self._reused = 0

    def admit(self, rows: list[_Row]) -> torch.Tensor:
        logits = []
        for row in rows:  # one at a time, so a row can reuse the one admitted before it
            slot = len(self.rows)
            prompt = np.asarray(row.prompt_ids, dtype=np.int64)
            source, shared = self._best_source(prompt)
            reuse = min(shared, len(prompt) - 1)  # the last position is needed for its logits
            if reuse:
                self._runner.copy_in(slot, source, reuse)
            logits.append(self._runner.prefill(slot, row.prompt_ids[reuse:], reuse))
            self.rows.append(row)
            self._cached.append(list(row.prompt_ids))
            self._computed += len(prompt) - reuse
            self._reused += reuse
        return torch.stack(logits)

    def decode(self) -> torch.Tensor:
        tokens = [row.token_ids[-1] for row in self.rows]
        lengths = [len(c) for c in self._cached]
        logits = self._runner.decode(tokens, lengths)
        for cached, token in zip(self._cached, tokens, strict=True):
            cached.append(token)
        return logits

    def drop(self, rows: list[_Row]) -> None:
        gone = {id(r) for r in rows}
        for slot in reversed(range(len(self.rows))):
            if id(self.rows[slot]) not in gone:
                continue
            cached = self._cached[slot]
            if self._store.budget:
                kv = self._runner.save(slot, len(cached))
                self._store.add(np.asarray(cached, dtype=np.int64), kv)
            last = len(self.rows) - 1
            self._runner.move(slot, last, len(self._cached[last]))
            self.rows[slot], self._cached[slot] = self.rows[last], self._cached[last]
            self.rows.pop()
            self._cached.pop()

    def reset(self) -> None:
        """New weights: repack them, forget every prefix computed with the old ones."""
        self._runner.refresh()
        self._store.clear()

    def stats(self) -> dict[str, int]:
        return {
            "prefill_computed": self._computed,
            "prefill_reused": self._reused,
            "prefix_entries": len(self._store),
            "prefix_positions": self._store.positions,
        }

    def _best_source(self, prompt: np.ndarray) -> tuple[torch.Tensor | int | None, int]:
        """The running slot or saved prefix sharing most of ``prompt``, and how much."""
        entry, shared = self._store.longest(prompt)
        source: torch.Tensor | int | None = entry.kv if entry is not None else None
        for slot, cached in enumerate(self._cached):
            n = common_prefix(np.asarray(cached, dtype=np.int64), prompt)
            if n > shared:
                source, shared = slot, n
        return source, shared


class HFExecutor:
    """The HF model's forward over a left-padded DynamicCache batch (any causal LM)."""

    def __init__(self, model) -> None:
        self._model = model
        self._device = next(model.parameters()).device
        self._batch = _Batch()
        _new_cache(model)  # fails now, not at the first request, for an unsupported cache
        self._computed = 0

    @property
    def rows(self) -> list[_Row]:
        return self._batch.rows

    def admit(self, rows: list[_Row]) -> torch.Tensor:
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _new_cache(self._model)
        logits = self._forward(ids, mask, positions, cache)
        self._batch.merge(_Batch(rows=rows, cache=cache, mask=mask))
        self._computed += sum(len(r.prompt_ids) for r in rows)
        return logits

    def decode(self) -> torch.Tensor:
        batch = self._batch
        ids = torch.tensor([[r.token_ids[-1]] for r in batch.rows])
        positions = torch.tensor([[len(r.prompt_ids) + len(r.token_ids) - 1] for r in batch.rows])
        batch.mask = torch.cat([batch.mask, torch.ones(len(batch.rows), 1, dtype=torch.long)], 1)
        return self._forward(ids, batch.mask, positions, batch.cache)

    def drop(self, rows: list[_Row]) -> None:
        gone = {id(r) for r in rows}
        self._batch.drop([i for i, r in enumerate(self._batch.rows) if id(r) in gone])

    def reset(self) -> None:
        """Nothing outlives its request here."""

    def stats(self) -> dict[str, int]:
        return {"prefill_computed": self._computed, "prefill_reused": 0}

    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        """Logits of the last position of each row, float32 ``[B, V]``."""
        out = self._model(
            input_ids=ids.to(self._device),
            attention_mask=mask.to(self._device),
            position_ids=positions.to(self._device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()


def _new_cache(model):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise ValueError("sliding-window attention caches are not supported by TorchEngine")
    return cache
