"""The guessing game's action and observation (OpenEnv pydantic models)."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    """One guess."""

    guess: int = Field(..., description="Your guess, an integer from 1 to 64.")


class GuessObservation(Observation):
    """What the player is told."""

    message: str = Field(default="", description="The game's answer to the last guess.")
    guesses_left: int = Field(default=0, description="Guesses left before the game ends.")
