"""Scripted agents of the ``webshop`` task for `agentrl-env check` and demos."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentrl.environments.tasks.webshop.levels import FULL
from agentrl.environments.tasks.webshop.reward import token_set_ratio
from agentrl.environments.tasks.webshop.site import BACK, BUY, NEXT, PRODUCT_WINDOW
from agentrl.messages import ToolCall

if TYPE_CHECKING:
    from agentrl.environments.tasks.webshop.task import WebShopTask

__all__ = ["SCRIPTS"]


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _click(name: str) -> ToolCall:
    """A click on ``name`` written as the available actions list it (lower case)."""
    return _call("click_action", value=name.lower())


def _oracle(env: WebShopTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Search with the instruction (the exact title below the full level); when the target
    is not among the hits (a catalogue of thousands), go back and search its title; page to
    the target, pick the goal's options, buy."""
    goal = env.goal(index)
    keywords = goal.instruction if env.level(index) == FULL else goal.name
    yield _call("search_action", keywords=keywords)
    results = env.search(keywords)
    if goal.asin not in results:
        yield _click(BACK)
        yield _call("search_action", keywords=goal.name)
        results = env.search(goal.name)
    position = results.index(goal.asin) if goal.asin in results else 0
    for _ in range(position // PRODUCT_WINDOW):
        yield _click(NEXT)
    yield _click(goal.asin)
    values = [v for group in env.product(goal.asin).options.values() for v in group]
    for wanted in goal.options:
        best = max(
            values,
            key=lambda v: (v.lower() == wanted.lower(), token_set_ratio(v, wanted)),
            default=None,
        )
        if best is not None:
            yield _click(best)
    yield _click(BUY)


def _random(env: WebShopTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Search with the instruction, buy a random first-page result as it comes."""
    goal = env.goal(index)
    yield _call("search_action", keywords=goal.instruction)
    results = env.search(goal.instruction)[:PRODUCT_WINDOW]
    if results:
        yield _click(rng.choice(results))
    yield _click(BUY)


SCRIPTS = {"oracle": _oracle, "random": _random}
"""The oracle and random agents, ``fn(env, index, rng)`` yielding tool calls."""
