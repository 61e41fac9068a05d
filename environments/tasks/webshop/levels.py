"""Graded levels and the train/test split of the ``webshop`` task.

Levels (option ``levels``; instance ``index`` plays ``levels[index % len(levels)]``):

- 0: ``search for "<exact product title>" and buy it``: search, click the
  product, ``Buy Now`` (three calls); one instance per catalogue product.
- 1: the same with one option to click first, ``search for "<title>", choose
  "<value>" and buy it`` (four calls); one instance per (product, option value).
- 2: the full task, the shopping instructions of the data set (WebShop's goals).

Levels 0 and 1 are judged exactly (`exact_reward`): 1.0 for buying the named
product (with the named option chosen, at level 1), else 0.0; WebShop's reward
would pay a same-type product in full when the goal names no attribute. Each
level has its own default turn limit (`LEVEL_TURNS`; the full task keeps
AgentBench's 20 rounds).

Split: by product. A catalogue product is held out for ``test`` when a seeded
hash of its asin says so (`agentrl.environments.tasks.toolkit.split.split_items` over every
asin of the catalogue), and every level's instances follow their product's side,
so a test product is never bought, searched for or shown as a goal in training,
at any level. Levels 0 and 1 list their instances in a seeded shuffle of
``(level, seed, split)``; level 2 keeps the instruction file's order.
"""

from __future__ import annotations

import random

from agentrl.environments.tasks.toolkit.split import split_items
from agentrl.environments.tasks.webshop.catalogue import Goal, Product
from agentrl.environments.tasks.webshop.reward import RewardParts

__all__ = ["FULL", "LEVELS", "LEVEL_TURNS", "exact_reward", "level_goals", "split_asins"]

FULL = 2
"""The level number of the full task."""

LEVELS = (0, 1, FULL)

LEVEL_TURNS = {0: 5, 1: 6, FULL: 20}
"""Default turn limit per level (AgentBench's ``round: 20`` for the full task,
``configs/tasks/webshop.yaml`` line 5)."""

NO_PRICE_LIMIT = 1_000_000.0


def split_asins(products: dict[str, Product], split: str, seed: int) -> set[str]:
    """The asins on ``split``'s side (every asin for ``all``)."""
    asins = sorted(products)
    return set(split_items(asins, asins, split, seed))


def _goal(product: Product, instruction: str, options: tuple[str, ...]) -> Goal:
    return Goal(
        asin=product.asin,
        instruction=instruction,
        attributes=(),
        options=options,
        price_upper=NO_PRICE_LIMIT,
        query=product.query,
        category=product.category,
        product_category=product.product_category,
        name=product.title,
    )


def level_goals(
    level: int,
    products: dict[str, Product],
    goals: list[Goal],
    asins: set[str],
    split: str,
    seed: int,
) -> list[Goal]:
    """The goals of ``level`` whose product is in ``asins`` (see the module doc)."""
    if level == FULL:
        return [g for g in goals if g.asin in asins]
    found: list[Goal] = []
    for asin in sorted(asins):
        product = products[asin]
        if level == 0:
            found.append(_goal(product, f'search for "{product.title}" and buy it', ()))
            continue
        for values in product.options.values():
            for value in values:
                text = f'search for "{product.title}", choose "{value}" and buy it'
                found.append(_goal(product, text, (value,)))
    random.Random(f"webshop-level:{level}:{seed}:{split}").shuffle(found)
    return found


def exact_reward(product: Product, goal: Goal, price: float, chosen: dict[str, str]) -> RewardParts:
    """1.0 for buying the goal's product with each goal option chosen, else 0.0."""
    right = product.asin == goal.asin
    matched = sum(value in chosen.values() for value in goal.options)
    success = right and matched == len(goal.options)
    return RewardParts(
        total=1.0 if success else 0.0,
        r_type=1.0 if right else 0.0,
        attr_matches=0,
        option_matches=matched,
        price_ok=True,
        n_attributes=0,
        n_options=len(goal.options),
    )
