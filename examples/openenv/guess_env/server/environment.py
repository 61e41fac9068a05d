"""The guessing game as an OpenEnv ``Environment``: the secret comes from the reset seed,
each step answers one guess, and the ``FoundRubric`` scores the final step on the server."""

from __future__ import annotations

import random
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State
from openenv.core.rubrics import Rubric

from guess_env.models import GuessAction, GuessObservation

HIGH = 64
GUESSES = 8


class FoundRubric(Rubric):
    """1.0 when the game ended with the secret found, else 0.0."""

    def forward(self, action: GuessAction, observation: GuessObservation) -> float:
        return 1.0 if observation.done and observation.message == "Correct!" else 0.0


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__(rubric=FoundRubric())
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 1
        self._left = GUESSES

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs
    ) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._secret = random.Random(seed).randint(1, HIGH)
        self._left = GUESSES
        return GuessObservation(
            message=f"I am thinking of an integer from 1 to {HIGH}. Guess it.",
            guesses_left=self._left,
        )

    def step(self, action: GuessAction, **kwargs) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        self._left -= 1
        if action.guess == self._secret:
            message, done = "Correct!", True
        else:
            message = "Higher." if action.guess < self._secret else "Lower."
            done = self._left <= 0
        observation = GuessObservation(message=message, guesses_left=self._left, done=done)
        observation.reward = self._apply_rubric(action, observation) if done else 0.0
        return observation

    @property
    def state(self) -> State:
        return self._state
