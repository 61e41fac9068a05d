"""The ``webshop`` task: find and buy the product an instruction asks for (WebShop).

An instance is one shopping goal (WebShop, Yao et al. 2022): an instruction such
as "i am looking for ground coffee that is usda organic and low acid, and flavor
name vanilla, and price lower than 30.00 dollars". The model browses a shop with
two tools, as in WebShop and AgentBench:

- ``search_action(keywords)``: only on the search page; shows the first results page.
- ``click_action(button)``: a clickable of the current page (shown in brackets):
  a product id, ``Next >``, ``< Prev``, ``Back to Search``, an option value,
  ``Description``, ``Features``, ``Reviews``, ``Buy Now``.

Pages and observations: see `agentrl.environments._webshop_site`. An action the
page does not offer is answered with an ``Invalid action!`` observation and
counted (``env/invalid_actions``); the episode goes on.

Ending: ``Buy Now`` ends the episode ``completed`` with WebShop's reward
(`agentrl.environments._webshop_reward`, in [0, 1]); success means reward 1.0.
No tool call, an unknown tool or bad arguments -> ``agent_invalid_action``;
``max_turns`` assistant messages without buying -> ``task_limit_reached``
(reward 0).

Options:

- ``catalogue=PATH``, ``instructions=PATH``, ``attributes=PATH``: WebShop-format
  data (`agentrl.environments._webshop_catalogue`); default the built-in shop
  (150 products of six types, 30 instructions, ``data/webshop_*.json``).
- ``server=URL``: browse a running WebShop web app instead of the in-process shop
  (`agentrl.environments._webshop_http`); the server computes the reward. Instance
  ``i`` is the server's goal ``i`` (session id ``..._fixed_i``); ``num_instances``
  says how many there are (default: the number of local instructions, which
  should then be the server's goals for ``describe`` and the oracle to hold).
- ``max_turns`` (default 15), ``timeout`` (seconds per HTTP request, default 30).

Sessions share only read-only data (products, goals, the search index); each
holds its own site, so sessions in different threads need no lock.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import SessionClosed, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.environments._webshop_catalogue import (
    Goal,
    Product,
    SearchIndex,
    load_catalogue,
    load_goals,
)
from agentrl.environments._webshop_http import HttpSite
from agentrl.environments._webshop_reward import token_set_ratio
from agentrl.environments._webshop_site import (
    BUY,
    NEXT,
    PRODUCT_WINDOW,
    InvalidAction,
    LocalSite,
    Page,
)
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "WebShopTask"]

log = structlog.get_logger(__name__)

SYSTEM_PROMPT = (
    "You are shopping on a web shop for a customer. The page text separates its parts "
    "with [SEP] and shows clickable elements in brackets, like [Buy Now]. On the search "
    "page, call search_action with keywords. On other pages, call click_action with the "
    "exact text of a clickable: a product id from the results, 'Next >' or '< Prev' to "
    "page, an option value such as a color or size to choose it, 'Description', "
    "'Features' or 'Reviews' to read more, 'Back to Search', and 'Buy Now' to buy the "
    "product with the options you chose. Buying ends the task; you are scored on how "
    "well the product, its options and its price fit the instruction."
)

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "search_action",
            "description": "Search the shop (only on the search page).",
            "parameters": {
                "type": "object",
                "properties": {
                    "keywords": {
                        "type": "string",
                        "description": "The search keywords.",
                        "examples": ["organic ground coffee vanilla"],
                    }
                },
                "required": ["keywords"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "click_action",
            "description": "Click a clickable element shown in brackets on the current page.",
            "parameters": {
                "type": "object",
                "properties": {
                    "button": {
                        "type": "string",
                        "description": "The clickable's text, e.g. a product id or 'Buy Now'.",
                        "examples": ["Next >", "Buy Now"],
                    }
                },
                "required": ["button"],
            },
        },
    },
]

_ARGUMENT = {"search_action": "keywords", "click_action": "button"}


@dataclass(slots=True)
class _Session:
    site: LocalSite | HttpSite
    index: int
    turns: int = 0
    searches: int = 0
    clicks: int = 0
    invalid: int = 0
    done: bool = False


class WebShopTask:
    """The WebShop environment (registered as ``webshop``)."""

    def __init__(
        self,
        *,
        catalogue: str | None = None,
        instructions: str | None = None,
        attributes: str | None = None,
        server: str | None = None,
        num_instances: int | None = None,
        max_turns: int = 15,
        timeout: float = 30.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError("webshop: max_turns must be >= 1")
        if num_instances is not None and server is None:
            raise ValueError("webshop: num_instances is for server=URL only")
        self._products = load_catalogue(catalogue, attributes)
        self._goals = load_goals(instructions, self._products)
        self._index = SearchIndex(self._products)
        self._server = server.rstrip("/") if server else None
        self._count = num_instances if num_instances is not None else len(self._goals)
        self._max_turns = max_turns
        self._timeout = timeout

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def num_instances(self) -> int:
        return self._count

    def goal(self, index: int) -> Goal:
        """The local goal of instance ``index``."""
        if not 0 <= index < len(self._goals):
            raise IndexError(f"webshop: no local goal {index} (there are {len(self._goals)})")
        return self._goals[index]

    def describe(self, index: int) -> str:
        if index >= len(self._goals):
            return f"[server goal {index}]"
        goal = self._goals[index]
        return f"[{goal.asin}] {goal.instruction[:80]!r}"

    def search(self, keywords: str) -> list[str]:
        """The product ids the in-process shop lists for ``keywords``, best first."""
        return self._index.search(keywords)

    def product(self, asin: str) -> Product:
        """A product of the in-process catalogue (KeyError for an unknown id)."""
        return self._products[asin]

    def start(self, index: int) -> Start:
        if not 0 <= index < self._count:
            raise IndexError(f"webshop: index {index} not in [0, {self._count})")
        if self._server is None:
            site: LocalSite | HttpSite = LocalSite(self._products, self._index, self._goals[index])
        else:
            site = HttpSite(self._server, index, timeout=self._timeout)
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=site.page.text),
        ]
        return Start(session=_Session(site, index), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        if session.done:
            raise SessionClosed("webshop: interact on a session that has ended")
        session.turns += 1
        if not message.tool_calls:
            return self._end(session, Status.AGENT_INVALID_ACTION, "no tool call")
        replies: list[ChatMessage] = []
        for call in message.tool_calls:
            key = _ARGUMENT.get(call.name)
            if key is None:
                return self._end(session, Status.AGENT_INVALID_ACTION, "unknown tool", replies)
            args = call_arguments(call)
            value = args.get(key) if args is not None else None
            if not isinstance(value, str) or not value.strip():
                return self._end(session, Status.AGENT_INVALID_ACTION, "bad arguments", replies)
            try:
                page = self._act(session, call.name, value)
            except InvalidAction as exc:
                session.invalid += 1
                replies.append(tool_reply(call, f"Invalid action! {exc}. {_hint(session)}"))
                continue
            replies.append(tool_reply(call, page.text))
            if page.kind == "done":
                return self._end(session, Status.COMPLETED, "bought", replies, page=page)
        if session.turns >= self._max_turns:
            return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
        return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False, metrics={})

    def cancel(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            session.site.close()

    def _act(self, session: _Session, tool: str, value: str) -> Page:
        if tool == "search_action":
            page = session.site.search(value)
            session.searches += 1
        else:
            page = session.site.click(value)
            session.clicks += 1
        return page

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        page: Page | None = None,
    ) -> Step:
        session.done = True
        session.site.close()
        reward = page.reward if page is not None and page.reward is not None else 0.0
        metrics = {
            "env/turns": float(session.turns),
            "env/searches": float(session.searches),
            "env/clicks": float(session.clicks),
            "env/invalid_actions": float(session.invalid),
            "env/purchased": float(page is not None),
            "env/success": float(reward >= 1.0),
        }
        parts = page.parts if page is not None else None
        if parts is not None:
            metrics["env/r_type"] = parts.r_type
            metrics["env/r_attr"] = parts.attr_matches / max(1, parts.n_attributes)
            metrics["env/r_price"] = float(parts.price_ok)
            if parts.n_options:
                metrics["env/r_option"] = parts.option_matches / parts.n_options
        log.debug("webshop episode ended", status=status.value, why=why, reward=reward)
        return Step.end(status, reward, metrics, replies)


def _hint(session: _Session) -> str:
    page = session.site.page
    if page.has_search_bar:
        return "On the search page, use search_action."
    shown = ", ".join(page.clickables)
    return f"Clickables here: {shown}."


# --- scripted agents for `agentrl-env check` ------------------------------------------


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _oracle(env: WebShopTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Search with the instruction, page to the target, pick the goal's options, buy."""
    goal = env.goal(index)
    yield _call("search_action", keywords=goal.instruction)
    results = env.search(goal.instruction)
    position = results.index(goal.asin) if goal.asin in results else 0
    for _ in range(position // PRODUCT_WINDOW):
        yield _call("click_action", button=NEXT)
    yield _call("click_action", button=goal.asin)
    values = [v for group in env.product(goal.asin).options.values() for v in group]
    for wanted in goal.options:
        best = max(
            values,
            key=lambda v: (v.lower() == wanted.lower(), token_set_ratio(v, wanted)),
            default=None,
        )
        if best is not None:
            yield _call("click_action", button=best)
    yield _call("click_action", button=BUY)


def _random(env: WebShopTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Search with the instruction, buy a random first-page result as it comes."""
    goal = env.goal(index)
    yield _call("search_action", keywords=goal.instruction)
    results = env.search(goal.instruction)[:PRODUCT_WINDOW]
    if results:
        yield _call("click_action", button=rng.choice(results))
    yield _call("click_action", button=BUY)


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
