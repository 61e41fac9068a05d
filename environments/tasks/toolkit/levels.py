"""Graded levels for data-set tasks (``db``, ``os``, ``kg``): which level an instance plays.

A task with graded levels offers small generated levels (0, 1, ...: one or two
calls, so a small model can sometimes solve them) below its full level (the
data set's items, AgentBench's task). Option ``levels`` picks the levels; an
instance ``index`` plays ``levels[index % len(levels)]`` (the calculator's
convention).

:class:`LevelPlan` maps an index to ``(level, k)``: ``k`` numbers the
instances of that level. Generated levels use ``k = index`` (every index its
own instance); the full level uses the data set's items in order, once each,
so with ``levels=[full]`` the instances are exactly the split's items.

:func:`generate` draws the ``k``-th instance of a generated level for a split:
it tries ``random.Random(f"{task}:{level}:{seed}:{k}:{attempt}")`` for attempt
0, 1, ... and keeps the first instance whose content key belongs to the split
(`tasks.toolkit.split.in_split`), so a generated test instance can never equal a training
one, and an instance depends only on (task, level, split, seed, k).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agentrl.environments.tasks.toolkit.split import in_split

__all__ = ["CycledLevels", "LevelPlan", "check_levels", "generate", "pick"]

T = TypeVar("T")

_MAX_ATTEMPTS = 1000


def check_levels(levels: Sequence[int], valid: Sequence[int], task: str) -> tuple[int, ...]:
    """``levels`` as a tuple, or ValueError naming the task and the valid levels."""
    chosen = tuple(levels)
    if not chosen or any(lv not in valid for lv in chosen):
        names = ", ".join(map(str, valid))
        raise ValueError(f"{task}: levels must be a non-empty list of {names}, got {list(levels)}")
    return chosen


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Which level and which instance of it each index plays (module doc)."""

    levels: tuple[int, ...]
    """The ``levels`` option, in order."""
    full_level: int
    """The level number of the data set's items."""
    full_items: int
    """How many data-set items the chosen split holds."""
    generated: int
    """Instances per generated level when the full level is not among ``levels``."""

    @property
    def num_instances(self) -> int:
        """All indices: one cycle of ``levels`` per data-set item (per full slot), else
        ``generated`` cycles."""
        slots = self.levels.count(self.full_level)
        cycles = math.ceil(self.full_items / slots) if slots else self.generated
        return cycles * len(self.levels)

    def locate(self, index: int) -> tuple[int, int]:
        """``(level, k)`` of instance ``index``; IndexError when out of range."""
        if not 0 <= index < self.num_instances:
            raise IndexError(f"index {index} not in [0, {self.num_instances})")
        position = index % len(self.levels)
        level = self.levels[position]
        if level != self.full_level:
            return level, index
        slots = [i for i, lv in enumerate(self.levels) if lv == self.full_level]
        k = (index // len(self.levels)) * len(slots) + slots.index(position)
        return level, k % self.full_items


def pick(
    task: str,
    plan: LevelPlan,
    index: int,
    items: Sequence[T],
    split: str,
    seed: int,
    make: Callable[[int, random.Random], tuple[T, str]] | None,
) -> T:
    """Instance ``index`` of a data-set task: its data-set item at the full level, else the
    generated instance of its level (``make(level, rng)``, see :func:`generate`; None when
    the plan has the full level only); IndexError naming ``task`` when ``index`` is out of
    range."""
    try:
        level, k = plan.locate(index)
    except IndexError as exc:
        raise IndexError(f"{task}: {exc}") from None
    if level == plan.full_level:
        return items[k]
    if make is None:
        raise RuntimeError(f"{task}: level {level} is generated, but no generator was given")
    return generate(task, level, split, seed, k, lambda rng: make(level, rng))


def generate(
    task: str,
    level: int,
    split: str,
    seed: int,
    k: int,
    make: Callable[[random.Random], tuple[T, str]],
) -> T:
    """The ``k``-th generated instance of ``level`` in ``split``; ``make(rng)`` returns an
    instance and its content key (module doc)."""
    for attempt in range(_MAX_ATTEMPTS):
        instance, key = make(random.Random(f"{task}:{level}:{seed}:{k}:{attempt}"))
        if in_split(key, split, seed):
            return instance
    raise RuntimeError(f"{task}: level {level} made no {split} instance in {_MAX_ATTEMPTS} tries")


class CycledLevels:
    """The level accessors of a task whose instance ``index`` plays
    ``levels[index % len(levels)]`` and whose turn limit is the ``max_turns`` option when
    given, else the level's own (``alfworld``, ``webshop``).

    The task sets ``_task`` (its name), ``_levels``, ``_count`` (instances),
    ``_max_turns`` (the option, or None) and ``_level_turns`` (level -> turn limit).
    """

    _task: str
    _levels: tuple[int, ...]
    _count: int
    _max_turns: int | None
    _level_turns: dict[int, int]

    @property
    def levels(self) -> tuple[int, ...]:
        """The ``levels`` option: instance ``index`` plays ``levels[index % len(levels)]``."""
        return tuple(self._levels)

    @property
    def num_instances(self) -> int:
        return self._count

    @property
    def max_turns(self) -> int:
        """The longest turn limit of the chosen levels."""
        return max(self.turn_limit(level) for level in self._levels)

    def turn_limit(self, level: int) -> int:
        """Assistant messages an episode of ``level`` may take (``max_turns`` or the level's)."""
        return self._max_turns if self._max_turns is not None else self._level_turns[level]

    def level(self, index: int) -> int:
        """The level instance ``index`` plays (``levels[index % len(levels)]``)."""
        self._check(index)
        return self._levels[index % len(self._levels)]

    def _check(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise IndexError(f"{self._task}: index {index} not in [0, {self._count})")
