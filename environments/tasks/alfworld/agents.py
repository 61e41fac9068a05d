"""Scripted agents of the ``alfworld`` task for `agentrl-env check` and demos.

``oracle`` plays the planner's solution (the game's walkthrough on the real
backend); ``random`` sends well-formed commands naming things of the scene,
without a plan, up to the instance's turn limit.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any

from agentrl.environments.tasks.alfworld.scene import kind_of
from agentrl.messages import ToolCall

if TYPE_CHECKING:
    from agentrl.environments.tasks.alfworld.task import AlfworldTask

__all__ = ["SCRIPTS", "random_command"]


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
            f"examine {rng.choice([r, o])}",
        ]
    )


def _random(env: AlfworldTask, index: int, rng: random.Random):
    receps, objects = env.vocabulary(index)
    limit = env.turn_limit(env.level(index))
    for n in range(min(limit, 50)):
        yield _action(random_command(receps, objects, rng), n)


SCRIPTS: dict[str, Any] = {"oracle": _oracle, "random": _random}
"""The oracle and random agents, ``fn(env, index, rng)`` yielding tool calls."""
