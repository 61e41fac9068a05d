"""The ``alfworld`` task: household chores in an ALFWorld-style text world.

One tool, ``take_action(action)``, takes an ALFWorld text command (``go to
countertop 1``, ``take apple 1 from countertop 1``, ``heat apple 1 with
microwave 1``, ...); its reply is the game's observation in ALFWorld's wording
(``You arrive at loc 5. On the countertop 1, you see a apple 1, and a knife 2.``).
A command that does not apply observes ``Nothing happens.``: it is counted
(``env/invalid_commands``), not an ending. Several calls in one message are
played in order.

Goals are ALFWorld's six task types: ``put a X in Y`` (pick_and_place),
``put a clean/hot/cool X in Y`` (clean with a sinkbasin, heat with a microwave,
cool with a fridge), ``look at X under the desklamp`` (hold X where a lit
desklamp stands) and ``put two X in Y`` (two distinct X in one Y). The goal
holding after an action ends the episode: ``completed``, reward 1.0.

Other endings (reward 0.0): no tool call, an unknown tool or an ``action``
that is not a non-empty string -> ``agent_invalid_action``; ``max_turns``
assistant messages without reaching the goal -> ``task_limit_reached``.

Backends (option ``backend``):

- ``generated`` (default): ``num_instances`` scenes from a deterministic
  generator (`agentrl.environments._alfworld_scene`), a pure function of
  ``(seed, index)``; task types cycle with the index over ``task_types``,
  so every type gets an equal share. Simulated by `_alfworld_world.World`.
- ``alfworld``: the real ALFWorld games of an AgentBench data file (``data``,
  e.g. AgentBench's ``data/alfworld/dev.json``) played through TextWorld
  (`agentrl.environments._alfworld_real`); needs the packages and
  ``ALFWORLD_DATA``, and says what is missing otherwise.

Metrics on the finishing step: ``env/turns``, ``env/actions``,
``env/invalid_commands``, ``env/success`` and ``env/success_<task type>``.
"""

from __future__ import annotations

import copy
import json
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from agentrl.environments._alfworld_real import RealGames
from agentrl.environments._alfworld_scene import (
    LAMP,
    OBJECTS,
    ROOMS,
    TASK_TYPES,
    Scene,
    generate,
    kind_of,
    solution,
)
from agentrl.environments._alfworld_world import Outcome, World
from agentrl.environments._protocol import InfraError, SessionClosed, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "SYSTEM_PROMPT", "TOOLS", "AlfworldTask"]

log = structlog.get_logger(__name__)

SYSTEM_PROMPT = """\
Interact with a household to solve a task. Imagine you are an intelligent agent in a \
household environment and your target is to perform actions to complete the task goal. At \
the beginning of your interactions, you will be given the detailed description of the \
current environment and your goal to accomplish.
Act by calling the take_action tool with one command at a time. The commands are:
  look:                             look around your current location
  inventory:                        check what you are carrying
  go to [receptacle]:               move to a receptacle
  open [receptacle]:                open a receptacle
  close [receptacle]:               close a receptacle
  take [object] from [receptacle]:  take an object from the receptacle you are at
  put [object] in/on [receptacle]:  put the object you carry in or on the receptacle you are at
  toggle [object]:                  switch an object (a lamp) on or off
  use [object]:                     use an object (turn a lamp on)
  heat [object] with [microwave]:   heat the object you carry with the microwave you are at
  cool [object] with [fridge]:      cool the object you carry with the fridge you are at
  clean [object] with [sinkbasin]:  clean the object you carry with the sinkbasin you are at
  examine [something]:              examine a receptacle or an object
Objects and receptacles are named with numbers, as in "apple 1" or "countertop 2". You can \
carry one object at a time, and you must go to a receptacle before acting on it or on what \
it holds; closed receptacles must be opened to see or reach their contents. After each \
action the environment gives you feedback; if it says "Nothing happens.", the action was \
invalid and you should try something else."""

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "take_action",
            "description": "Perform one household command and see what happens.",
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {
                        "type": "string",
                        "description": "The command, e.g. 'go to countertop 1'.",
                        "examples": ["go to fridge 1", "take apple 1 from countertop 1"],
                    }
                },
                "required": ["action"],
            },
        },
    }
]

BACKENDS = ("generated", "alfworld")


class Game(Protocol):
    """One playing episode: the simulator's `World` or a `RealGame`."""

    def intro(self) -> str: ...
    def step(self, command: str) -> Outcome: ...
    def won(self) -> bool: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class _Session:
    game: Game
    task_type: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    actions: int = 0
    invalid: int = 0
    done: bool = False


class AlfworldTask:
    """The ALFWorld environment (registered as ``alfworld``); see the module doc."""

    def __init__(
        self,
        *,
        backend: str = "generated",
        num_instances: int = 60,
        seed: int = 0,
        task_types: list[str] | tuple[str, ...] | None = None,
        max_turns: int = 30,
        data: str | None = None,
        alfworld_data: str | None = None,
    ) -> None:
        types = tuple(task_types) if task_types is not None else TASK_TYPES
        unknown = [t for t in types if t not in TASK_TYPES]
        if unknown or not types:
            raise ValueError(
                f"alfworld: task_types must be a non-empty subset of {', '.join(TASK_TYPES)};"
                f" unknown: {unknown}"
            )
        if max_turns < 1:
            raise ValueError("alfworld: max_turns must be >= 1")
        if backend not in BACKENDS:
            raise ValueError(f"alfworld: backend must be one of {BACKENDS}, got {backend!r}")
        self._types = types
        self._max_turns = max_turns
        self._seed = seed
        self._real: RealGames | None = None
        if backend == "alfworld":
            if data is None:
                raise ValueError("alfworld: backend 'alfworld' needs data=<AgentBench dev.json>")
            self._real = RealGames(data, alfworld_data=alfworld_data, task_types=types)
            self._count = len(self._real)
        else:
            if num_instances < 1:
                raise ValueError("alfworld: num_instances must be >= 1")
            self._count = num_instances

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def num_instances(self) -> int:
        return self._count

    @property
    def max_turns(self) -> int:
        return self._max_turns

    def _check(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise IndexError(f"alfworld: index {index} not in [0, {self._count})")

    def scene(self, index: int) -> Scene:
        """The generated scene of instance ``index`` (generated backend only)."""
        self._check(index)
        if self._real is not None:
            raise ValueError("alfworld: the 'alfworld' backend has no generated scenes")
        return generate(index, self._types[index % len(self._types)], self._seed)

    def task_type(self, index: int) -> str:
        self._check(index)
        if self._real is not None:
            return self._real.ref(index).task_type
        return self._types[index % len(self._types)]

    def solution(self, index: int) -> list[str]:
        """Commands that reach instance ``index``'s goal (the planner's or the game's own)."""
        self._check(index)
        if self._real is not None:
            return self._real.solution(index)
        return solution(self.scene(index))

    def vocabulary(self, index: int) -> tuple[list[str], list[str]]:
        """(receptacle names, object names) a command may mention, for the random agent."""
        if self._real is None:
            scene = self.scene(index)
            return list(scene.receptacles), [obj for obj, _ in scene.placement]
        receps = sorted({f"{r} 1" for spec in ROOMS.values() for r, _, _ in spec})
        return receps, [f"{o} 1" for o in sorted(OBJECTS)] + [f"{LAMP} 1"]

    def describe(self, index: int) -> str:
        if self._real is not None:
            return self._real.describe(index)
        scene = self.scene(index)
        return f"[{scene.task_type}, {scene.room}] {scene.goal!r}"

    def start(self, index: int) -> Start:
        self._check(index)
        if self._real is not None:
            try:
                game: Game = self._real.open(index)
            except Exception as exc:  # the game engine broke: retried elsewhere
                raise InfraError(f"alfworld: cannot start {self.describe(index)}: {exc}") from exc
        else:
            game = World(self.scene(index))
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=game.intro()),
        ]
        return Start(session=_Session(game, self.task_type(index)), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        with session.lock:
            if session.done:
                raise SessionClosed("alfworld: interact on a session that has ended")
            session.turns += 1
            if not message.tool_calls:
                return self._end(session, Status.AGENT_INVALID_ACTION, "no tool call")
            replies: list[ChatMessage] = []
            for call in message.tool_calls:
                if call.name != "take_action":
                    return self._end(session, Status.AGENT_INVALID_ACTION, "unknown tool", replies)
                args = call_arguments(call)
                action = args.get("action") if args is not None else None
                if not isinstance(action, str) or not action.strip():
                    return self._end(session, Status.AGENT_INVALID_ACTION, "bad args", replies)
                outcome = self._play(session, action)
                session.actions += 1
                session.invalid += not outcome.valid
                replies.append(tool_reply(call, outcome.observation))
                if session.game.won():
                    return self._end(session, Status.COMPLETED, "goal", replies, success=True)
            if session.turns >= self._max_turns:
                return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
            return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False)

    def cancel(self, session: _Session) -> None:
        with session.lock:
            if not session.done:
                session.done = True
                session.game.close()

    def _play(self, session: _Session, action: str) -> Outcome:
        if self._real is None:
            return session.game.step(action)
        try:
            return session.game.step(action)
        except Exception as exc:  # the game engine broke, not the model
            session.done = True
            try:
                session.game.close()
            finally:
                raise InfraError(f"alfworld: the game failed on {action!r}: {exc}") from exc

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        success: bool = False,
    ) -> Step:
        session.done = True
        session.game.close()
        metrics = {
            "env/turns": float(session.turns),
            "env/actions": float(session.actions),
            "env/invalid_commands": float(session.invalid),
            "env/success": float(success),
            f"env/success_{session.task_type}": float(success),
        }
        log.debug("alfworld episode ended", status=status.value, why=why, **metrics)
        return Step.end(status, 1.0 if success else 0.0, metrics, replies)


# --- scripted agents for `agentrl-env check` ------------------------------------------


def _action(command: str, n: int) -> ToolCall:
    return ToolCall(id=f"call_{n}", name="take_action", arguments=json.dumps({"action": command}))


def _oracle(env: AlfworldTask, index: int, rng: random.Random):
    for n, command in enumerate(env.solution(index)):
        yield _action(command, n)


def random_command(receps: list[str], objects: list[str], rng: random.Random) -> str:
    """A well-formed command naming things of the scene, chosen without a plan."""
    r, o = rng.choice(receps), rng.choice(objects)
    appliance = rng.choice([r, *[x for x in receps if kind_of(x) in ("microwave", "fridge")]])
    return rng.choice(
        [
            "look",
            "inventory",
            f"go to {r}",
            f"open {r}",
            f"close {r}",
            f"take {o} from {r}",
            f"put {o} in/on {r}",
            f"heat {o} with {appliance}",
            f"cool {o} with {appliance}",
            f"clean {o} with {r}",
            f"use {o}",
            f"toggle {o}",
            f"examine {rng.choice([r, o])}",
        ]
    )


def _random(env: AlfworldTask, index: int, rng: random.Random):
    receps, objects = env.vocabulary(index)
    for n in range(min(env.max_turns, 50)):
        yield _action(random_command(receps, objects, rng), n)


CHECK_AGENTS: dict[str, Any] = {"oracle": _oracle, "random": _random}
"""Scripted agents for `agentrl-env check` (see agentrl.environments._check)."""
