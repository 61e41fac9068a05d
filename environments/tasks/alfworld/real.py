"""The real ALFWorld games behind the ``alfworld`` task (option ``backend: alfworld``).

Reads AgentBench's alfworld data format: a JSON object mapping each task type
(``pick_and_place``, ``pick_clean_then_place``, ``pick_heat_then_place``,
``pick_cool_then_place``, ``look_at_obj``, ``pick_two_obj``) to a list of game
files (``json_2.1.1/valid_unseen/<trial>/game.tw-pddl``) relative to the
directory named by the ``ALFWORLD_DATA`` environment variable (or the
``alfworld_data`` option). Each game is played through TextWorld's PDDL
backend with ALFWorld's name demangler, as ALFWorld's ``AlfredTWEnv`` does::

    env = textworld.start(game_file, request_infos=EnvInfos(won=True, ...),
                          wrappers=[AlfredDemangler(shuffle=False)])
    state = env.reset()                          # state.feedback: the intro
    state, score, done = env.step("go to desk 1")  # state["won"]: the goal holds
    state["admissible_commands"]                 # what the task lists to the model

Needs the ``alfworld`` and ``textworld`` packages (with ``fast_downward``,
``textworld[pddl]``) and the game files: `RealGames` raises `AlfworldUnavailable`
listing everything missing at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.environments._protocol import EnvError
from agentrl.environments.tasks.alfworld.scene import TASK_TYPES
from agentrl.environments.tasks.alfworld.world import NOTHING, Outcome

__all__ = [
    "AlfworldDataError",
    "AlfworldUnavailable",
    "GameRef",
    "RealGame",
    "RealGames",
    "load_game_list",
]

REQUIRED_PACKAGES = ("alfworld", "textworld", "fast_downward")
"""Import names the real backend needs (``pip install alfworld textworld[pddl]``)."""


class AlfworldDataError(EnvError):
    """Raised when an AgentBench alfworld game list is malformed (names the entry)."""


class AlfworldUnavailable(EnvError):
    """Raised when the real backend cannot run here: lists the packages, the data
    directory and the game files that are missing."""


@dataclass(frozen=True, slots=True)
class GameRef:
    """One entry of the game list."""

    task_type: str
    """One of `TASK_TYPES` (the key it was listed under)."""
    path: str
    """The game file, relative to ``ALFWORLD_DATA``."""


def load_game_list(path: str | Path) -> list[GameRef]:
    """The games of an AgentBench alfworld data file, in file order."""
    where = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise AlfworldDataError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(raw, dict):
        raise AlfworldDataError(f"{where}: expected an object of task type -> game files")
    games = []
    for task_type, files in raw.items():
        if task_type not in TASK_TYPES:
            raise AlfworldDataError(
                f"{where}: unknown task type {task_type!r} (known: {', '.join(TASK_TYPES)})"
            )
        if not isinstance(files, list):
            raise AlfworldDataError(f"{where}: {task_type}: expected a list of game files")
        for n, file in enumerate(files):
            if not isinstance(file, str) or not file.strip():
                raise AlfworldDataError(f"{where}: {task_type}[{n}]: not a game file path")
            games.append(GameRef(task_type, file))
    if not games:
        raise AlfworldDataError(f"{where}: no games")
    return games


def missing_requirements(games: list[GameRef], data_dir: str | None) -> list[str]:
    """Everything that keeps ``games`` from being played here (empty: all present)."""
    problems = [
        f"the Python package {name!r} is not installed"
        for name in REQUIRED_PACKAGES
        if importlib.util.find_spec(name) is None
    ]
    if not data_dir:
        problems.append("ALFWORLD_DATA is not set (the directory holding json_2.1.1/...)")
        return problems
    root = Path(data_dir)
    if not root.is_dir():
        problems.append(f"ALFWORLD_DATA={data_dir} is not a directory")
        return problems
    absent = [g.path for g in games if not (root / g.path).is_file()]
    if absent:
        shown = ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else "")
        problems.append(f"{len(absent)} of {len(games)} game files missing under {root}: {shown}")
    return problems


class RealGame:
    """One ALFWorld game played through TextWorld (same surface as the simulator's World)."""

    def __init__(self, game_file: str, task_type: str, *, walkthrough: bool = False) -> None:
        textworld = importlib.import_module("textworld")
        tw_env = importlib.import_module("alfworld.agents.environment.alfred_tw_env")
        extras = ["gamefile"] + (["walkthrough"] if walkthrough else [])
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=extras)
        self.task_type = task_type
        self._env = textworld.start(
            game_file, request_infos=infos, wrappers=[tw_env.AlfredDemangler(shuffle=False)]
        )
        self._state: Any = self._env.reset()
        self._won = bool(self._state["won"])

    def intro(self) -> str:
        """The game's opening text as TextWorld gives it (banner, room, goal)."""
        return str(self._state.feedback)

    def admissible(self) -> list[str]:
        """TextWorld's admissible commands of the current state (sorted by TextWorld)."""
        return [str(c) for c in self._state["admissible_commands"]]

    def walkthrough(self) -> list[str]:
        """The game's own solution (``extra.walkthrough``, replanned by TextWorld if absent)."""
        return [str(c) for c in self._state["extra.walkthrough"]]

    def step(self, command: str) -> Outcome:
        self._state, _, _ = self._env.step(command)
        self._won = bool(self._state["won"])
        text = str(self._state.feedback)
        return Outcome(text, text.strip() != NOTHING)

    def won(self) -> bool:
        return self._won

    def close(self) -> None:
        self._env.close()


class RealGames:
    """The game list of an AgentBench alfworld data file, checked playable at construction."""

    def __init__(
        self,
        data: str | Path,
        *,
        alfworld_data: str | None = None,
        task_types: tuple[str, ...] = TASK_TYPES,
    ) -> None:
        games = [g for g in load_game_list(data) if g.task_type in task_types]
        if not games:
            raise AlfworldDataError(f"{data}: no games of the types {', '.join(task_types)}")
        root = alfworld_data or os.environ.get("ALFWORLD_DATA")
        problems = missing_requirements(games, root)
        if problems:
            raise AlfworldUnavailable(
                "alfworld backend 'alfworld' cannot run: " + "; ".join(problems)
            )
        assert root is not None
        self._root = Path(root)
        self._games = games

    def __len__(self) -> int:
        return len(self._games)

    def ref(self, index: int) -> GameRef:
        return self._games[index]

    def describe(self, index: int) -> str:
        ref = self._games[index]
        return f"[{ref.task_type}] {ref.path}"

    def open(self, index: int, *, walkthrough: bool = False) -> RealGame:
        ref = self._games[index]
        return RealGame(str(self._root / ref.path), ref.task_type, walkthrough=walkthrough)

    def solution(self, index: int) -> list[str]:
        game = self.open(index, walkthrough=True)
        try:
            return game.walkthrough()
        finally:
            game.close()
