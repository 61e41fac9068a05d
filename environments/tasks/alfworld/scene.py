"""ALFWorld-style scenes for the ``alfworld`` task: the catalog, the generator, the planner.

A `Scene` is one task instance: a room (kitchen, bedroom, bathroom or living
room) with numbered receptacles (``countertop 2``; the openable ones, such as
``fridge 1`` or ``drawer 3``, closed at the start), numbered objects placed in
them, and a goal of one of ALFWorld's six task types. Scenes are a pure
function of ``(seed, index)`` (`generate`): the task type cycles with the
index, so any ``num_instances`` is balanced across the types, and every scene
is solvable by construction: `solution` returns a command sequence that
reaches the goal in the simulator (`agentrl.environments.tasks.alfworld.world`).

Object properties follow ALFWorld's: which object types can be heated
(microwave), cooled (fridge) or cleaned (sinkbasin), which receptacle types
each one fits in (where it is placed at the start and where ``put`` accepts
it), and which rooms have a desklamp (``look_at_obj``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "LEVEL_TYPES",
    "OBJECTS",
    "OPENABLE",
    "ROOMS",
    "TASK_TYPES",
    "ObjectKind",
    "Scene",
    "generate",
    "goal_text",
    "receptacles_in",
    "solution",
]

TASK_TYPES = (
    "pick_and_place",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "look_at_obj",
    "pick_two_obj",
)
"""ALFWorld's six task types, in AgentBench's naming (its ``dev.json`` keys)."""

LEVEL_TYPES = ("take", "take_and_place")
"""The easy ways in (`agentrl.environments.tasks.alfworld.levels`): take a named object from a
named receptacle; take it and put it in/on another named receptacle."""

OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
"""Receptacle types that are closed at the start and hide their contents until opened."""

LAMP = "desklamp"
"""The lamp object type of ``look_at_obj``: not takeable, turned on with ``use``."""

APPLIANCE = {
    "pick_clean_then_place": "sinkbasin",
    "pick_heat_then_place": "microwave",
    "pick_cool_then_place": "fridge",
}
"""The receptacle type each state-changing task needs (``clean/heat/cool X with it``)."""

STATE = {
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "hot",
    "pick_cool_then_place": "cool",
}
"""The object state each state-changing task asks for."""

ROOMS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "kitchen": (
        ("cabinet", 4, 8), ("countertop", 1, 3), ("drawer", 2, 4), ("fridge", 1, 1),
        ("microwave", 1, 1), ("sinkbasin", 1, 1), ("stoveburner", 2, 4), ("diningtable", 1, 1),
        ("garbagecan", 1, 1), ("coffeemachine", 1, 1), ("toaster", 1, 1), ("shelf", 0, 2),
    ),
    "bedroom": (
        ("bed", 1, 1), ("desk", 1, 2), ("drawer", 2, 5), ("shelf", 1, 3), ("sidetable", 1, 2),
        ("dresser", 1, 1), ("garbagecan", 1, 1), ("laundryhamper", 1, 1), ("safe", 0, 1),
    ),
    "bathroom": (
        ("toilet", 1, 1), ("sinkbasin", 1, 2), ("bathtubbasin", 1, 1), ("cabinet", 2, 4),
        ("countertop", 1, 1), ("towelholder", 1, 1), ("handtowelholder", 1, 1),
        ("toiletpaperhanger", 1, 1), ("garbagecan", 1, 1), ("drawer", 0, 2), ("shelf", 0, 2),
    ),
    "livingroom": (
        ("sofa", 1, 1), ("armchair", 1, 2), ("coffeetable", 1, 1), ("sidetable", 1, 2),
        ("tvstand", 1, 1), ("drawer", 1, 4), ("dresser", 1, 1), ("shelf", 1, 3),
        ("garbagecan", 1, 1), ("cabinet", 1, 3),
    ),
}  # fmt: skip
"""Per room: (receptacle type, fewest, most instances)."""

LAMP_ON = {"bedroom": ("desk", "sidetable"), "livingroom": ("sidetable",)}
"""Rooms with a desklamp, and the receptacle types it may stand on."""


@dataclass(frozen=True, slots=True)
class ObjectKind:
    """What one object type can do and where it fits."""

    rooms: tuple[str, ...]
    """Rooms it appears in."""
    fits: tuple[str, ...]
    """Receptacle types it can be in (at the start, and as a ``put`` target)."""
    heat: bool = False
    cool: bool = False
    clean: bool = False
    look: bool = False
    """A ``look_at_obj`` target."""


_FOOD = ("countertop", "diningtable", "fridge", "microwave", "sinkbasin", "garbagecan")
_DISH = ("countertop", "diningtable", "cabinet", "shelf", "fridge", "microwave", "sinkbasin")
_TOOL = ("countertop", "drawer", "diningtable", "sinkbasin")
_SMALL = ("desk", "drawer", "shelf", "sidetable", "dresser", "safe", "coffeetable", "tvstand")
_SOFT = ("bed", "sofa", "armchair")
_K, _B, _T, _L = ("kitchen",), ("bedroom",), ("bathroom",), ("livingroom",)

OBJECTS: dict[str, ObjectKind] = {
    "apple": ObjectKind(_K, _FOOD, heat=True, cool=True, clean=True),
    "bread": ObjectKind(_K, _FOOD, heat=True, cool=True),
    "egg": ObjectKind(_K, _FOOD, heat=True, cool=True, clean=True),
    "potato": ObjectKind(_K, _FOOD, heat=True, cool=True, clean=True),
    "tomato": ObjectKind(_K, _FOOD, heat=True, cool=True, clean=True),
    "lettuce": ObjectKind(_K, _FOOD, cool=True, clean=True),
    "mug": ObjectKind(_K + _B, (*_DISH, "coffeemachine", "desk"), True, True, True, True),
    "cup": ObjectKind(_K, (*_DISH, "coffeemachine"), heat=True, cool=True, clean=True),
    "plate": ObjectKind(_K, _DISH, heat=True, cool=True, clean=True),
    "bowl": ObjectKind(_K + _B, (*_DISH, "desk"), cool=True, clean=True, look=True),
    "pan": ObjectKind(_K, ("stoveburner", "countertop", "cabinet", "fridge", "sinkbasin"),
                      cool=True, clean=True),
    "pot": ObjectKind(_K, ("stoveburner", "countertop", "cabinet", "fridge", "sinkbasin"),
                      cool=True, clean=True),
    "kettle": ObjectKind(_K, ("stoveburner", "countertop", "cabinet", "sinkbasin"), clean=True),
    "knife": ObjectKind(_K, _TOOL, clean=True),
    "fork": ObjectKind(_K, _TOOL, clean=True),
    "spoon": ObjectKind(_K, _TOOL, clean=True),
    "spatula": ObjectKind(_K, _TOOL, clean=True),
    "ladle": ObjectKind(_K, _TOOL, clean=True),
    "butterknife": ObjectKind(_K, _TOOL, clean=True),
    "winebottle": ObjectKind(_K, ("countertop", "cabinet", "fridge", "diningtable", "shelf"),
                             cool=True),
    "saltshaker": ObjectKind(_K, ("countertop", "cabinet", "drawer", "shelf", "diningtable")),
    "peppershaker": ObjectKind(_K, ("countertop", "cabinet", "drawer", "shelf", "diningtable")),
    "dishsponge": ObjectKind(_K + _T, ("countertop", "cabinet", "drawer", "sinkbasin",
                                       "shelf", "bathtubbasin"), clean=True),
    "soapbottle": ObjectKind(_K + _T, ("countertop", "cabinet", "shelf", "toilet",
                                       "garbagecan")),
    "soapbar": ObjectKind(_T, ("toilet", "countertop", "cabinet", "garbagecan",
                               "bathtubbasin", "shelf"), clean=True),
    "cloth": ObjectKind(_T, ("cabinet", "countertop", "bathtubbasin", "toilet", "drawer",
                             "shelf"), clean=True),
    "spraybottle": ObjectKind(_T, ("toilet", "cabinet", "countertop", "garbagecan", "shelf")),
    "toiletpaper": ObjectKind(_T, ("toiletpaperhanger", "toilet", "cabinet", "countertop",
                                   "garbagecan", "shelf")),
    "candle": ObjectKind(_T, ("toilet", "countertop", "cabinet", "shelf")),
    "towel": ObjectKind(_T, ("towelholder", "countertop", "cabinet")),
    "handtowel": ObjectKind(_T, ("handtowelholder", "countertop", "cabinet")),
    "tissuebox": ObjectKind(_T + _L, ("toilet", "countertop", "shelf", "coffeetable",
                                      "sidetable", "dresser"), look=True),
    "alarmclock": ObjectKind(_B, ("desk", "shelf", "sidetable", "dresser"), look=True),
    "book": ObjectKind(_B + _L, ("bed", "desk", "sidetable", "dresser", "shelf", "sofa",
                                 "coffeetable"), look=True),
    "cd": ObjectKind(_B, (*_SMALL, "garbagecan"), look=True),
    "cellphone": ObjectKind(_B + _L, (*_SMALL, *_SOFT), look=True),
    "creditcard": ObjectKind(_B + _L, (*_SMALL, "armchair", "sofa"), look=True),
    "keychain": ObjectKind(_B + _L, _SMALL, look=True),
    "pen": ObjectKind(_B, (*_SMALL, "garbagecan"), look=True),
    "pencil": ObjectKind(_B, (*_SMALL, "garbagecan"), look=True),
    "watch": ObjectKind(_B + _L, _SMALL, look=True),
    "laptop": ObjectKind(_B + _L, ("bed", "desk", "sidetable", "sofa", "coffeetable",
                                   "dresser", "armchair"), look=True),
    "pillow": ObjectKind(_B + _L, _SOFT, look=True),
    "baseballbat": ObjectKind(_B, ("bed", "desk", "shelf")),
    "remotecontrol": ObjectKind(_L, ("sofa", "armchair", "coffeetable", "sidetable", "tvstand",
                                     "dresser", "drawer"), look=True),
    "newspaper": ObjectKind(_L, ("sofa", "armchair", "coffeetable", "sidetable",
                                 "garbagecan", "dresser"), look=True),
    "statue": ObjectKind(_L, ("coffeetable", "sidetable", "shelf", "tvstand", "dresser",
                              "cabinet"), look=True),
    "vase": ObjectKind(_L, ("coffeetable", "sidetable", "shelf", "tvstand", "cabinet"),
                       look=True),
    "box": ObjectKind(_L, ("sofa", "armchair", "coffeetable", "sidetable", "dresser", "shelf"),
                      look=True),
}  # fmt: skip
"""Every object type and its properties."""


@dataclass(frozen=True, slots=True)
class Scene:
    """One generated task instance (immutable; the simulator copies what changes)."""

    index: int
    room: str
    task_type: str
    """One of `TASK_TYPES`."""
    target: str
    """The goal's object type (``apple``)."""
    destination: str | None
    """The goal's receptacle type (``fridge``); None for ``look_at_obj``."""
    receptacles: tuple[str, ...]
    """Receptacle names (``cabinet 3``), in the order the opening description lists them."""
    locations: tuple[int, ...]
    """ALFWorld's ``loc N`` of each receptacle (``You arrive at loc N.``), same order."""
    placement: tuple[tuple[str, str], ...]
    """(object name, receptacle name) for every object at the start, lamp included."""
    source: str | None = None
    """`LEVEL_TYPES` only: the receptacle the goal names the object in (``countertop 2``);
    ``destination`` is then a receptacle name too (``fridge 1``), not a type."""

    @property
    def goal(self) -> str:
        if self.task_type in LEVEL_TYPES:
            obj = next(o for o, _ in self.placement if kind_of(o) == self.target)
            take = f"take the {obj} from the {self.source}"
            if self.task_type == "take":
                return take
            return f"{take}, then put it in/on the {self.destination}"
        return goal_text(self.task_type, self.target, self.destination)


def goal_text(task_type: str, target: str, destination: str | None) -> str:
    """ALFWorld's goal sentence (the text after ``Your task is to: ``)."""
    if task_type == "look_at_obj":
        return f"look at {target} under the {LAMP}"
    if task_type == "pick_two_obj":
        return f"put two {target} in {destination}"
    state = {"clean": "clean ", "hot": "hot ", "cool": "cool "}.get(STATE.get(task_type, ""), "")
    return f"put a {state}{target} in {destination}"


def kind_of(name: str) -> str:
    """``apple 1`` -> ``apple``."""
    return name.rsplit(" ", 1)[0]


def _can(kind: ObjectKind, task_type: str) -> bool:
    flag = {"pick_clean_then_place": "clean", "pick_heat_then_place": "heat"}
    flag |= {"pick_cool_then_place": "cool", "look_at_obj": "look"}
    return getattr(kind, flag[task_type]) if task_type in flag else True


def _rooms_for(task_type: str) -> list[str]:
    if task_type == "look_at_obj":
        return sorted(LAMP_ON)
    need = APPLIANCE.get(task_type)
    return [room for room, spec in ROOMS.items() if need is None or need in [s[0] for s in spec]]


def receptacles_in(room: str, rng: random.Random) -> list[str]:
    """A draw of ``room``'s receptacle names (``cabinet 1 .. cabinet k`` per type)."""
    receps: list[str] = []
    for rtype, low, high in ROOMS[room]:
        receps += [f"{rtype} {k}" for k in range(1, rng.randint(low, high) + 1)]
    return receps


def generate(index: int, task_type: str, seed: int = 0, salt: str = "") -> Scene:
    """The scene of instance ``index`` with a goal of ``task_type``; pure in its arguments.

    ``salt`` draws another scene for the same arguments (a split's redraws)."""
    rng = random.Random(f"alfworld:{seed}:{index}:{task_type}{salt}")
    room = rng.choice(_rooms_for(task_type))
    receps = receptacles_in(room, rng)
    present = {kind_of(r) for r in receps}
    avoid = {APPLIANCE.get(task_type, "")}
    choices = []
    for name, kind in sorted(OBJECTS.items()):
        if room not in kind.rooms or not _can(kind, task_type):
            continue
        targets = [t for t in kind.fits if t in present and t not in avoid]
        if task_type == "look_at_obj":
            targets = [None]
        for dest in targets:
            sources = [r for r in receps if kind_of(r) in kind.fits and kind_of(r) != dest]
            if sources:
                choices.append((name, dest, sources))
    target, dest, sources = rng.choice(choices)
    counts: dict[str, int] = {}
    placement: list[tuple[str, str]] = []

    def place(kind: str, where: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        placement.append((f"{kind} {counts[kind]}", where))

    wanted = 2 if task_type == "pick_two_obj" else 1
    for _ in range(wanted + rng.randint(0, 1)):
        place(target, rng.choice(sources))
    if task_type == "look_at_obj":
        stands = [r for r in receps if kind_of(r) in LAMP_ON[room]]
        place(LAMP, rng.choice(stands))
    others = [n for n, k in sorted(OBJECTS.items()) if room in k.rooms and n != target]
    for _ in range(rng.randint(6, 12)):
        kind = rng.choice(others)
        spots = [r for r in receps if kind_of(r) in OBJECTS[kind].fits]
        if spots:
            place(kind, rng.choice(spots))
    rng.shuffle(receps)
    locations = rng.sample(range(1, len(receps) + 20), len(receps))
    return Scene(
        index=index,
        room=room,
        task_type=task_type,
        target=target,
        destination=dest,
        receptacles=tuple(receps),
        locations=tuple(locations),
        placement=tuple(placement),
    )


def solution(scene: Scene) -> list[str]:
    """A command sequence that reaches the scene's goal (from the start state)."""
    where = dict(scene.placement)
    targets = [o for o, _ in scene.placement if kind_of(o) == scene.target]
    commands: list[str] = []
    opened: set[str] = set()
    here = [""]

    def go(recep: str) -> None:
        if here[0] != recep:
            commands.append(f"go to {recep}")
            here[0] = recep
        if kind_of(recep) in OPENABLE and recep not in opened:
            opened.add(recep)
            commands.append(f"open {recep}")

    def fetch(obj: str) -> None:
        go(where[obj])
        commands.append(f"take {obj} from {where[obj]}")

    if scene.task_type == "take":
        fetch(targets[0])
        return commands
    if scene.task_type == "take_and_place":
        assert scene.destination is not None
        fetch(targets[0])
        go(scene.destination)
        commands.append(f"put {targets[0]} in/on {scene.destination}")
        return commands
    if scene.task_type == "look_at_obj":
        fetch(targets[0])
        lamp = next(o for o, _ in scene.placement if kind_of(o) == LAMP)
        go(where[lamp])
        commands.append(f"use {lamp}")
        return commands
    assert scene.destination is not None
    dest = next(r for r in scene.receptacles if kind_of(r) == scene.destination)
    for obj in targets[: 2 if scene.task_type == "pick_two_obj" else 1]:
        fetch(obj)
        if scene.task_type in APPLIANCE:
            tool = next(r for r in scene.receptacles if kind_of(r) == APPLIANCE[scene.task_type])
            verb = {"clean": "clean", "hot": "heat", "cool": "cool"}[STATE[scene.task_type]]
            go(tool)
            commands.append(f"{verb} {obj} with {tool}")
        go(dest)
        commands.append(f"put {obj} in/on {dest}")
    return commands
