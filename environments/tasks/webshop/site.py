"""The simulated shop a WebShop session browses (in process), and the page record.

Pages follow WebShop's text observation mode: the visible texts joined by
`` [SEP] ``, with every clickable shown in brackets (``[Buy Now]``). The pages
and what can be clicked on them:

- search page: the instruction; only ``search_action`` works here.
- results page (10 products per page, 50 hits at most): ``[Back to Search]``,
  ``[< Prev]``, ``[Next >]`` and each product's id (its title is accepted too).
- item page: title, price, rating, one group per option with its values
  (``[red]``, ``[large]``; a chosen value is marked ``(chosen)``),
  ``[Description]``, ``[Features]``, ``[Reviews]``, ``[Buy Now]``,
  ``[< Prev]`` (back to the results) and ``[Back to Search]``.
- description / features / reviews pages: the text, ``[< Prev]`` (back to
  the item, options kept) and ``[Back to Search]``.
- done page, after ``Buy Now``: the score.

Clicks match names case-insensitively, as WebShop lower-cases them.
Anything not on the current page raises `InvalidAction`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrl.environments._protocol import EnvError
from agentrl.environments.tasks.webshop.catalogue import Goal, Product, SearchIndex
from agentrl.environments.tasks.webshop.reward import RewardParts, purchase_reward

__all__ = [
    "BUY",
    "NEXT",
    "PRODUCT_WINDOW",
    "SUB_PAGES",
    "InvalidAction",
    "Judge",
    "LocalSite",
    "Page",
]

PRODUCT_WINDOW = 10
BUY = "Buy Now"
NEXT = "Next >"
PREV = "< Prev"
BACK = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")


class InvalidAction(EnvError):
    """Raised by a site for an action the current page does not offer (the model's mistake)."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page as the agent sees it."""

    kind: str
    """``search``, ``results``, ``item``, ``description``, ``features``, ``reviews`` or
    ``done``."""
    text: str
    """The observation: visible texts joined by `` [SEP] ``, clickables in brackets."""
    clickables: tuple[str, ...]
    """Names ``click_action`` accepts here, as shown."""
    reward: float | None = None
    """The score, on the done page."""
    parts: RewardParts | None = None
    """How the score was made (in-process shop only)."""

    @property
    def has_search_bar(self) -> bool:
        return self.kind == "search"


def _join(*parts: str) -> str:
    return " [SEP] ".join(p for p in parts if p)


Judge = Callable[[Product, Goal, float, dict[str, str]], RewardParts]
"""How a purchase is scored: (product, goal, price, chosen options) -> the reward's parts."""


class LocalSite:
    """One browsing session on the in-process shop (not shared between sessions)."""

    def __init__(
        self,
        products: dict[str, Product],
        index: SearchIndex,
        goal: Goal,
        judge: Judge = purchase_reward,
    ) -> None:
        self._judge = judge
        self._products = products
        self._index = index
        self._goal = goal
        self._keywords = ""
        self._results: list[str] = []
        self._page_no = 1
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._targets: dict[str, tuple[str, str]] = {}
        """lower-case clickable -> (action, argument) on the current page."""
        self.page = self._search_page()

    # --- actions ---------------------------------------------------------------------

    def search(self, keywords: str) -> Page:
        if not self.page.has_search_bar:
            raise InvalidAction("there is no search bar on this page")
        self._keywords = keywords.strip()
        self._results = self._index.search(self._keywords)
        self._page_no = 1
        self.page = self._results_page()
        return self.page

    def click(self, name: str) -> Page:
        target = self._targets.get(name.strip().lower())
        if target is None:
            raise InvalidAction(f"{name!r} is not a clickable on this page")
        action, argument = target
        if action == "back":
            self.page = self._search_page()
        elif action == "page":
            self._page_no += int(argument)
            self.page = self._results_page()
        elif action == "results":
            self.page = self._results_page()
        elif action == "product":
            self._asin, self._options = argument, {}
            self.page = self._item_page()
        elif action == "option":
            group, _, value = argument.partition("\n")
            self._options[group] = value
            self.page = self._item_page()
        elif action == "item":
            self.page = self._item_page()
        elif action == "sub":
            self.page = self._sub_page(argument)
        else:  # buy
            self.page = self._done_page()
        return self.page

    # --- pages -----------------------------------------------------------------------

    def _set(self, kind: str, text: str, targets: dict[str, tuple[str, str]], **extra) -> Page:
        shown = tuple(targets)
        self._targets = {name.lower(): action for name, action in targets.items()}
        for action in list(targets.values()):
            if action[0] == "product":
                self._targets.setdefault(self._products[action[1]].title.lower(), action)
        return Page(kind=kind, text=text, clickables=shown, **extra)

    def _instruction(self) -> str:
        return _join("Instruction:", self._goal.instruction)

    def _search_page(self) -> Page:
        self._keywords, self._results, self._asin, self._options = "", [], None, {}
        return self._set("search", _join("WebShop", self._instruction(), "Search"), {})

    def _results_page(self) -> Page:
        self._asin, self._options = None, {}
        first = (self._page_no - 1) * PRODUCT_WINDOW
        shown = self._results[first : first + PRODUCT_WINDOW]
        targets: dict[str, tuple[str, str]] = {BACK: ("back", "")}
        parts = [self._instruction(), f"[{BACK}]"]
        parts.append(f"Page {self._page_no} (Total results: {len(self._results)})")
        if self._page_no > 1:
            targets[PREV] = ("page", "-1")
            parts.append(f"[{PREV}]")
        if first + PRODUCT_WINDOW < len(self._results):
            targets[NEXT] = ("page", "1")
            parts.append(f"[{NEXT}]")
        if not shown:
            parts.append("No results.")
        for asin in shown:
            product = self._products[asin]
            targets[asin] = ("product", asin)
            parts += [f"[{asin}]", product.title, product.price_tag]
        return self._set("results", _join(*parts), targets)

    def _product(self) -> Product:
        assert self._asin is not None
        return self._products[self._asin]

    def _item_page(self) -> Page:
        product = self._product()
        targets: dict[str, tuple[str, str]] = {BACK: ("back", ""), PREV: ("results", "")}
        parts = [self._instruction(), f"[{BACK}]", f"[{PREV}]"]
        for group, values in product.options.items():
            parts.append(group)
            for value in values:
                targets.setdefault(value, ("option", f"{group}\n{value}"))
                chosen = " (chosen)" if self._options.get(group) == value else ""
                parts.append(f"[{value}]{chosen}")
        parts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
        for sub in SUB_PAGES:
            targets[sub] = ("sub", sub)
            parts.append(f"[{sub}]")
        targets[BUY] = ("buy", "")
        parts.append(f"[{BUY}]")
        return self._set("item", _join(*parts), targets)

    def _sub_page(self, sub: str) -> Page:
        product = self._product()
        if sub == "Description":
            body = [product.description or "No Description"]
        elif sub == "Features":
            body = list(product.bullet_points) or ["No Features"]
        else:
            body = [f"score: {s:g} [SEP] {text}" for s, text in product.reviews] or ["No Reviews"]
        targets = {BACK: ("back", ""), PREV: ("item", "")}
        text = _join(self._instruction(), f"[{BACK}]", f"[{PREV}]", *body)
        return self._set(sub.lower(), text, targets)

    def _done_page(self) -> Page:
        product = self._product()
        parts = self._judge(product, self._goal, product.price, self._options)
        text = _join(
            "Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{parts.total}"
        )
        return self._set("done", text, {}, reward=parts.total, parts=parts)

    def close(self) -> None:
        """Nothing to release in process."""
