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

Curriculum: a task may have a schedule, ``[(version, weight), ...]``, its
weight as a piecewise-linear function of the learner version (constant before
the first and after the last point, see `scheduled_weight`); the round-robin
uses the weights of the version current at each pick. A task at weight 0 is
paused: it gets no groups and keeps its credit for when it resumes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

__all__ = ["Schedule", "TaskMixer", "idle_version", "schedule_problems", "scheduled_weight"]

Schedule = Sequence[tuple[float, float]]
"""``[(version, weight), ...]`` with strictly increasing versions."""


def scheduled_weight(schedule: Schedule, version: float) -> float:
    """The weight ``schedule`` gives at ``version``: linear between its points, constant
    outside them."""
    (v0, w0), (vn, wn) = schedule[0], schedule[-1]
    if version <= v0:
        return float(w0)
    if version >= vn:
        return float(wn)
    for (a, wa), (b, wb) in itertools.pairwise(schedule):
        if a <= version <= b:
            return float(wa + (wb - wa) * (version - a) / (b - a))
    raise ValueError(f"schedule versions are not increasing: {list(schedule)}")


def schedule_problems(schedule: Sequence[Sequence[float]]) -> list[str]:
    """What keeps ``schedule`` from being a `Schedule` (empty when it is one)."""
    if not schedule or any(len(point) != 2 for point in schedule):
        return ["must be a non-empty list of [version, weight] pairs"]
    versions = [v for v, _ in schedule]
    problems = []
    if any(v < 0 for v in versions) or any(b <= a for a, b in itertools.pairwise(versions)):
        problems.append(f"versions must be >= 0 and strictly increasing: {versions}")
    if any(w < 0 for _, w in schedule):
        problems.append("weights must be >= 0")
    return problems


def idle_version(schedules: Sequence[Schedule]) -> float | None:
    """A version at which every schedule gives weight 0, or None. The total weight is
    piecewise linear between the schedules' points, so checking the points suffices."""
    points = sorted({v for schedule in schedules for v, _ in schedule})
    return next((v for v in points if sum(scheduled_weight(s, v) for s in schedules) <= 0), None)


class TaskMixer:
    """Deterministic task interleaving by weight and per-task epoch walks (see module doc)."""

    def __init__(
        self,
        weights: Mapping[str, float],
        sizes: Mapping[str, int],
        seed: int = 0,
        schedules: Mapping[str, Schedule] | None = None,
    ):
        """``schedules[task]``, when given, replaces that task's constant weight."""
        schedules = dict(schedules or {})
        if set(weights) != set(sizes) or not weights or not set(schedules) <= set(weights):
            raise ValueError("weights and sizes must name the same, non-empty set of tasks")
        bad = [t for t, w in weights.items() if not w > 0 and t not in schedules]
        bad += [t for t, n in sizes.items() if n < 1]
        bad += [t for t, sch in schedules.items() if schedule_problems(sch)]
        if bad:
            raise ValueError(f"tasks need weight > 0 and at least one instance: {sorted(bad)}")
        self._weights = dict(sorted(weights.items()))
        self._schedules = schedules
        self._sizes = dict(sizes)
        self._credit = {t: 0.0 for t in self._weights}
        self._rng = random.Random(seed)
        self._orders: dict[str, tuple[list[int], int]] = {}
        self.epochs = {t: 0 for t in self._weights}
        """Completed passes over each task's instances (a pass is counted when it starts)."""

    def weights(self, version: int = 0) -> dict[str, float]:
        """Each task's weight at learner version ``version``."""
        return {
            t: scheduled_weight(self._schedules[t], version) if t in self._schedules else w
            for t, w in self._weights.items()
        }

    def next_task(self, version: int = 0) -> str:
        weights = {t: w for t, w in self.weights(version).items() if w > 0}
        if not weights:
            raise ValueError(f"no task has a weight > 0 at version {version}")
        for task, weight in weights.items():
            self._credit[task] += weight
        best = max(self._credit[t] for t in weights)
        task = next(t for t in weights if self._credit[t] == best)  # ties: by name
        self._credit[task] -= sum(weights.values())
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

    def next(self, version: int = 0) -> tuple[str, int]:
        """The next group's task and instance index, at learner version ``version``."""
        task = self.next_task(version)
        return task, self.next_index(task)
