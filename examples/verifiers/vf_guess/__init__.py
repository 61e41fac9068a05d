"""vf_guess: a multi-turn verifiers 0.4.0 environment that runs offline: the Env's own
``run()`` plays a number-guessing game against the model, answering each guess with
"higher" or "lower" through ``agents.player.interaction(task)``, as verifiers' TextArena
Env answers with the game engine. Played by agentrl as ``verifiers:vf_guess`` (docs/tasks.md
"verifiers")."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["GuessEnv", "GuessTaskset"]


class GuessConfig(vf.TasksetConfig):
    count: int = 200
    """How many games the taskset holds."""
    high: int = 64
    """The secret is drawn from 1..high."""


class GuessData(vf.TaskData):
    answer: str
    """The secret number, as text."""


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        high = self.config.high
        for i in range(self.config.count):
            secret = random.Random(i).randint(1, high)
            yield GuessTask(
                GuessData(
                    name=f"guess-{i}",
                    prompt=(
                        f"I am thinking of an integer from 1 to {high}. Guess it: reply with "
                        "one number. I will tell you whether mine is higher or lower."
                    ),
                    answer=str(secret),
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=8)
    """The one seat: the guesser (eight guesses find any of 64 numbers)."""


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret = int(task.data.answer)
        guesses = 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                numbers = re.findall(r"-?\d+", segment.last_reply)
                if numbers and int(numbers[-1]) == secret:
                    interaction.trace.record_reward("found", 1.0)
                    break
                if not numbers:
                    hint = "Reply with one integer."
                else:
                    hint = "Higher." if int(numbers[-1]) < secret else "Lower."
                segment = await interaction.turn(hint)
        trace = interaction.trace
        if "found" not in trace.rewards:
            trace.record_reward("found", 0.0)
        trace.record_metric("guesses", guesses)
