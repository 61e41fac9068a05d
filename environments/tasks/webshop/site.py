"""The simulated shop a WebShop session browses (in process), and the page record.

Pages are WebShop's ``text`` observation mode (``WebAgentTextEnv.convert_html_to_text``
with ``simple=True``, princeton-nlp/WebShop web_agent_site/envs/web_agent_text_env.py:
212-216): the visible texts of its templates (``web_agent_site/templates/``) joined by
`` [SEP] ``, with nothing marking what is clickable or chosen. The pages and what can
be clicked on them:

- search page: ``WebShop``, the instruction, ``Search``; nothing to click.
- results page (10 products per page, 50 hits at most): ``Back to Search``, the page
  number and total, ``< Prev`` (after page 1), ``Next >`` (always, as WebShop's
  template: past the last hit it shows an empty page), each product's id, title
  and price.
- item page: ``Back to Search``, ``< Prev`` (back to the results), one group per
  option with its values, title, price, rating, ``Description``, ``Features``,
  ``Reviews``, ``Buy Now``.
- description / features / reviews pages: ``Back to Search``, ``< Prev`` (back to the
  item, options kept), the text.
- done page, after ``Buy Now``: the score.

`Page.clickables` is what WebShop's ``get_available_actions`` lists (lines 127-148):
the buttons' and product links' texts lower-cased, then the option values; on the
search page its ``Search`` button (``search``). A click names one of them exactly, in
any case, as WebShop lower-cases the clicked value (line 104; option values are lower
case, see `agentrl.environments.tasks.webshop.catalogue`); a product's title is not a
clickable. A search works from any page, as WebShop's ``step`` runs ``search[...]``
whatever the page (lines 102-106). A click on anything not on the current page, or a
search with no keywords, raises `InvalidAction` (WebShop then leaves the page as it
is, lines 111-112).
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
    """WebShop's ``get_available_actions()["clickables"]`` for this page (module doc)."""
    reward: float | None = None
    """The score, on the done page."""
    parts: RewardParts | None = None
    """How the score was made (in-process shop only)."""

    @property
    def has_search_bar(self) -> bool:
        return self.kind == "search"

    def available_actions(self) -> dict[str, object]:
        """WebShop's ``get_available_actions()``: ``{"has_search_bar": ..., "clickables": [...]}``
        (AgentBench shows its ``str``)."""
        return {"has_search_bar": self.has_search_bar, "clickables": list(self.clickables)}


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
        if not keywords:
            raise InvalidAction("no keywords to search")
        self._keywords = keywords
        self._results = self._index.search(self._keywords)
        self._page_no = 1
        self.page = self._results_page()
        return self.page

    def click(self, name: str) -> Page:
        target = self._targets.get(name.lower())
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
        self._targets = {name.lower(): action for name, action in targets.items()}
        # WebShop lists buttons, then product links, then option values (module doc)
        buttons = [n.lower() for n, (a, _) in targets.items() if a not in ("product", "option")]
        links = [n.lower() for n, (a, _) in targets.items() if a == "product"]
        options = [n for n, (a, _) in targets.items() if a == "option"]
        if kind == "search":
            buttons = ["search"]
        shown = tuple(dict.fromkeys(buttons + links + options))
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
        parts = [self._instruction(), BACK]
        parts.append(f"Page {self._page_no} (Total results: {len(self._results)})")
        if self._page_no > 1:
            targets[PREV] = ("page", "-1")
            parts.append(PREV)
        targets[NEXT] = ("page", "1")
        parts.append(NEXT)
        for asin in shown:
            product = self._products[asin]
            targets[asin] = ("product", asin)
            parts += [asin, product.title, product.price_tag]
        return self._set("results", _join(*parts), targets)

    def _product(self) -> Product:
        assert self._asin is not None
        return self._products[self._asin]

    def _item_page(self) -> Page:
        product = self._product()
        targets: dict[str, tuple[str, str]] = {BACK: ("back", ""), PREV: ("results", "")}
        parts = [self._instruction(), BACK, PREV]
        for group, values in product.options.items():
            parts.append(group)
            for value in values:
                targets.setdefault(value, ("option", f"{group}\n{value}"))
                parts.append(value)
        parts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
        for sub in SUB_PAGES:
            targets[sub] = ("sub", sub)
            parts.append(sub)
        targets[BUY] = ("buy", "")
        parts.append(BUY)
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
        text = _join(self._instruction(), BACK, PREV, *body)
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
