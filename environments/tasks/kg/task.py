"""The ``kg`` task: answer a question by walking a Freebase-like knowledge graph (AgentBench KG).

Each instance is one item of AgentBench's KnowledgeGraph JSON (see `tasks.kg.items`): a
question, the entities it names (``{name: id}``), the gold action sequence and
the gold answers. The episode is AgentBench's ``knowledgegraph/task.py`` with the
``kg-std`` configuration (``configs/tasks/kg.yaml``); its texts are in `tasks.kg.prompt`:

- the system message (the turn limit in it), AgentBench's one-shot example
  (option ``one_shot``, default on as in ``kg-std``), then the question and the
  *names* of its entities: ``<question>\\nEntities: [<name>, ...]``;
- seven tools, ``get_relations``, ``get_neighbors``, ``intersection``,
  ``get_attributes``, ``argmax``, ``argmin``, ``count`` (`tasks.kg.actions`). An
  argument ``#N`` is variable N, a name of the question's entities is its id,
  anything else goes to the action as written. Actions that make a variable
  answer ``Observation: variable #N, which are instances of <type>`` (a count:
  ``which is a number``); the listings ``Observation: [<name>, ...]``;
- the answer is an assistant message without a tool call whose text (before
  any ``Observation:``) holds ``Final Answer: #N`` (``Find Answer: #N`` too);
  a defined ``#N`` ends the episode ``completed`` with reward 1 when the
  variable's set equals the gold ``answer_argument`` set, else 0 (AgentBench's
  reward, ``knowledgegraph/task.py`` lines 116-121; ``env/success`` the same),
  and the F1 between the two sets as ``env/f1`` (AgentBench's ``score``); an
  undefined one ends it ``agent_validation_failed``, reward 0.

Bad calls and failed actions get AgentBench's replies and the episode goes on:
no call and no answer -> the user message `NO_TOOL_CALL`; arguments that are
not JSON, an argument that cannot be read (an undefined ``#N``: "list index
out of range") or an action refused -> ``Error processing tool call: <why>``;
an unknown function -> ``Provide an invalid function name. Function <name> does
not exist``; a missing argument (or a function of AgentBench's API that is not
a tool, such as ``union``) -> ``Arguments do not match the function signature.
Error processing arguments for <name>``. Every call of a message runs, in order.
``max_turns`` assistant messages (15, ``max_rounds`` of ``kg.yaml``; a generated
level has its own limit) without an answer -> ``task_limit_reached``, reward 0.

Options: ``data=PATH`` (AgentBench KG JSON; default the built-in set),
``graph=PATH`` (an RDF file for the local backend; default the built-in
Turtle graph) or ``endpoint=URL`` (a Freebase SPARQL endpoint); on the local graph, data
naming an entity id the graph does not hold is refused with `ItemError` (AgentBench's
Freebase questions need the endpoint; `KGTask.option_problems` says so at a run's
start), ``vocab=PATH``
(AgentBench's ``ontology/vocab.json``: list only its relations and attributes,
as AgentBench does on Freebase), ``max_turns`` (15), ``timeout`` (seconds per
SPARQL request), ``one_shot`` (true), ``answer_tool`` (false; true offers a
``final_answer(variable)`` tool besides the text answer, not AgentBench's),
``reward`` (``exact``; ``f1`` rewards the F1 instead, not AgentBench's);
``split`` (``train``, ``test``, ``all``) and ``seed`` choose the items by a hash
of their question and entities (`tasks.toolkit.split`); ``levels`` (default ``[2]``, the data
set only) mixes in the generated levels of `tasks.kg.levels` (0: one hop, 4 turns;
1: two hops, 5 turns; local graph only): instance ``index`` plays
``levels[index % len(levels)]`` (`tasks.toolkit.levels`), ``generated`` instances per
generated level when level 2 is not among them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.environments._protocol import EnvError, Start, Status, Step
from agentrl.environments._toolcalls import tool_reply
from agentrl.environments.tasks.kg.actions import GraphActions, ToolError, Variable, Vocab, resolve
from agentrl.environments.tasks.kg.backend import KGBackend, RDFBackend, SPARQLBackend, load_graph
from agentrl.environments.tasks.kg.items import (
    CHECK_AGENTS,
    FULL_LEVEL,
    PARAMS,
    ItemError,
    KGItem,
    content_key,
    load_items,
)
from agentrl.environments.tasks.kg.levels import GENERATED_LEVELS, LEVEL_TURNS, HopPaths
from agentrl.environments.tasks.kg.prompt import (
    ANSWER_TOOL,
    API_NAMES,
    NO_TOOL_CALL,
    ONE_SHOT,
    TOOLS,
    bad_arguments,
    invalid_function,
    question_text,
    system_prompt,
    tool_error,
)
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.levels import LevelPlan, check_levels, pick
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "NO_TOOL_CALL", "ItemError", "KGItem", "KGTask", "Variable", "f1_score"]


_FINAL = re.compile(r"(?:Find|Final) Answer: #(\d+)")
"""AgentBench's final-answer pattern (``task.py``): one space, then ``#`` and digits."""


@dataclass(slots=True)
class _Session:
    item: KGItem
    max_turns: int
    entities: dict[str, str]
    """The question's entities, name -> id (names in arguments become ids)."""
    variables: list[Variable] = field(default_factory=list)
    """The variables ``#0``, ``#1``, ... made so far."""
    relations: dict[frozenset[str], set[str]] = field(default_factory=dict)
    attributes: dict[frozenset[str], set[str]] = field(default_factory=dict)
    turns: int = 0
    actions: int = 0
    errors: int = 0
    bad_calls: int = 0
    done: bool = False


def _check_graph_holds(
    items: Sequence[KGItem], backend: RDFBackend, data: str | None, graph: str | None
) -> None:
    """Raise `ItemError` when an item names an entity the local graph does not hold.

    Such an item cannot be played: AgentBench's questions name Freebase entities, and
    played against another graph every action on them finds nothing and every episode
    ends unanswered. They need the graph they were written for, a Freebase endpoint.
    """
    foreign = []
    for index, item in enumerate(items):
        missing = backend.unknown(entity for _, entity in item.entities)
        if missing:
            foreign.append((item.qid or f"item {index}", min(missing)))
    if foreign:
        qid, entity = foreign[0]
        raise ItemError(
            f"kg: {data or 'the built-in kg set'}: {len(foreign)} of {len(items)} items name "
            f"entities that {f'graph {graph}' if graph else 'the built-in graph'} does not "
            f"hold (first {entity}, item {qid}): Freebase questions such as AgentBench's "
            "need endpoint=URL (a Freebase SPARQL endpoint)"
        )


def f1_score(predicted: frozenset[str], gold: frozenset[str]) -> float:
    """AgentBench's F1 of two answer sets (0 when they share nothing)."""
    hits = len(predicted & gold)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(gold)
    return 2 * precision * recall / (precision + recall)


class KGTask:
    """The KG environment (registered as ``kg``)."""

    def __init__(
        self,
        *,
        data: str | None = None,
        graph: str | None = None,
        endpoint: str | None = None,
        vocab: str | None = None,
        max_turns: int = 15,
        timeout: float = 30.0,
        one_shot: bool = True,
        answer_tool: bool = False,
        reward: str = "exact",
        split: str = "train",
        seed: int = 0,
        levels: Sequence[int] = (FULL_LEVEL,),
        generated: int = 1000,
    ) -> None:
        if max_turns < 1 or generated < 1:
            raise ValueError("kg: max_turns and generated must be >= 1")
        if graph is not None and endpoint is not None:
            raise ValueError("kg: give graph or endpoint, not both")
        if reward not in ("exact", "f1"):
            raise ValueError(f"kg: reward must be 'exact' or 'f1', got {reward!r}")
        self._reward = reward
        self._split, self._seed = check_split(split, "kg"), seed
        self._levels = check_levels(levels, (*GENERATED_LEVELS, FULL_LEVEL), "kg")
        items = load_items(data) if FULL_LEVEL in self._levels else []
        self._items = split_items(items, map(content_key, items), split, seed)
        if FULL_LEVEL in self._levels and not self._items:
            raise ValueError(f"kg: the {split} split of the data holds no item")
        self._plan = LevelPlan(self._levels, FULL_LEVEL, len(self._items), generated)
        self._max_turns = max_turns
        self._one_shot, self.answer_tool = bool(one_shot), bool(answer_tool)
        self._params = {**PARAMS, "final_answer": ("variable",)} if answer_tool else PARAMS
        self.backend: KGBackend = (
            SPARQLBackend(endpoint, timeout=timeout)
            if endpoint is not None
            else RDFBackend(load_graph(graph))
        )
        if isinstance(self.backend, RDFBackend):
            _check_graph_holds(items, self.backend, data, graph)
        self._actions = GraphActions(self.backend, Vocab.load(vocab) if vocab else None)
        self._paths: HopPaths | None = None
        if set(self._levels) - {FULL_LEVEL}:
            if not isinstance(self.backend, RDFBackend):
                raise ValueError("kg: levels 0 and 1 need the local graph, not an endpoint")
            self._paths = HopPaths(self.backend)

    @staticmethod
    def option_problems(**options: Any) -> list[str]:
        """Why the task cannot be built with ``options``, in one line (empty when it can):
        the run config's check at start (`task_problems`), so that data the task cannot
        judge (Freebase questions without an endpoint) stops a run before it starts. It
        builds the task: items and graph are read, no endpoint is asked."""
        try:
            KGTask(**options)
        except (EnvError, ValueError, TypeError, OSError) as exc:
            return [str(exc)]
        return []

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy([*TOOLS, ANSWER_TOOL] if self.answer_tool else TOOLS)

    @property
    def levels(self) -> tuple[int, ...]:
        """The ``levels`` option: instance ``index`` plays ``levels[index % len(levels)]``."""
        return tuple(self._levels)

    @property
    def num_instances(self) -> int:
        return self._plan.num_instances

    def item(self, index: int) -> KGItem:
        """The item instance ``index`` plays (a data-set item or a generated one)."""
        make = self._paths.make if self._paths is not None else None  # None: full level only
        return pick("kg", self._plan, index, self._items, self._split, self._seed, make)

    def describe(self, index: int) -> str:
        item = self.item(index)
        return f"{item.qid} {item.question[:80]!r}"

    def start(self, index: int) -> Start:
        item = self.item(index)
        limit = min(self._max_turns, LEVEL_TURNS.get(item.level, self._max_turns))
        messages = [
            ChatMessage("system", system_prompt(limit, answer_tool=self.answer_tool)),
            *(copy.deepcopy(list(ONE_SHOT)) if self._one_shot else []),
            ChatMessage("user", question_text(item.question, [name for name, _ in item.entities])),
        ]
        return Start(session=_Session(item, limit, dict(item.entities)), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn("kg", session)
        replies: list[ChatMessage] = []
        if not message.tool_calls:
            text = (message.content or "").split("Observation:")[0].replace("\\_", "_")
            final = _FINAL.search(text)
            if final is not None:
                return self._answer(session, final.group(1))
            replies.append(no_tool_call(session, NO_TOOL_CALL))
        for call in message.tool_calls:
            reply = self._call(session, call)
            if isinstance(reply, Step):
                return Step.end(reply.status, reply.reward, reply.metrics, replies)
            replies.append(tool_reply(call, reply))
        return after_turn(session, replies, self._end)

    def _call(self, session: _Session, call: ToolCall) -> Step | str:
        """One tool call: its tool message, or the finishing step of a ``final_answer``.
        In AgentBench's order: JSON, function name, each argument, the action."""
        try:
            args = json.loads(call.arguments)
        except (ValueError, RecursionError) as exc:
            session.bad_calls += 1
            return tool_error(exc)
        params = self._params.get(call.name)
        if params is None:
            session.bad_calls += 1
            known = call.name in API_NAMES
            return bad_arguments(call.name) if known else invalid_function(call.name)
        values = []
        for param in params:
            try:
                value = args[param]
            except KeyError:
                session.bad_calls += 1
                return bad_arguments(call.name)
            except TypeError as exc:  # arguments that are not an object: Python's words
                session.bad_calls += 1
                return tool_error(exc)
            try:
                values.append(resolve(value, session.variables, session.entities))
            except ToolError as exc:
                session.errors += 1
                return tool_error(exc)
        if call.name == "final_answer":
            if isinstance(values[0], Variable):
                return self._finish(session, values[0])
            session.errors += 1
            return tool_error("final_answer: the answer must be a variable #N")
        try:
            return self._actions.run(session, call.name, values)
        except ToolError as exc:
            session.errors += 1
            return tool_error(exc)

    def cancel(self, session: _Session) -> None:
        session.done = True

    # --- the end ---------------------------------------------------------------------

    def _answer(self, session: _Session, digits: str) -> Step:
        """A text final answer ``#<digits>``: AgentBench ends an undefined one as a
        validation failure."""
        number = int(digits) if len(digits) <= 18 else None
        if number is None or number >= len(session.variables):
            return self._end(session, Status.AGENT_VALIDATION_FAILED, "undefined answer")
        return self._finish(session, session.variables[number])

    def _finish(self, session: _Session, answer: Variable) -> Step:
        predicted = answer.visible
        f1 = f1_score(predicted, session.item.answers)
        exact = predicted == session.item.answers
        return self._end(session, Status.COMPLETED, "answered", f1=f1, exact=exact)

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        f1: float = 0.0,
        exact: bool = False,
    ) -> Step:
        metrics = {
            "env/f1": f1,
            "env/answered": float(status == Status.COMPLETED),
            "env/actions": float(session.actions),
            "env/errors": float(session.errors),
            "env/variables": float(len(session.variables)),
        }
        reward = f1 if self._reward == "f1" else float(exact)
        return end_episode(
            "kg",
            session,
            status,
            why,
            replies,
            level=session.item.level,
            success=exact,
            reward=reward,
            metrics=metrics,
        )
