"""WebShop's purchase reward (Yao et al. 2022, ``web_agent_site/engine/goal.py:get_reward``).

The reward of buying ``product`` with the chosen ``options`` at ``price`` for a
``goal`` is::

    total = r_type * (attr_matches + option_matches + price_ok)
                   / (len(goal.attributes) + len(goal.options) + 1)

- ``r_type`` (product type): 1.0 when the query, the category path (at least two
  common ``\u203a`` parts) or the title (more than 20% of the goal title's nouns)
  matches; 0.5 when none does; 0.1 when the title share is below 10%; 0.0 when
  no title noun is shared at all (this last rule wins over the others).
- ``attr_matches``: goal attributes found in the product's attributes (fuzzy
  token-set ratio > 85) or, failing that, as a substring of its title, bullet
  points or description (lower-cased).
- ``option_matches``: each *chosen* option value (colour-normalised) counts when
  it matches a goal option: exactly for ``size`` options, by token-set ratio > 85
  for the others, or failing that as a substring of the title, bullet points or
  description. As in WebShop, the count runs over the chosen options.
- ``price_ok``: 1 when ``price <= goal.price_upper``.

Simplifications (documented, not hidden): WebShop finds title nouns with spaCy's
part-of-speech tagger; here the "nouns" are the title's alphabetic words of three
or more letters that are not stop words or common adjectives (`_NOT_NOUNS`).
Colour normalisation uses a shorter colour list than WebShop's. The token-set
ratio is computed here (thefuzz's definition: Indel similarity over sorted token
sets, rounded to an integer). WebShop does not bound the total; since chosen
options that merely appear in the title can push it above 1, it is clamped to
[0, 1] here (and the goal with no price limit, ``price_upper <= 0``, counts the
price as met instead of failing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.environments.tasks.webshop.catalogue import Goal, Product

__all__ = [
    "RewardParts",
    "normalize_color",
    "purchase_reward",
    "title_nouns",
    "token_set_ratio",
    "type_reward",
]

EXACT_MATCH_OPTIONS = ("size",)
"""Option names whose values must match a goal option exactly (as in WebShop)."""
FUZZY_THRESHOLD = 85

_COLORS = (
    "beige", "black", "blue", "bronze", "brown", "burgundy", "charcoal", "coral", "cream",
    "gold", "gray", "green", "grey", "ivory", "khaki", "lavender", "navy", "olive", "orange",
    "pink", "purple", "red", "rose", "silver", "tan", "teal", "white", "yellow",
)  # fmt: skip
_NOT_NOUNS = frozenset((
    "a", "an", "the", "and", "or", "for", "with", "without", "of", "in", "on", "to", "by",
    "from", "at", "as", "is", "are", "be", "this", "that", "these", "those", "new", "pack",
    "set", "piece", "pcs", "men", "mens", "women", "womens", "kids", "unisex", "large", "small",
    "medium", "mini", "big", "soft", "hard", "light", "dark", "lightweight", "heavy", "extra",
    "super", "ultra", "premium", "classic", "original", "natural", "organic", "fresh", "pure",
    "best", "high", "low", "long", "short", "slim", "wide", "deep", "easy", "quick", "fast",
    "fit", "full", "half", "free", "non", "anti", "multi", "all", "your", "our", "its", "his",
    "her", "their", "one", "two", "three", "four", "inch", "inches", "ounce", "ounces", "oz",
    "count", "ml", "lb", "lbs",
))  # fmt: skip
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True, slots=True)
class RewardParts:
    """The reward of one purchase and the parts it is made of."""

    total: float
    """The reward in [0, 1]."""
    r_type: float
    """Product type factor: 1.0, 0.5, 0.1 or 0.0."""
    attr_matches: int
    option_matches: int
    price_ok: bool
    n_attributes: int
    n_options: int


def _process(text: str) -> str:
    """thefuzz's default processing: non-alphanumerics to spaces, lower case, trimmed."""
    return re.sub(r"[^0-9a-zA-Z]+", " ", text).lower().strip()


def _lcs(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for ca in a:
        current = [0]
        for j, cb in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if ca == cb else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def _ratio(a: str, b: str) -> float:
    """Indel similarity in percent: 200 * LCS / (len(a) + len(b))."""
    if not a and not b:
        return 100.0
    return 200.0 * _lcs(a, b) / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``token_set_ratio``: similarity of the token sets, 0..100 (rounded)."""
    ta, tb = set(_process(a).split()), set(_process(b).split())
    if not ta or not tb:
        return 0
    common = ta & tb
    only_a, only_b = " ".join(sorted(ta - tb)), " ".join(sorted(tb - ta))
    if common and (not only_a or not only_b):
        return 100
    sect = " ".join(sorted(common))
    with_a = f"{sect} {only_a}" if sect else only_a
    with_b = f"{sect} {only_b}" if sect else only_b
    scores = [_ratio(with_a, with_b)]
    if sect:
        scores += [_ratio(sect, with_a), _ratio(sect, with_b)]
    return round(max(scores))


def normalize_color(value: str) -> str:
    """The first known colour contained in ``value`` (e.g. ``navy blue`` -> ``blue``), else
    ``value``."""
    for color in _COLORS:
        if color in value:
            return color
    return value


def title_nouns(title: str) -> list[str]:
    """The words of a title that stand for its nouns (see the module doc)."""
    return [w for w in _WORD.findall(title.lower()) if len(w) >= 3 and w not in _NOT_NOUNS]


def type_reward(
    *,
    query: str,
    goal_query: str,
    product_category: str,
    goal_product_category: str,
    name: str,
    goal_name: str,
) -> float:
    """WebShop's ``r_type``: does the bought product have the wanted type?"""
    query_match = query == goal_query
    parts = {p.strip() for p in product_category.split("\u203a")}
    goal_parts = {p.strip() for p in goal_product_category.split("\u203a")}
    category_match = len((parts & goal_parts) - {""}) >= 2
    wanted = set(title_nouns(goal_name))
    title_score = len(set(title_nouns(name)) & wanted) / len(wanted) if wanted else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def _in_text(value: str, texts: Sequence[str]) -> bool:
    return any(value in text for text in texts)


def attribute_matches(
    goal_attributes: Iterable[str], attributes: Sequence[str], texts: Sequence[str]
) -> int:
    """How many goal attributes the product has (fuzzy, or as a substring of ``texts``)."""
    count = 0
    for wanted in goal_attributes:
        fuzzy = any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in attributes)
        if fuzzy or _in_text(wanted, texts):
            count += 1
    return count


def option_matches(
    goal_options: Iterable[str], chosen: Mapping[str, str], texts: Sequence[str]
) -> int:
    """How many chosen options match a goal option (see the module doc)."""
    wanted = [normalize_color(o) for o in goal_options]
    count = 0
    for name, raw_value in chosen.items():
        value = normalize_color(raw_value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in wanted
        else:
            matched = any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in wanted)
        if matched or _in_text(value, texts):
            count += 1
    return count


def purchase_reward(
    product: Product, goal: Goal, price: float, chosen: Mapping[str, str]
) -> RewardParts:
    """The reward for buying ``product`` with options ``chosen`` at ``price`` for ``goal``."""
    r_type = type_reward(
        query=product.query,
        goal_query=goal.query,
        product_category=product.product_category,
        goal_product_category=goal.product_category,
        name=product.title,
        goal_name=goal.name,
    )
    texts = (
        product.title.lower(),
        " ".join(product.bullet_points).lower(),
        product.description.lower(),
    )
    attrs = attribute_matches(goal.attributes, product.attributes, texts)
    options = option_matches(goal.options, chosen, texts)
    price_ok = goal.price_upper <= 0 or price <= goal.price_upper
    denominator = len(goal.attributes) + len(goal.options) + 1
    total = r_type * (attrs + options + int(price_ok)) / denominator
    return RewardParts(
        total=min(1.0, max(0.0, total)),
        r_type=r_type,
        attr_matches=attrs,
        option_matches=options,
        price_ok=price_ok,
        n_attributes=len(goal.attributes),
        n_options=len(goal.options),
    )
