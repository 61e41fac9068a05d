"""The ALFWorld-style text simulator: one mutable `World` per session, built from a `Scene`.

It plays like ALFWorld's TextWorld games (the PDDL domain and grammar of
ALFWorld's 0.2.2 game files, which AgentBench plays): `World.admissible` lists
the commands the current state allows, sorted and in ALFWorld's wording::

    look | inventory | go to R | examine R | open R | close R | take O from R
    put O in/on R | heat O with R | cool O with R | clean O with R | use O | examine O

and `World.step` plays exactly those (surrounding spaces aside); any other
text observes ``Nothing happens.`` and changes nothing, as TextWorld does. The
rules, as in ALFWorld:

- the agent is at one receptacle at a time (``go to`` any other one); ``open``,
  ``close``, ``take``, ``put``, ``heat``, ``cool``, ``clean``, ``use`` and
  ``examine`` act only on the receptacle it is at, or on objects there or in its
  hand (``examine O`` only for the object in hand);
- a closed receptacle (fridge, cabinet, drawer, microwave, safe) hides its
  contents until opened; nothing can be taken from it or put in it;
- the agent holds at most one object; ``put`` needs a receptacle the object
  fits in (`ObjectKind.fits`);
- ``heat`` needs the object in hand and the agent at a microwave (open or
  closed), ``cool`` at a fridge, ``clean`` at a sinkbasin, and an object type
  that allows it;
- a desklamp cannot be taken; ``use`` turns it on (ALFWorld's toggle command).

Observations are the engine's own text, ``You arrive at loc N. `` included (the
task removes that prefix as AgentBench does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agentrl.environments.tasks.alfworld.scene import (
    LAMP,
    OBJECTS,
    OPENABLE,
    STATE,
    Scene,
    kind_of,
)

__all__ = ["BANNER", "NOTHING", "Outcome", "World", "list_phrase", "room_order"]

NOTHING = "Nothing happens."
"""ALFWorld's observation for a command that does not apply."""

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
"""The first paragraph of every ALFWorld game's opening text."""

_NAME = r"([a-z]+ \d+)"
_COMMANDS: list[tuple[str, re.Pattern[str]]] = [
    (verb, re.compile(pattern))
    for verb, pattern in [
        ("look", r"look"),
        ("inventory", r"inventory"),
        ("goto", rf"go to {_NAME}"),
        ("open", rf"open {_NAME}"),
        ("close", rf"close {_NAME}"),
        ("take", rf"take {_NAME} from {_NAME}"),
        ("put", rf"put {_NAME} in/on {_NAME}"),
        ("use", rf"use {_NAME}"),
        ("heat", rf"heat {_NAME} with {_NAME}"),
        ("cool", rf"cool {_NAME} with {_NAME}"),
        ("clean", rf"clean {_NAME} with {_NAME}"),
        ("examine", rf"examine {_NAME}"),
    ]
]
_APPLIANCE_OF = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
_STATE_OF = {"heat": "hot", "cool": "cool", "clean": "clean"}
_OPPOSITE = {"hot": "cool", "cool": "hot"}
_EXAMINED = {
    ("clean", "hot"): "This is a hot and clean {}.",
    ("clean", "cool"): "This is a cool and clean {}.",
    ("hot",): "This is a hot {}.",
    ("clean",): "This is a clean {}.",
    ("cool",): "This is a cold {}.",
}
"""``examine`` of an object in hand, by its sorted states (ALFWorld's grammar)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one command did."""

    observation: str
    valid: bool
    """False when the command did not apply (the observation is ``Nothing happens.``)."""


def list_phrase(names: list[str]) -> str:
    """ALFWorld's listing: ``nothing``, ``a apple 1``, ``a apple 1, and a knife 2``."""
    if not names:
        return "nothing"
    items = [f"a {n}" for n in names]
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def room_order(receptacles: tuple[str, ...] | list[str]) -> list[str]:
    """ALFWorld's listing order of a room: by type, the numbers of a type descending
    (``cabinet 2, cabinet 1, countertop 1``)."""
    return sorted(receptacles, key=lambda r: (kind_of(r), -int(r.rsplit(" ", 1)[1])))


@dataclass
class World:
    """The mutable state of one episode on `scene`."""

    scene: Scene
    at: str | None = None
    """The receptacle the agent is at (None: the middle of the room, at the start)."""
    holding: str | None = None
    opened: set[str] = field(default_factory=set)
    inside: dict[str, str] = field(default_factory=dict)
    """Object name -> the receptacle it is in (absent while held)."""
    states: dict[str, set[str]] = field(default_factory=dict)
    """Object name -> its states among ``hot``, ``cool``, ``clean``."""
    lit: set[str] = field(default_factory=set)
    """Lamps that are on."""

    def __post_init__(self) -> None:
        self.inside = dict(self.scene.placement)
        self.states = {obj: set() for obj in self.inside}

    # --- descriptions ---------------------------------------------------------------

    def intro(self) -> str:
        """The game's opening text: the banner, the room, the goal (paragraphs)."""
        return f"{BANNER}\n\n{self._look_around()}\n\nYour task is to: {self.scene.goal}."

    def _look_around(self) -> str:
        seen = list_phrase(room_order(self.scene.receptacles))
        return f"You are in the middle of a room. Looking quickly around you, you see {seen}."

    def admissible(self) -> list[str]:
        """The commands the current state allows, sorted (TextWorld's admissible commands)."""
        commands = {"inventory", "look"}
        commands |= {f"go to {r}" for r in self.scene.receptacles if r != self.at}
        here = self.at
        if here is None:
            return sorted(commands)
        commands.add(f"examine {here}")
        if kind_of(here) in OPENABLE:
            commands.add(f"{'close' if here in self.opened else 'open'} {here}")
        inside = self.contents(here)
        commands |= {f"use {obj}" for obj in inside if kind_of(obj) == LAMP}
        held = self.holding
        if held is None:
            if self.visible(here):
                commands |= {f"take {obj} from {here}" for obj in inside if kind_of(obj) != LAMP}
            return sorted(commands)
        commands.add(f"examine {held}")
        kind = OBJECTS[kind_of(held)]
        if self.visible(here) and kind_of(here) in kind.fits:
            commands.add(f"put {held} in/on {here}")
        for verb, appliance in _APPLIANCE_OF.items():
            if kind_of(here) == appliance and getattr(kind, verb):
                commands.add(f"{verb} {held} with {here}")
        return sorted(commands)

    def contents(self, recep: str) -> list[str]:
        return [obj for obj, where in self.inside.items() if where == recep]

    def visible(self, recep: str) -> bool:
        return kind_of(recep) not in OPENABLE or recep in self.opened

    def describe(self, recep: str) -> str:
        seen = list_phrase(self.contents(recep))
        if kind_of(recep) not in OPENABLE:
            return f"On the {recep}, you see {seen}."
        if recep not in self.opened:
            return f"The {recep} is closed."
        return f"The {recep} is open. In it, you see {seen}."

    def close(self) -> None:
        """End the episode: an in-memory world holds nothing to release (the `Game` surface)."""

    # --- the goal ---------------------------------------------------------------------

    def won(self) -> bool:
        """Whether the scene's goal holds now."""
        scene = self.scene
        if scene.task_type == "take":
            return self.holding is not None and kind_of(self.holding) == scene.target
        if scene.task_type == "take_and_place":
            return any(
                kind_of(obj) == scene.target and recep == scene.destination
                for obj, recep in self.inside.items()
            )
        if scene.task_type == "look_at_obj":
            return (
                self.holding is not None
                and kind_of(self.holding) == scene.target
                and any(self.inside.get(lamp) == self.at for lamp in self.lit)
            )
        need = STATE.get(scene.task_type)
        placed: dict[str, int] = {}
        for obj, recep in self.inside.items():
            if kind_of(obj) != scene.target or kind_of(recep) != scene.destination:
                continue
            if need is None or need in self.states[obj]:
                placed[recep] = placed.get(recep, 0) + 1
        wanted = 2 if scene.task_type == "pick_two_obj" else 1
        return any(n >= wanted for n in placed.values())

    # --- commands ---------------------------------------------------------------------

    def step(self, command: str) -> Outcome:
        """Apply one admissible command (`admissible`); anything else observes `NOTHING`.
        Never raises for bad input."""
        text = command.strip()
        if text not in self.admissible():
            return Outcome(NOTHING, False)
        for verb, pattern in _COMMANDS:
            match = pattern.fullmatch(text)
            if match:
                said = getattr(self, f"_{verb}")(*match.groups())
                return Outcome(said, True) if said is not None else Outcome(NOTHING, False)
        return Outcome(NOTHING, False)

    def _is_recep(self, name: str) -> bool:
        return name in self.scene.receptacles

    def _here(self, obj: str) -> bool:
        """The object is in the agent's hand or visible in the receptacle it is at."""
        if obj == self.holding:
            return True
        where = self.inside.get(obj)
        return where is not None and where == self.at and self.visible(where)

    def _look(self) -> str:
        if self.at is None:
            return self._look_around()
        return f"You are facing the {self.at}. Next to it, you see nothing."

    def _inventory(self) -> str:
        if self.holding is None:
            return "You are not carrying anything."
        return f"You are carrying: a {self.holding}."

    def _goto(self, recep: str) -> str | None:
        if not self._is_recep(recep) or recep == self.at:
            return None
        self.at = recep
        loc = self.scene.locations[self.scene.receptacles.index(recep)]
        return f"You arrive at loc {loc}. {self.describe(recep)}"

    def _open(self, recep: str) -> str | None:
        if recep != self.at or kind_of(recep) not in OPENABLE or recep in self.opened:
            return None
        self.opened.add(recep)
        return f"You open the {recep}. {self.describe(recep)}"

    def _close(self, recep: str) -> str | None:
        if recep != self.at or recep not in self.opened:
            return None
        self.opened.discard(recep)
        return f"You close the {recep}."

    def _take(self, obj: str, recep: str) -> str | None:
        if self.holding is not None or recep != self.at or kind_of(obj) == LAMP:
            return None
        if self.inside.get(obj) != recep or not self.visible(recep):
            return None
        del self.inside[obj]
        self.holding = obj
        return f"You pick up the {obj} from the {recep}."

    def _put(self, obj: str, recep: str) -> str | None:
        if obj != self.holding or recep != self.at or not self.visible(recep):
            return None
        if kind_of(recep) not in OBJECTS[kind_of(obj)].fits:
            return None
        self.inside[obj] = recep
        self.holding = None
        return f"You put the {obj} in/on the {recep}."

    def _change(self, verb: str, obj: str, recep: str) -> str | None:
        if obj != self.holding or recep != self.at or kind_of(recep) != _APPLIANCE_OF[verb]:
            return None
        if not getattr(OBJECTS[kind_of(obj)], verb):
            return None
        state = _STATE_OF[verb]
        self.states[obj].add(state)
        self.states[obj].discard(_OPPOSITE.get(state, ""))
        return f"You {verb} the {obj} using the {recep}."

    def _heat(self, obj: str, recep: str) -> str | None:
        return self._change("heat", obj, recep)

    def _cool(self, obj: str, recep: str) -> str | None:
        return self._change("cool", obj, recep)

    def _clean(self, obj: str, recep: str) -> str | None:
        return self._change("clean", obj, recep)

    def _use(self, lamp: str) -> str | None:
        if kind_of(lamp) != LAMP or not self._here(lamp):
            return None
        self.lit.add(lamp)
        return f"You turn on the {lamp}."

    def _examine(self, name: str) -> str | None:
        if self._is_recep(name):
            return self.describe(name) if name == self.at else None
        if name not in self.states or not self._here(name):
            return None
        template = _EXAMINED.get(tuple(sorted(self.states[name])))
        return template.format(name) if template else f"There's nothing special about {name}."
