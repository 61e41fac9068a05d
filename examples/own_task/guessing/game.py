"""The game itself, without agentrl: levels, instances and the split (docs/own-task.md step 1)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from agentrl.environments.tasks.toolkit.split import in_split

LEVELS = {1: 20, 2: 100, 3: 1000}
"""Level -> the highest number the secret may be (the lowest is 1)."""


@dataclass(frozen=True)
class Game:
    """One instance: the secret and the range the player is told about."""

    level: int
    high: int
    secret: int

    @property
    def guesses_needed(self) -> int:
        """Guesses a binary search needs at most: the task's turn limit builds on it."""
        return math.ceil(math.log2(self.high + 1))


def make_game(level: int, split: str, seed: int, index: int) -> Game:
    """Instance ``index`` of ``split``: a pure function of its arguments, so every start of
    one instance is the same game, and a test secret is never a training secret of its level
    (`in_split` puts each (level, secret) on one side by a seeded hash)."""
    high = LEVELS[level]
    for attempt in range(200):
        secret = random.Random(f"guessing:{seed}:{split}:{index}:{attempt}").randint(1, high)
        if in_split(f"{level}:{secret}", split, seed):
            return Game(level, high, secret)
    raise ValueError(f"guessing: no {split} secret at level {level} with seed {seed}")


def feedback(game: Game, guess: int) -> str:
    """What the player is told about ``guess``."""
    if guess == game.secret:
        return "correct"
    return "too low" if guess < game.secret else "too high"
