"""The ``alfworld`` task: household chores in an ALFWorld-style text world.

One tool, ``take_action(action)``, takes an ALFWorld text command (``go to
countertop 1``, ``take apple 1 from countertop 1``, ``heat apple 1 with
microwave 1``, ...). The conversation is AgentBench's
(`agentrl.environments.tasks.alfworld.protocol`): its system instruction and tool;
the first user message ``Here is your task. `` + the room and the goal; every
reply the observation (``On the countertop 1, you see a apple 1, and a knife
2.``) followed by `` AVAILABLE ACTIONS: `` and the admissible commands of the
new state, one a line. The action text is lower-cased, cut at its first newline
and, when it is not admissible, replaced by the admissible command with the
highest BLEU against it (above 0.01; AgentBench's ``process_action``), one
action per turn. A command that does not apply observes ``Nothing happens.``:
it is counted (``env/invalid_commands``), not an ending.

Goals are ALFWorld's six task types: ``put a X in Y`` (pick_and_place),
``put a clean/hot/cool X in Y`` (clean with a sinkbasin, heat with a microwave,
cool with a fridge), ``look at X under the desklamp`` (hold X where a lit
desklamp stands) and ``put two X in Y`` (two distinct X in one Y). The goal
holding after an action ends the episode: ``completed``, reward 1.0.

Bad calls follow AgentBench's ``src/server/tasks/alfworld/task.py``: a message
without a tool call is answered by the user message `NO_TOOL_CALL` and the
episode goes on; a call whose arguments are not a JSON object with a string
first value gets the user message `NO_VALID_CALL`. Only the first call of a
message is played, whatever its name (AgentBench reads the first argument's
value and never checks the function name); the others are dropped unanswered.
Every assistant message counts a turn. Endings, reward 0.0: the turn limit
without the goal -> ``task_limit_reached``; the same action text three times in
a row after more than three played actions -> ``agent_invalid_action``
(AgentBench's repeat rule). Counted: ``env/bad_calls``, ``env/matched_actions``
(actions the BLEU match changed).

Levels and split: `agentrl.environments.tasks.alfworld.levels` (option ``levels``,
default the full task only; option ``split``, default ``train``). The turn limit
is ``max_turns`` when given, else the level's (`LEVEL_TURNS`: 5, 8, and
AgentBench's 20 for the full task).

Backends (option ``backend``):

- ``generated`` (default): ``num_instances`` scenes from a deterministic
  generator (`agentrl.environments.tasks.alfworld.scene`), a pure function of
  ``(split, seed, index)``; at the full level task types cycle over
  ``task_types``, so every type gets an equal share. Simulated by
  `tasks.alfworld.world.World`.
- ``alfworld``: the real ALFWorld games of an AgentBench data file (``data``,
  e.g. AgentBench's ``data/alfworld/dev.json``) played through TextWorld
  (`agentrl.environments.tasks.alfworld.real`); needs the packages and
  ``ALFWORLD_DATA``, and says what is missing otherwise. Full level only; the
  split is a seeded hash of each game file's path.

Metrics on the finishing step: ``env/turns``, ``env/actions``,
``env/invalid_commands``, ``env/matched_actions``, ``env/bad_calls``,
``env/level``, ``env/success`` and ``env/success_<task type>``.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.environments._protocol import InfraError, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.environments.tasks.alfworld.agents import SCRIPTS
from agentrl.environments.tasks.alfworld.levels import FULL, LEVEL_TURNS, LEVELS, scene_for
from agentrl.environments.tasks.alfworld.protocol import (
    LEVEL_PROMPT,
    NO_TOOL_CALL,
    NO_VALID_CALL,
    REPEATS,
    SYSTEM_PROMPT,
    TOOLS,
    available_actions,
    match_action,
    observation,
    opening,
)
from agentrl.environments.tasks.alfworld.real import RealGames
from agentrl.environments.tasks.alfworld.scene import (
    LAMP,
    OBJECTS,
    ROOMS,
    TASK_TYPES,
    Scene,
    solution,
)
from agentrl.environments.tasks.alfworld.world import Outcome, World
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.levels import CycledLevels
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.messages import ChatMessage, ToolCall

__all__ = [
    "CHECK_AGENTS",
    "NO_TOOL_CALL",
    "NO_VALID_CALL",
    "SYSTEM_PROMPT",
    "TOOLS",
    "AlfworldTask",
]


BACKENDS = ("generated", "alfworld")


class Game(Protocol):
    """One playing episode: the simulator's `World` or a `RealGame`."""

    def intro(self) -> str: ...
    def admissible(self) -> list[str]: ...
    def step(self, command: str) -> Outcome: ...
    def won(self) -> bool: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class _Session:
    game: Game
    task_type: str
    level: int
    max_turns: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    actions: int = 0
    invalid: int = 0
    matched: int = 0
    bad_calls: int = 0
    played: list[str] = field(default_factory=list)
    """The raw action text of every played call (AgentBench's repeat rule)."""
    done: bool = False


class AlfworldTask(CycledLevels):
    """The ALFWorld environment (registered as ``alfworld``); see the module doc."""

    def __init__(
        self,
        *,
        backend: str = "generated",
        num_instances: int = 60,
        seed: int = 0,
        task_types: list[str] | tuple[str, ...] | None = None,
        max_turns: int | None = None,
        data: str | None = None,
        alfworld_data: str | None = None,
        split: str = "train",
        levels: list[int] | tuple[int, ...] | None = None,
    ) -> None:
        types = tuple(task_types) if task_types is not None else TASK_TYPES
        unknown = [t for t in types if t not in TASK_TYPES]
        if unknown or not types:
            raise ValueError(
                f"alfworld: task_types must be a non-empty subset of {', '.join(TASK_TYPES)};"
                f" unknown: {unknown}"
            )
        if max_turns is not None and max_turns < 1:
            raise ValueError("alfworld: max_turns must be >= 1")
        if backend not in BACKENDS:
            raise ValueError(f"alfworld: backend must be one of {BACKENDS}, got {backend!r}")
        self._levels = tuple(levels) if levels is not None else (FULL,)
        if not self._levels or any(lv not in LEVELS for lv in self._levels):
            raise ValueError(f"alfworld: levels must be a non-empty list of {LEVELS}")
        self._types = types
        self._max_turns = max_turns
        self._task, self._level_turns = "alfworld", LEVEL_TURNS
        self._seed = seed
        self._split = check_split(split, "alfworld")
        self._real: RealGames | None = None
        self._games: list[int] = []
        """Real backend: the data file's game numbers in the chosen split."""
        if backend == "alfworld":
            if data is None:
                raise ValueError("alfworld: backend 'alfworld' needs data=<AgentBench dev.json>")
            if self._levels != (FULL,):
                raise ValueError(f"alfworld: the 'alfworld' backend plays level {FULL} only")
            self._real = RealGames(data, alfworld_data=alfworld_data, task_types=types)
            numbers = range(len(self._real))
            paths = [self._real.ref(n).path for n in numbers]
            self._games = split_items(list(numbers), paths, self._split, seed)
            self._count = len(self._games)
        else:
            if data is not None or alfworld_data is not None:
                raise ValueError(
                    "alfworld: data= names real ALFWorld games, which the 'generated' backend "
                    "cannot play; use backend='alfworld' (needs the game files, docs/tasks.md), "
                    "or leave data out for generated scenes"
                )
            if num_instances < 1:
                raise ValueError("alfworld: num_instances must be >= 1")
            self._count = num_instances

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    def scene(self, index: int) -> Scene:
        """The generated scene of instance ``index`` (generated backend only)."""
        level = self.level(index)
        if self._real is not None:
            raise ValueError("alfworld: the 'alfworld' backend has no generated scenes")
        task_type = self._types[(index // len(self._levels)) % len(self._types)]
        return scene_for(level, index, self._split, self._seed, task_type)

    def task_type(self, index: int) -> str:
        self._check(index)
        if self._real is not None:
            return self._real.ref(self._games[index]).task_type
        return self.scene(index).task_type

    def solution(self, index: int) -> list[str]:
        """Commands that reach instance ``index``'s goal (the planner's or the game's own)."""
        self._check(index)
        if self._real is not None:
            return self._real.solution(self._games[index])
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
            return self._real.describe(self._games[index])
        scene = self.scene(index)
        return f"[level {self.level(index)}, {scene.task_type}, {scene.room}] {scene.goal!r}"

    def start(self, index: int) -> Start:
        level = self.level(index)
        if self._real is not None:
            try:
                game: Game = self._real.open(self._games[index])
            except Exception as exc:  # the game engine broke: retried elsewhere
                raise InfraError(f"alfworld: cannot start {self.describe(index)}: {exc}") from exc
        else:
            game = World(self.scene(index))
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT if level == FULL else LEVEL_PROMPT),
            ChatMessage(role="user", content=opening(game.intro(), game.admissible())),
        ]
        session = _Session(game, self.task_type(index), level, self.turn_limit(level))
        return Start(session=session, messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        with session.lock:
            begin_turn("alfworld", session)
            replies: list[ChatMessage] = []
            if not message.tool_calls:
                replies.append(no_tool_call(session, NO_TOOL_CALL))
            else:
                call = message.tool_calls[0]
                action = _first_argument(call)
                if action is None:
                    session.bad_calls += 1
                    replies.append(ChatMessage(role="user", content=NO_VALID_CALL))
                else:
                    command = match_action(action, session.game.admissible())
                    outcome = self._play(session, command)
                    session.actions += 1
                    session.invalid += not outcome.valid
                    session.matched += command != action.strip().lower().split("\n")[0]
                    session.played.append(action)
                    text = observation(outcome.observation)
                    actions = available_actions(session.game.admissible())
                    replies.append(tool_reply(call, text + actions))
                    recent = session.played[-REPEATS:]
                    if len(session.played) > REPEATS and len(set(recent)) == 1:
                        return self._end(
                            session, Status.AGENT_INVALID_ACTION, "repeated action", replies
                        )
                    if session.game.won():
                        return self._end(session, Status.COMPLETED, "goal", replies, success=True)
            return after_turn(session, replies, self._end)

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
        session.game.close()
        metrics = {
            "env/actions": float(session.actions),
            "env/invalid_commands": float(session.invalid),
            "env/matched_actions": float(session.matched),
            f"env/success_{session.task_type}": float(success),
        }
        return end_episode(
            "alfworld",
            session,
            status,
            why,
            replies,
            level=session.level,
            success=success,
            metrics=metrics,
        )


def _first_argument(call: ToolCall) -> str | None:
    """The action AgentBench reads from a call: the value of its first argument, whatever the
    function's name (alfworld/task.py:166-173); None when that is not a string."""
    args = call_arguments(call)
    if not args:
        return None
    action = next(iter(args.values()))
    return action if isinstance(action, str) else None


CHECK_AGENTS: dict[str, Any] = SCRIPTS
"""Scripted agents for `agentrl-env check` (see agentrl.environments._check)."""
