"""The agentrl task: tools, observations, reward, turn limit (docs/own-task.md steps 2-4).

An episode: the user names the range; the model calls ``guess(number)`` and reads
``too low`` / ``too high`` / ``correct`` until it finds the secret (reward 1.0, status
``completed``) or runs out of turns (reward 0.0, ``task_limit_reached``). A message with
no tool call ends the episode (``agent_invalid_action``); a bad call (unknown tool, a
number that is not an integer) is answered with an error and costs its turn.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

from agentrl.environments import SessionClosed, Start, Status, Step
from agentrl.messages import ChatMessage, ToolCall
from guessing.game import LEVELS, Game, feedback, make_game

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the secret number. The reply is too low, too high or correct.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "integer", "description": "Your guess."}},
                "required": ["number"],
            },
        },
    }
]


@dataclass
class _Session:
    game: Game
    max_turns: int
    turns: int = 0
    bad_calls: int = 0
    done: bool = False


class GuessingTask:
    """Find a secret number with the ``guess`` tool.

    Options: ``levels`` (1: 1-20, 2: 1-100, 3: 1-1000; instance ``index`` plays
    ``levels[index % len(levels)]``), ``split`` (train, test or all), ``seed``,
    ``num_instances``, ``slack`` (turns allowed beyond what a binary search needs).
    """

    def __init__(
        self,
        *,
        levels: list[int] | tuple[int, ...] = (1, 2),
        split: str = "train",
        seed: int = 0,
        num_instances: int = 1000,
        slack: int = 1,
    ) -> None:
        levels = tuple(levels)
        if not levels or any(level not in LEVELS for level in levels):
            raise ValueError(f"guessing: levels must be among {sorted(LEVELS)}, got {levels}")
        if split not in ("train", "test", "all"):
            raise ValueError(f"guessing: split must be train, test or all, got {split!r}")
        if num_instances < 1 or slack < 0:
            raise ValueError("guessing: num_instances must be >= 1 and slack >= 0")
        self.levels, self.split, self.seed = levels, split, seed
        self._num_instances, self._slack = num_instances, slack
        self._ids = itertools.count()

    @property
    def tools(self) -> list[dict]:
        return json.loads(json.dumps(TOOLS))  # a copy: callers may not change ours

    @property
    def num_instances(self) -> int:
        return self._num_instances

    def game(self, index: int) -> Game:
        if not 0 <= index < self._num_instances:
            raise IndexError(f"guessing: index {index} not in [0, {self._num_instances})")
        level = self.levels[index % len(self.levels)]
        return make_game(level, self.split, self.seed, index)

    def describe(self, index: int) -> str:
        """Shown beside a failed instance by agentrl-env check."""
        game = self.game(index)
        return f"(level {game.level}, secret {game.secret})"

    def start(self, index: int) -> Start:
        game = self.game(index)
        max_turns = game.guesses_needed + self._slack
        text = (
            f"I picked a whole number from 1 to {game.high}. Find it with the guess tool: "
            f"you have {max_turns} guesses."
        )
        messages = [
            ChatMessage("system", "You play a number-guessing game with tools."),
            ChatMessage("user", text),
        ]
        return Start(session=_Session(game, max_turns), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        if session.done:
            raise SessionClosed("guessing: the episode has ended")
        session.turns += 1
        if not message.tool_calls:
            session.bad_calls += 1
            return self._end(session, Status.AGENT_INVALID_ACTION, [])
        replies = []
        for call in message.tool_calls:
            number = _number(call)
            if number is None:
                session.bad_calls += 1
                text = f"error: call guess with an integer number, not {call.name}"
                replies.append(_reply(call, f"{text}({call.arguments})"))
                continue
            said = feedback(session.game, number)
            replies.append(_reply(call, said))
            if said == "correct":
                return self._end(session, Status.COMPLETED, replies)
        if session.turns >= session.max_turns:
            return self._end(session, Status.TASK_LIMIT_REACHED, replies)
        return Step(replies, Status.RUNNING, 0.0, False)

    def cancel(self, session: _Session) -> None:
        session.done = True

    def _end(self, session: _Session, status: Status, replies: list[ChatMessage]) -> Step:
        session.done = True
        success = status == Status.COMPLETED
        metrics = {
            "env/turns": float(session.turns),
            "env/bad_calls": float(session.bad_calls),
            "env/level": float(session.game.level),
            "env/success": float(success),
        }
        return Step.end(status, 1.0 if success else 0.0, metrics, replies)


def _number(call: ToolCall) -> int | None:
    """The call's guess, or None when it is not ``guess`` with an integer ``number``."""
    if call.name != "guess":
        return None
    try:
        number = json.loads(call.arguments).get("number")
    except (ValueError, AttributeError):
        return None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _reply(call: ToolCall, text: str) -> ChatMessage:
    return ChatMessage("tool", text, tool_call_id=call.id, name=call.name)


def _guess(number: int) -> ToolCall:
    return ToolCall(id="call_0", name="guess", arguments=json.dumps({"number": number}))


def _oracle(env: GuessingTask, index: int, rng: random.Random):
    """Binary search, knowing the secret to foresee each reply: one guess per turn."""
    game = env.game(index)
    low, high = 1, game.high
    while True:
        middle = (low + high) // 2
        yield _guess(middle)
        if middle == game.secret:
            return
        low, high = (middle + 1, high) if middle < game.secret else (low, middle - 1)


def _random(env: GuessingTask, index: int, rng: random.Random):
    """Guesses at random: succeeds now and then on level 1 only."""
    game = env.game(index)
    while True:
        yield _guess(rng.randint(1, game.high))


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
"""Scripted agents for agentrl-env check (--agent oracle|random), the demo option and SFT."""
