"""The ALFWorld-style text simulator: one mutable `World` per session, built from a `Scene`.

Commands are ALFWorld's (as its TextWorld games accept them) and observations
use its wording::

    look | inventory | go to R | open R | close R | take O from R | put O in/on R
    toggle O | use O | heat O with R | cool O with R | clean O with R | examine O/R

The rules, as in ALFWorld:

- the agent is at one receptacle at a time (``go to``); ``open``, ``close``,
  ``take``, ``put``, ``heat``, ``cool``, ``clean``, ``use`` and ``examine`` act
  only on the receptacle it is at, or on objects there or in its hand;
- a closed receptacle (fridge, cabinet, drawer, microwave, safe) hides its
  contents until opened; nothing can be taken from it or put in it;
- the agent holds at most one object; ``put`` needs a receptacle the object
  fits in (`ObjectKind.fits`);
- ``heat`` needs the object in hand and the agent at a microwave, ``cool`` at
  a fridge, ``clean`` at a sinkbasin, and an object type that allows it;
- a desklamp cannot be taken; ``use`` turns it on, ``toggle`` flips it.

Anything else, or a command whose preconditions fail, observes
``Nothing happens.`` and changes nothing (`Outcome.valid` is False).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agentrl.environments._alfworld_scene import (
    LAMP,
    OBJECTS,
    OPENABLE,
    STATE,
    Scene,
    kind_of,
)

__all__ = ["NOTHING", "Outcome", "World", "list_phrase"]

NOTHING = "Nothing happens."
"""ALFWorld's observation for a command that does not apply."""

_NAME = r"([a-z]+ \d+)"
_COMMANDS: list[tuple[str, re.Pattern[str]]] = [
    (verb, re.compile(pattern))
    for verb, pattern in [
        ("look", r"look"),
        ("inventory", r"(?:inventory|inv|i)"),
        ("goto", rf"go to {_NAME}"),
        ("open", rf"open {_NAME}"),
        ("close", rf"close {_NAME}"),
        ("take", rf"take {_NAME} from {_NAME}"),
        ("put", rf"put {_NAME} (?:in/on|in|on) {_NAME}"),
        ("toggle", rf"toggle {_NAME}"),
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


def normalize(command: str) -> str:
    """Lower case, single spaces, no trailing full stop."""
    return " ".join(command.lower().strip().rstrip(".").split())


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
        """The opening observation: the room and the goal."""
        seen = list_phrase(list(self.scene.receptacles))
        return (
            f"You are in the middle of a room. Looking quickly around you, you see {seen}.\n\n"
            f"Your task is to: {self.scene.goal}."
        )

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
        """Apply one command; never raises for bad input."""
        text = normalize(command)
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
            return "You are in the middle of a room. Looking quickly around you, you see nothing."
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

    def _toggle(self, lamp: str) -> str | None:
        if kind_of(lamp) != LAMP or not self._here(lamp):
            return None
        if lamp in self.lit:
            self.lit.discard(lamp)
            return f"You turn off the {lamp}."
        self.lit.add(lamp)
        return f"You turn on the {lamp}."

    def _examine(self, name: str) -> str | None:
        if self._is_recep(name):
            return self.describe(name) if name == self.at else None
        if name not in self.states or not self._here(name):
            return None
        if kind_of(name) == LAMP:
            return f"The {name} is {'on' if name in self.lit else 'off'}."
        states = sorted(self.states[name])
        if not states:
            return f"There's nothing special about {name}."
        return f"This is a {' and '.join(states)} {name}."
