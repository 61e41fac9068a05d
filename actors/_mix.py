"""Which task and instance the next GRPO group plays: weighted interleaving of tasks.

Tasks are interleaved by smooth weighted round-robin: each pick adds every
task's weight to its credit, takes the task with the most credit (ties by
name) and takes the total weight from it. Over any run of ``n`` groups each
task gets its share ``n * w / sum(w)`` within one group, so every batch
holds the configured mix; random draws by weight leave a task out of a small
batch now and then, which task advantage normalisation then cannot see.

Instances of each task are walked in a seeded shuffled order, reshuffled at
each new epoch. A small set is thus upsampled (replayed, each instance equally
often) to its weight's share rather than diluted by a big one: weights, not set
sizes, decide the mix.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

__all__ = ["TaskMixer"]


class TaskMixer:
    """Deterministic task interleaving by weight and per-task epoch walks (see module doc)."""

    def __init__(self, weights: Mapping[str, float], sizes: Mapping[str, int], seed: int = 0):
        if set(weights) != set(sizes) or not weights:
            raise ValueError("weights and sizes must name the same, non-empty set of tasks")
        bad = [t for t, w in weights.items() if not w > 0] + [t for t, n in sizes.items() if n < 1]
        if bad:
            raise ValueError(f"tasks need weight > 0 and at least one instance: {sorted(bad)}")
        self._weights = dict(sorted(weights.items()))
        self._sizes = dict(sizes)
        self._total = sum(self._weights.values())
        self._credit = {t: 0.0 for t in self._weights}
        self._rng = random.Random(seed)
        self._orders: dict[str, tuple[list[int], int]] = {}
        self.epochs = {t: 0 for t in self._weights}
        """Completed passes over each task's instances (a pass is counted when it starts)."""

    def next_task(self) -> str:
        for task, weight in self._weights.items():
            self._credit[task] += weight
        best = max(self._credit.values())
        task = next(t for t in self._weights if self._credit[t] == best)  # ties: by name
        self._credit[task] -= self._total
        return task

    def next_index(self, task: str) -> int:
        order, pos = self._orders.get(task, ([], 0))
        if pos >= len(order):
            order = list(range(self._sizes[task]))
            self._rng.shuffle(order)
            pos = 0
            self.epochs[task] += 1
        self._orders[task] = (order, pos + 1)
        return order[pos]

    def next(self) -> tuple[str, int]:
        """The next group's task and instance index."""
        task = self.next_task()
        return task, self.next_index(task)
