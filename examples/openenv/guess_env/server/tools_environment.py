"""The guessing game as an OpenEnv MCP environment (RFC 003): the player calls the MCP tool
``guess(number)`` (OpenEnv's ``call_tool`` action), the server's ``SolvedRubric`` scores
the call that ends the game."""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Observation, State
from openenv.core.rubrics import Rubric

from guess_env.models import GuessObservation
from guess_env.server.environment import GUESSES, HIGH


class SolvedRubric(Rubric):
    """1.0 when the call ended the game with the secret found, else 0.0."""

    def forward(self, action: Any, observation: Observation) -> float:
        return 1.0 if observation.done and observation.metadata.get("found") else 0.0


class GuessToolsEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("guess")

        @mcp.tool
        def guess(number: int) -> str:
            """Guess the secret, an integer from 1 to 64."""
            return self._guess(number)

        super().__init__(mcp)
        self.rubric = SolvedRubric()
        self._state = State(step_count=0)
        self._secret, self._left, self._found = 1, GUESSES, False

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        self._secret = random.Random(seed).randint(1, HIGH)
        self._left, self._found = GUESSES, False
        text = f"I am thinking of an integer from 1 to {HIGH}. Find it with the guess tool."
        return GuessObservation(message=text, guesses_left=self._left)

    def _guess(self, number: int) -> str:
        self._left -= 1
        if number == self._secret:
            self._found = True
            return "Correct!"
        return "Higher." if number < self._secret else "Lower."

    async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            observation.done = self._found or self._left <= 0
            observation.metadata["found"] = self._found
            observation.reward = self._apply_rubric(action, observation)
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state
