"""A reasoning-gym dataset's items on one side of agentrl's train/test split, by level.

reasoning-gym generates item ``k`` of a dataset from its config and ``seed + k`` (item ``k``
is ``random.Random(seed + k)``'s draw in its generators). agentrl walks the items
``0, 1, 2, ...`` of ``create_dataset(name, seed=seed, size=..., **config)`` and keeps
those whose *question* belongs to the split asked for (`tasks.toolkit.split.in_split` on
``<dataset>:<question>``, a quarter to ``test``): train and test use disjoint reasoning-gym
indices (so disjoint generator seeds), and a question asked in test is never asked in
training, even when two seeds draw the same one. ``split: all`` keeps every item, so
instance ``i`` is reasoning-gym's item ``i``.

**Levels.** Option ``levels`` names global levels of the dataset's reasoning-gym curriculum
(``create_curriculum(name).set_global_level(level)``: level 0 the easiest); the ``config``
option then overrides single fields. Instance ``index`` plays ``levels[index % len(levels)]``
and is the ``index // len(levels)``-th item of that level on the split. Without ``levels``
the dataset's own default config is used (reported as level 0).

Items are generated on first use and kept, under a lock, so two starts of one instance are
the same item and a walk is done once per environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import threading
from dataclasses import dataclass
from typing import Any

from agentrl.environments._protocol import SampleError
from agentrl.environments.tasks.reasoning_gym.library import load
from agentrl.environments.tasks.toolkit.split import in_split

__all__ = ["Item", "ItemSource"]

_WALK_PER_ITEM = 50
"""How many reasoning-gym items the walk may look at per instance it needs, before it says
the dataset's config gives too few distinct questions for the split."""


@dataclass(frozen=True)
class Item:
    """One instance: a reasoning-gym entry and the dataset that scores it."""

    level: int
    """The curriculum level it was drawn at (0 without ``levels``)."""
    index: int
    """Its index in reasoning-gym's dataset (``create_dataset(...)[index]``)."""
    entry: dict[str, Any]
    """reasoning-gym's entry: ``question``, ``answer`` (may be None), ``metadata``."""
    dataset: Any
    """The ``ProceduralDataset`` it came from: ``dataset.score_answer(answer, entry)``."""


class _Level:
    """One level's dataset and the items of the split found so far."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.found: list[int] = []
        self.entries: dict[int, dict[str, Any]] = {}
        self.next = 0


class ItemSource:
    """Item ``k`` of a level on a split (module doc); builds every level's dataset at once,
    so a bad dataset name, config or level is refused when the task is built."""

    def __init__(
        self,
        dataset: str,
        *,
        split: str,
        seed: int,
        size: int,
        config: dict[str, Any],
        levels: tuple[int, ...] | None,
        task: str,
    ) -> None:
        rg = load()
        self.name, self.split, self.seed, self._task = dataset, split, seed, task
        if dataset not in rg.factory.DATASETS:
            near = difflib.get_close_matches(dataset, list(rg.factory.DATASETS), n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise ValueError(
                f"{task}: reasoning-gym has no dataset {dataset!r}{hint}; "
                "its names are the keys of reasoning_gym.factory.DATASETS"
            )
        for own in ("seed", "size"):
            if own in config:
                raise ValueError(f"{task}: give {own} as the task's option, not in config")
        self.levels = levels
        # reasoning-gym's sizes are virtual (items come from seed + index): room for the walk
        walk = max(size, 1) * _WALK_PER_ITEM
        self._levels = {
            level: _Level(self._build(rg, level, {"seed": seed, "size": walk, **config}))
            for level in (levels or (0,))
        }
        self._lock = threading.Lock()

    def _build(self, rg: Any, level: int, options: dict[str, Any]) -> Any:
        try:
            if self.levels is None:
                return rg.factory.create_dataset(self.name, **options)
            if not rg.factory.has_curriculum(self.name):
                raise ValueError("reasoning-gym has no curriculum for it: leave out levels")
            curriculum = rg.factory.create_curriculum(self.name)
            top = max((len(a.levels) for a in curriculum.attributes.values()), default=1) - 1
            if not 0 <= level <= top:
                raise ValueError(f"levels must be in 0..{top}, got {level}")
            curriculum.set_global_level(level)
            # the level's config, then the config option's fields over it
            config = dataclasses.replace(curriculum.generate_configuration({}), **options)
            if hasattr(config, "validate"):
                config.validate()
            return rg.factory.DATASETS[self.name][0](config=config)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"{self._task}: bad config for {self.name}: {exc}") from exc

    def item(self, level: int, k: int) -> Item:
        """The ``k``-th item of ``level`` on the split (generated up to it on first use).

        Raises SampleError when the walk finds too few distinct questions for the split."""
        state = self._levels[level]
        with self._lock:
            while len(state.found) <= k:
                if state.next >= len(state.dataset):
                    raise SampleError(
                        f"{self._task}: only {len(state.found)} {self.split} item(s) of "
                        f"{self.name} level {level} in {state.next} generated: widen its "
                        "config or lower size"
                    )
                entry = state.dataset[state.next]
                if in_split(f"{self.name}:{entry['question']}", self.split, self.seed):
                    state.found.append(state.next)
                    state.entries[state.next] = entry
                state.next += 1
            index = state.found[k]
            return Item(level, index, state.entries[index], state.dataset)
