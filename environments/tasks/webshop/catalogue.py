"""The WebShop catalogue, its shopping goals and its search engine.

Files, in WebShop's own formats so its real data loads too:

- catalogue (``items_shuffle.json`` style): a JSON list of products, each with
  ``asin``, ``name``, ``full_description``, ``small_description`` (bullet points,
  a list or a string), ``pricing`` (``"$12.99"`` or ``"$10.00 - $20.00"``),
  ``customization_options`` (``{name: [{"value": ..., "image": ...}]}`` or null),
  ``category``, ``query``, ``product_category`` (``"A \u203a B \u203a C"``). Optional:
  ``attributes`` (a list; WebShop keeps these in ``items_ins_v2.json``, which
  ``attributes=PATH`` reads: ``{asin: {"attributes": [...]}}``), ``reviews``
  (``[{"score": 5, "body": "..."}]``) and ``rating``.
- instructions (``items_human_ins.json`` style): ``{asin: [{"instruction": ...,
  "instruction_attributes": [...], "instruction_options": [...]}]}``; an entry may
  give its own ``price_upper``. Entries without attributes are skipped, as in
  WebShop.

Goals are built as WebShop's ``get_human_goals`` does: the text is the
instruction plus ``", and price lower than X dollars"``, X drawn from the next
multiples of ten above the price (a seeded draw per goal here, so it is
reproducible; WebShop uses the global random state). A product priced as a range
costs a seeded uniform draw inside it (WebShop: ``random.uniform``). Goals keep
the file's order (WebShop shuffles them with seed 233).

Search is BM25 (k1 = 0.9, b = 0.4, Pyserini's defaults) over title, description,
bullet points and attributes, top 50 hits, standing in for WebShop's Lucene index.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.environments._protocol import EnvError
from agentrl.environments.tasks.webshop.generate import generate_shop

__all__ = [
    "BUILTIN_SIZE",
    "CatalogueError",
    "Goal",
    "Product",
    "SearchIndex",
    "load_catalogue",
    "load_goals",
]

SEARCH_RETURN_N = 50
BUILTIN_SIZE = (500, 250)
"""The built-in shop: products and instructions per type (12 types: 6,000 and 3,000)."""
_PRICE_STEPS = [10.0 * i for i in range(1, 100)]
_NO_LIMIT = 1_000_000.0
_TOKEN = re.compile(r"[a-z0-9]+")
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "i", "in", "is", "it",
    "of", "on", "or", "that", "the", "to", "with",
))  # fmt: skip


class CatalogueError(EnvError):
    """Raised when a catalogue or instruction file is unreadable; the message names the item."""


@dataclass(frozen=True, slots=True)
class Product:
    """One product of the shop."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    """One price, or the low and high end of a range."""
    options: dict[str, tuple[str, ...]]
    """Option group name (lower case) -> its values (lower case, ``/`` shown as `` | ``)."""
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    reviews: tuple[tuple[float, str], ...] = ()
    """(score, text) per review."""
    rating: str = "N.A."

    @property
    def price_tag(self) -> str:
        if len(self.pricing) == 1:
            return f"${self.pricing[0]:.2f}"
        return f"${self.pricing[0]:.2f} to ${self.pricing[1]:.2f}"

    @property
    def price(self) -> float:
        """The price a purchase costs (a seeded draw inside a range)."""
        if len(self.pricing) == 1:
            return self.pricing[0]
        return round(random.Random(self.asin).uniform(*self.pricing[:2]), 2)


@dataclass(frozen=True, slots=True)
class Goal:
    """One shopping instruction (WebShop's goal record)."""

    asin: str
    """The product the instruction was written for."""
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    """Goal option values (e.g. ``blue``, ``10``)."""
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str
    """The target product's title."""


def _read_json(path: str | Path, what: str) -> tuple[Any, str]:
    try:
        text, where = Path(path).read_text(), str(path)
    except OSError as exc:
        raise CatalogueError(f"{what} {path}: cannot read it ({exc})") from exc
    try:
        return json.loads(text), where
    except json.JSONDecodeError as exc:
        raise CatalogueError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from exc


def _pricing(raw: Any) -> tuple[float, ...]:
    if raw is None or raw == "" or raw == []:
        return (100.0,)
    if isinstance(raw, int | float):
        return (float(raw),)
    if isinstance(raw, list):
        return tuple(float(p) for p in raw[:2])
    prices = [re.sub(r"[^\d.]", "", part) for part in str(raw).split("$")[1:]]
    values = tuple(float(p) for p in prices if p)
    if not values:
        raise ValueError(f"pricing {raw!r} has no $ amount")
    return values[:2]


def _options(raw: Any) -> dict[str, tuple[str, ...]]:
    options: dict[str, tuple[str, ...]] = {}
    for name, contents in (raw or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"] if isinstance(content, dict) else content
            values.append(str(value).strip().replace("/", " | ").lower())
        options[str(name).lower()] = tuple(values)
    return options


def _product(raw: Any, attributes: dict[str, Any] | None) -> Product:
    asin = str(raw["asin"])
    if attributes is not None and asin in attributes:
        attrs = attributes[asin].get("attributes") or ["DUMMY_ATTR"]
    else:
        attrs = raw.get("attributes") or raw.get("Attributes") or ["DUMMY_ATTR"]
    bullets = raw.get("small_description") or []
    reviews = tuple(
        (float(r.get("score", r.get("stars", 0))), str(r.get("body", r.get("review", ""))))
        for r in raw.get("reviews") or []
    )
    return Product(
        asin=asin,
        title=str(raw["name"]),
        description=str(raw.get("full_description") or ""),
        bullet_points=tuple(map(str, bullets if isinstance(bullets, list) else [bullets])),
        pricing=_pricing(raw.get("pricing")),
        options=_options(raw.get("customization_options")),
        attributes=tuple(map(str, attrs)),
        category=str(raw.get("category") or ""),
        query=str(raw.get("query") or "").lower().strip(),
        product_category=str(raw.get("product_category") or ""),
        reviews=reviews,
        rating=str(raw.get("rating", "N.A.")),
    )


def load_catalogue(
    path: str | Path | None = None,
    attributes: str | Path | None = None,
    *,
    builtin: tuple[int, int] = BUILTIN_SIZE,
) -> dict[str, Product]:
    """asin -> Product from a catalogue file; when ``path`` is None, the generated built-in
    shop of ``builtin = (products_per_type, goals_per_type)`` (`tasks.webshop.generate`)."""
    if path is None:
        raw, where = list(generate_shop(*builtin)[0]), "built-in catalogue"
    else:
        raw, where = _read_json(path, "webshop catalogue")
    attrs = None
    if attributes is not None:
        attrs, _ = _read_json(attributes, "webshop attributes")
        if not isinstance(attrs, dict):
            raise CatalogueError(f"{attributes}: not an {{asin: {{attributes}}}} object")
    if not isinstance(raw, list):
        raise CatalogueError(f"{where}: not a list of products")
    products: dict[str, Product] = {}
    for number, item in enumerate(raw):
        label = f"{where} item {number}"
        if isinstance(item, dict) and "asin" in item:
            label += f" (asin {item['asin']})"
        try:
            product = _product(item, attrs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CatalogueError(f"{label}: bad product ({type(exc).__name__}: {exc})") from exc
        if product.asin == "nan" or product.asin in products:
            continue  # WebShop skips these too
        products[product.asin] = product
    if not products:
        raise CatalogueError(f"{where}: no products")
    return products


def _price_upper(entry: dict, product: Product, seed: str) -> tuple[float, str]:
    if entry.get("price_upper") is not None:
        upper = float(entry["price_upper"])
    else:
        steps = [p for p in _PRICE_STEPS if p > product.price][:4]
        if len(steps) < 2:
            return _NO_LIMIT, ""
        upper = sorted(random.Random(seed).sample(steps, 2))[1]
    if upper >= _NO_LIMIT:
        return upper, ""
    return upper, f", and price lower than {upper:.2f} dollars"


def load_goals(
    path: str | Path | None,
    products: dict[str, Product],
    *,
    builtin: tuple[int, int] = BUILTIN_SIZE,
) -> list[Goal]:
    """Goals from an instruction file; when ``path`` is None, the built-in shop's
    (``builtin`` as for :func:`load_catalogue`)."""
    if path is None:
        raw, where = generate_shop(*builtin)[1], "built-in instructions"
    else:
        raw, where = _read_json(path, "webshop instructions")
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: not an {{asin: [instructions]}} object")
    goals = []
    for asin, entries in raw.items():
        product = products.get(asin)
        if product is None:
            raise CatalogueError(f"{where}: instructions for asin {asin}, not in the catalogue")
        if not isinstance(entries, list):
            raise CatalogueError(f"{where}: asin {asin}: not a list of instructions")
        for k, entry in enumerate(entries):
            try:
                attributes = tuple(map(str, entry["instruction_attributes"]))
                options = entry.get("instruction_options") or []
                if isinstance(options, dict):
                    options = list(options.values())
                upper, price_text = _price_upper(entry, product, f"{asin}:{k}")
                text = str(entry["instruction"]).strip().strip(".") + price_text
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CatalogueError(
                    f"{where}: asin {asin} instruction {k}: bad entry ({type(exc).__name__}: {exc})"
                ) from exc
            if not attributes:
                continue
            goals.append(
                Goal(
                    asin=asin,
                    instruction=text,
                    attributes=attributes,
                    options=tuple(str(o) for o in options),
                    price_upper=upper,
                    query=product.query,
                    category=product.category,
                    product_category=product.product_category,
                    name=product.title,
                )
            )
    if not goals:
        raise CatalogueError(f"{where}: no instruction with attributes")
    return goals


def tokens(text: str) -> list[str]:
    """Search tokens: lower-case words and numbers, stop words dropped."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


class SearchIndex:
    """BM25 over the catalogue (read-only after construction, so safe to share).

    Postings per term, so a search costs the documents that hold its terms, not the whole
    catalogue (thousands of products)."""

    K1 = 0.9
    B = 0.4

    def __init__(self, products: dict[str, Product]) -> None:
        self._asins = list(products)
        lengths: list[int] = []
        postings: dict[str, list[tuple[int, int]]] = {}
        for i, product in enumerate(products.values()):
            text = " ".join(
                [product.title, product.description, *product.bullet_points, *product.attributes]
            )
            doc = Counter(tokens(text))
            lengths.append(sum(doc.values()))
            for term, tf in doc.items():
                postings.setdefault(term, []).append((i, tf))
        average = sum(lengths) / max(1, len(lengths))
        self._norm = [self.K1 * (1 - self.B + self.B * n / average) for n in lengths]
        n = len(lengths)
        self._postings = postings
        self._idf = {
            t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in postings.items()
        }

    def search(self, keywords: str, limit: int = SEARCH_RETURN_N) -> list[str]:
        """The asins best matching ``keywords``, best first (ties in catalogue order)."""
        scores: dict[int, float] = {}
        for term in set(tokens(keywords)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for i, tf in self._postings[term]:
                gain = idf * tf * (self.K1 + 1) / (tf + self._norm[i])
                scores[i] = scores.get(i, 0.0) + gain
        ranked = sorted((-score, i) for i, score in scores.items() if score > 0)
        return [self._asins[i] for _, i in ranked[:limit]]
