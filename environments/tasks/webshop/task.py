"""The ``webshop`` task: find and buy the product an instruction asks for (WebShop).

An instance is one shopping goal (WebShop, Yao et al. 2022): an instruction such
as "i am looking for ground coffee that is usda organic and low acid, and flavor
name vanilla, and price lower than 30.00 dollars". The model browses a shop in the
words AgentBench uses (``src/server/tasks/webshop/task.py`` and the tools of
``configs/tasks/webshop.yaml``; the constants cite their lines): its system prompt
`SYSTEM_PROMPT`, its two tools `TOOLS`:

- ``search_action(keywords)``: shows the first results page (from any page, as
  WebShop's text environment searches wherever it is);
- ``click_action(value)``: a clickable of the current page, as the available actions
  list it: a product id, ``next >``, ``< prev``, ``back to search``, an option value,
  ``description``, ``features``, ``reviews``, ``buy now`` (any case);

the first user message `FIRST_OBSERVATION` (the search page and its available
actions), and after each played action the tool message `ACTION_REPLY`
(``Action: click[...]``, the new page, its available actions). Pages and available
actions are WebShop's: see `agentrl.environments.tasks.webshop.site`. An action the
page does not offer leaves the page as it is, as WebShop's ``step`` does (the tool
message shows the same page again); it is counted (``env/invalid_actions``).

Bad calls follow AgentBench's ``src/server/tasks/webshop/task.py`` (the constants
cite its lines), as user messages, and the episode goes on: no tool call ->
``Observation:`` `NO_TOOL_CALL` with the available actions; arguments that are not
a non-empty JSON object -> `NO_VALID_CALL`, then the last observation again; an
unknown function -> the last observation again. Only the first call of a message
is played, with its first argument's value (any key; a non-string is written out
with ``str``). Counted: ``env/bad_calls``.

Ending: ``Buy Now`` ends the episode ``completed`` with WebShop's reward
(`agentrl.environments.tasks.webshop.reward`, in [0, 1]) or, at levels 0 and 1, the
exact one (`agentrl.environments.tasks.webshop.levels`); success means reward 1.0.
Its tool message shows the done page (AgentBench sends nothing after a purchase; no
model turn follows either way).
The turn limit (every assistant message counts) without buying ->
``task_limit_reached``, reward 0, with AgentBench's tool message `LIMIT_REACHED`.

Options:

- ``catalogue=PATH``, ``instructions=PATH``, ``attributes=PATH``: WebShop-format
  data (`agentrl.environments.tasks.webshop.catalogue`); default the built-in shop,
  generated (`agentrl.environments.tasks.webshop.generate`): twelve product types,
  ``products_per_type`` (500) products and ``goals_per_type`` (250) instructions per
  type, 6,000 products and 3,000 instructions by default.
- ``server=URL``: browse a running WebShop web app instead of the in-process shop
  (`agentrl.environments.tasks.webshop.http`); the server computes the reward. Instance
  ``i`` is the server's goal ``i`` (session id ``..._fixed_i``); ``num_instances``
  says how many there are (default: the number of local instructions, which
  should then be the server's goals for ``describe`` and the oracle to hold).
- ``levels`` (default ``[2]``, the full task), ``split`` (``train``, ``test`` or
  ``all``; by product, see `agentrl.environments.tasks.webshop.levels`), ``seed``.
  With a server, level 2 only, and the split is a seeded hash of the goal number.
- ``max_turns`` (default: the level's, 20 for the full task as AgentBench),
  ``timeout`` (seconds per HTTP request, default 30).

Sessions share only read-only data (products, goals, the search index); each
holds its own site, so sessions in different threads need no lock.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from agentrl.environments._protocol import Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, function_tool, tool_reply
from agentrl.environments.tasks.toolkit.episode import begin_turn, end_episode
from agentrl.environments.tasks.toolkit.levels import CycledLevels
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.environments.tasks.webshop.agents import SCRIPTS
from agentrl.environments.tasks.webshop.catalogue import (
    BUILTIN_SIZE,
    Goal,
    Product,
    SearchIndex,
    load_catalogue,
    load_goals,
)
from agentrl.environments.tasks.webshop.http import HttpSite
from agentrl.environments.tasks.webshop.levels import (
    FULL,
    LEVEL_TURNS,
    LEVELS,
    exact_reward,
    level_goals,
    split_asins,
)
from agentrl.environments.tasks.webshop.reward import purchase_reward
from agentrl.environments.tasks.webshop.site import InvalidAction, LocalSite, Page
from agentrl.messages import ChatMessage

__all__ = [
    "ACTION_REPLY",
    "CHECK_AGENTS",
    "FIRST_OBSERVATION",
    "LIMIT_REACHED",
    "NO_TOOL_CALL",
    "NO_VALID_CALL",
    "OBSERVATION",
    "SYSTEM_PROMPT",
    "TOOLS",
    "WebShopTask",
]


SYSTEM_PROMPT = """
You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions,
you have to respond with calling a tool provided based on the state and instruction.
You can use search tool if search is available.
You can click one of the buttons in clickables.
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your should first think about what to do, then call a tool correspondingly.
You should always use a tool, even if you have questions to confirm. You can use whatever tool is available and do not need permission from the user.
"""  # noqa: E501
"""AgentBench's system prompt, ``prompt_with_max_turn`` (webshop/task.py:17-30), as it is."""

TOOLS: list[dict] = [
    function_tool(
        "search_action",
        "Use search functionality with specified keywords.",
        {
            "keywords": {
                "type": "string",
                "description": "The keywords to use in the search function.",
            }
        },
        ["keywords"],
    ),
    function_tool(
        "click_action",
        "Click a button or link with a specified value.",
        {
            "value": {
                "type": "string",
                "description": "The value to click from the list of available actions.",
            }
        },
        ["value"],
    ),
]
"""AgentBench's tools (configs/tasks/webshop.yaml:6-31), as they are."""

FIRST_OBSERVATION = "The initial observation:\n{observation}\n\nAvailable Actions:\n{available}"
"""The first user message (AgentBench webshop/task.py:71)."""

OBSERVATION = "Observation:\n{observation}\n\nAvailable Actions:\n{available}"
"""The user message after a round without an action (AgentBench webshop/task.py:77)."""

ACTION_REPLY = "Action: {action}\n\nObservation:\n{observation}\n\nAvailable Actions:\n{available}"
"""The tool message after a played action (AgentBench webshop/task.py:82); the action is
``search[<keywords>]`` or ``click[<value>]`` (lines 106, 108)."""

NO_TOOL_CALL = "No executable tool calls found! You should call a tool instead."
"""The observation after a message without a tool call (AgentBench webshop/task.py:95)."""

NO_VALID_CALL = "No valid tool call found from agent."
"""The user reply to a call whose arguments cannot be read (AgentBench webshop/task.py:113)."""

_TOOL_NAMES = ("search_action", "click_action")

LIMIT_REACHED = "Task limit reached."
"""The tool message that ends an episode at the turn limit (AgentBench webshop/task.py:144)."""


@dataclass(slots=True)
class _Session:
    site: LocalSite | HttpSite
    index: int
    level: int
    max_turns: int
    observation: str
    """The last observation shown (AgentBench repeats it after an unusable call)."""
    turns: int = 0
    searches: int = 0
    clicks: int = 0
    invalid: int = 0
    bad_calls: int = 0
    last_call: str | None = None
    """The id of the last call played (AgentBench's ``call_id``)."""
    done: bool = False


class WebShopTask(CycledLevels):
    """The WebShop environment (registered as ``webshop``)."""

    def __init__(
        self,
        *,
        catalogue: str | None = None,
        instructions: str | None = None,
        attributes: str | None = None,
        products_per_type: int = BUILTIN_SIZE[0],
        goals_per_type: int = BUILTIN_SIZE[1],
        server: str | None = None,
        num_instances: int | None = None,
        max_turns: int | None = None,
        timeout: float = 30.0,
        split: str = "train",
        seed: int = 0,
        levels: list[int] | tuple[int, ...] | None = None,
    ) -> None:
        if max_turns is not None and max_turns < 1:
            raise ValueError("webshop: max_turns must be >= 1")
        if num_instances is not None and server is None:
            raise ValueError("webshop: num_instances is for server=URL only")
        self._levels = tuple(levels) if levels is not None else (FULL,)
        if not self._levels or any(lv not in LEVELS for lv in self._levels):
            raise ValueError(f"webshop: levels must be a non-empty list of {LEVELS}")
        if server is not None and self._levels != (FULL,):
            raise ValueError(f"webshop: a server plays level {FULL} only")
        self._split = check_split(split, "webshop")
        if catalogue is not None and instructions is None:
            raise ValueError("webshop: a catalogue=PATH needs its instructions=PATH")
        builtin = (products_per_type, goals_per_type)
        self._products = load_catalogue(catalogue, attributes, builtin=builtin)
        self._goals = load_goals(instructions, self._products, builtin=builtin)
        self._index = SearchIndex(self._products)
        self._server = server.rstrip("/") if server else None
        self._max_turns = max_turns
        self._task, self._level_turns = "webshop", LEVEL_TURNS
        self._timeout = timeout
        self._numbers: list[int] = []
        """Server goal numbers in the split (server only)."""
        self._by_level: dict[int, list[Goal]] = {}
        if self._server is not None:
            total = num_instances if num_instances is not None else len(self._goals)
            numbers = list(range(total))
            keys = [f"goal:{n}" for n in numbers]
            self._numbers = split_items(numbers, keys, self._split, seed)
            self._count = len(self._numbers)
            return
        asins = split_asins(self._products, self._split, seed)
        for level in self._levels:
            found = level_goals(level, self._products, self._goals, asins, self._split, seed)
            if not found:
                raise ValueError(f"webshop: level {level} has no instance in split {split!r}")
            self._by_level[level] = found
        self._count = len(self._levels) * max(len(g) for g in self._by_level.values())

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    def goal(self, index: int) -> Goal:
        """The local goal of instance ``index`` (with a server: the local goal of its number)."""
        level = self.level(index)
        if self._server is not None:
            number = self._numbers[index]
            if number >= len(self._goals):
                raise IndexError(f"webshop: no local goal {number} ({len(self._goals)} known)")
            return self._goals[number]
        goals = self._by_level[level]
        return goals[(index // len(self._levels)) % len(goals)]

    def describe(self, index: int) -> str:
        if self._server is not None and self._numbers[index] >= len(self._goals):
            return f"[server goal {self._numbers[index]}]"
        goal = self.goal(index)
        return f"[level {self.level(index)}, {goal.asin}] {goal.instruction[:80]!r}"

    def search(self, keywords: str) -> list[str]:
        """The product ids the in-process shop lists for ``keywords``, best first."""
        return self._index.search(keywords)

    def product(self, asin: str) -> Product:
        """A product of the in-process catalogue (KeyError for an unknown id)."""
        return self._products[asin]

    def start(self, index: int) -> Start:
        level = self.level(index)
        if self._server is None:
            judge = purchase_reward if level == FULL else exact_reward
            site: LocalSite | HttpSite = LocalSite(
                self._products, self._index, self.goal(index), judge
            )
        else:
            site = HttpSite(self._server, self._numbers[index], timeout=self._timeout)
        first = FIRST_OBSERVATION.format(
            observation=site.page.text, available=site.page.available_actions()
        )
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=first),
        ]
        session = _Session(site, index, level, self.turn_limit(level), site.page.text)
        return Start(session=session, messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn("webshop", session)
        # AgentBench injects `now` in this round and `later` at the start of the next one,
        # so at the turn limit only `now` is sent.
        now: list[ChatMessage] = []
        later: list[ChatMessage] = []
        args = call_arguments(message.tool_calls[0]) if message.tool_calls else None
        known = bool(message.tool_calls) and message.tool_calls[0].name in _TOOL_NAMES
        if not message.tool_calls:
            session.bad_calls += 1
            session.observation = NO_TOOL_CALL
            later.append(self._observation(session))
        elif args is None or (known and not args):  # json.loads/.values() or [0] fails
            session.bad_calls += 1
            now.append(ChatMessage(role="user", content=NO_VALID_CALL))
            later.append(self._observation(session))
        elif not known:
            session.bad_calls += 1
            later.append(self._observation(session))
        else:
            call = message.tool_calls[0]
            value = next(iter(args.values()))
            value = value if isinstance(value, str) else str(value)
            session.last_call = call.id
            try:
                page = self._act(session, call.name, value)
            except InvalidAction:  # WebShop leaves the page as it is
                session.invalid += 1
                page = session.site.page
            session.observation = page.text
            verb = "search" if call.name == "search_action" else "click"
            reply = tool_reply(
                call,
                ACTION_REPLY.format(
                    action=f"{verb}[{value}]",
                    observation=page.text,
                    available=page.available_actions(),
                ),
            )
            if page.kind == "done":
                return self._end(session, Status.COMPLETED, "bought", [reply], page=page)
            later.append(reply)
        if session.turns >= session.max_turns:
            limit = ChatMessage(role="tool", content=LIMIT_REACHED, tool_call_id=session.last_call)
            return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", [*now, limit])
        return Step(messages=now + later, status=Status.RUNNING, reward=0.0, finish=False)

    @staticmethod
    def _observation(session: _Session) -> ChatMessage:
        """AgentBench's user message after a round without an action (webshop/task.py:75-78)."""
        available = session.site.page.available_actions()
        text = OBSERVATION.format(observation=session.observation, available=available)
        return ChatMessage(role="user", content=text)

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
        session.site.close()
        reward = page.reward if page is not None and page.reward is not None else 0.0
        metrics = {
            "env/searches": float(session.searches),
            "env/clicks": float(session.clicks),
            "env/invalid_actions": float(session.invalid),
            "env/purchased": float(page is not None),
        }
        parts = page.parts if page is not None else None
        if parts is not None:
            metrics["env/r_type"] = parts.r_type
            metrics["env/r_attr"] = parts.attr_matches / max(1, parts.n_attributes)
            metrics["env/r_price"] = float(parts.price_ok)
            if parts.n_options:
                metrics["env/r_option"] = parts.option_matches / parts.n_options
        return end_episode(
            "webshop",
            session,
            status,
            why,
            replies,
            level=session.level,
            success=reward >= 1.0,
            reward=reward,
            metrics=metrics,
        )


CHECK_AGENTS = SCRIPTS
"""Scripted agents for `agentrl-env check` (see agentrl.environments._check)."""
