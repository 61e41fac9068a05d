"""Graded levels and the train/test split of the generated ``alfworld`` scenes.

Levels (option ``levels``; instance ``index`` plays ``levels[index % len(levels)]``):

- 0 (``take``): the goal names one object and the open receptacle it lies on,
  ``take the apple 1 from the countertop 2``; two calls solve it (``go to``,
  ``take``). Exactly one object of the goal's type is in the room.
- 1 (``take_and_place``): the same, then ``put it in/on the fridge 1``: four or
  five calls (``go to``, ``take``, ``go to``, maybe ``open``, ``put``).
- 2: the full task, ALFWorld's six task types (`tasks.alfworld.scene.generate`).

Each level has its own default turn limit (`LEVEL_TURNS`; the full task keeps
AgentBench's 20 steps).

Split: a scene belongs to ``test`` when a seeded hash of its content key
(`scene_key`: level, room, the set of receptacle names, the goal) falls in the
test fraction (`agentrl.environments.tasks.toolkit.split.in_split`). Instance ``index`` of a
split is the first scene drawn from ``(split, seed, index, attempt)`` that lies
on that side, so train and test never share a scene by content, whatever the
number of instances. ``all`` takes the first draw (the full task's ``all`` is
the generator's unsalted scene of ``(seed, index)``).
"""

from __future__ import annotations

import random

from agentrl.environments.tasks.alfworld.scene import (
    LEVEL_TYPES,
    OBJECTS,
    OPENABLE,
    ROOMS,
    Scene,
    generate,
    kind_of,
    receptacles_in,
)
from agentrl.environments.tasks.toolkit.split import in_split

__all__ = ["FULL", "LEVELS", "LEVEL_TURNS", "level_scene", "scene_for", "scene_key"]

FULL = 2
"""The level number of the full task."""

LEVELS = (0, 1, FULL)
"""Every level."""

LEVEL_TURNS = {0: 5, 1: 8, FULL: 20}
"""Default turn limit per level (AgentBench's ``max_step: 20`` for the full task,
``configs/tasks/alfworld.yaml`` line 10)."""

MAX_ATTEMPTS = 200
"""Draws per instance before giving up on its split (a test draw succeeds 1 in 4)."""


def scene_key(scene: Scene) -> str:
    """The content a split is decided on: task type, room, receptacle names, goal."""
    receps = ",".join(sorted(scene.receptacles))
    return f"{scene.task_type}|{scene.room}|{receps}|{scene.goal}"


def scene_for(level: int, index: int, split: str, seed: int, task_type: str) -> Scene:
    """Instance ``index`` of ``split`` at ``level`` (``task_type`` for the full level)."""
    for attempt in range(MAX_ATTEMPTS):
        if level == FULL:
            salt = "" if split == "all" else f":{split}:{attempt}"
            scene = generate(index, task_type, seed, salt)
        else:
            rng = random.Random(f"alfworld-level:{level}:{seed}:{split}:{index}:{attempt}")
            scene = level_scene(level, index, rng)
        if in_split(scene_key(scene), split, seed):
            return scene
    raise RuntimeError(f"alfworld: no {split} scene for level {level} in {MAX_ATTEMPTS} draws")


def level_scene(level: int, index: int, rng: random.Random) -> Scene:
    """A level-0 or level-1 scene drawn with ``rng`` (see the module doc)."""
    if level not in (0, 1):
        raise ValueError(f"alfworld: level_scene draws levels 0 and 1, not {level}")
    room = rng.choice(sorted(ROOMS))
    receps = receptacles_in(room, rng)
    choices = []
    for name, kind in sorted(OBJECTS.items()):
        if room not in kind.rooms:
            continue
        fits = [r for r in receps if kind_of(r) in kind.fits]
        for source in fits:
            if kind_of(source) in OPENABLE:
                continue
            if level == 0:
                choices.append((name, source, None))
            else:
                choices += [(name, source, d) for d in fits if kind_of(d) != kind_of(source)]
    target, source, destination = rng.choice(choices)
    placement = [(f"{target} 1", source)]
    counts: dict[str, int] = {}
    others = [n for n, k in sorted(OBJECTS.items()) if room in k.rooms and n != target]
    for _ in range(rng.randint(4, 8)):
        kind = rng.choice(others)
        spots = [r for r in receps if kind_of(r) in OBJECTS[kind].fits]
        if spots:
            counts[kind] = counts.get(kind, 0) + 1
            placement.append((f"{kind} {counts[kind]}", rng.choice(spots)))
    rng.shuffle(receps)
    return Scene(
        index=index,
        room=room,
        task_type=LEVEL_TYPES[level],
        target=target,
        destination=destination,
        receptacles=tuple(receps),
        locations=tuple(rng.sample(range(1, len(receps) + 20), len(receps))),
        placement=tuple(placement),
        source=source,
    )
