"""Items of the ``kg`` task (AgentBench's KnowledgeGraph JSON) and its action grammar.

A data file is a JSON list of items: ``question``, ``entities`` (``{name: id}``),
``actions`` (the gold action sequence, e.g. ``get_neighbors(m.0j50kb6,rel)``,
``intersection(#0,#1)``, ``count(#2)``) and ``answer`` (a list of
``{answer_argument, entity_name, answer_type}``); ``qid`` and ``s_expression``
are kept when present. Loading checks every gold action against the grammar
and the ``#N`` numbering: an action may only name variables made before it.

The scripted agents of ``agentrl-env check`` live here too (`CHECK_AGENTS`, offered
by the task module): ``oracle`` replays the gold actions through the tools (an
entity of the question by its name, as the question shows it) and answers the
last variable; ``random`` takes one or two hops along random relations from a
random entity of the question and answers that. Both answer as AgentBench asks,
with the text ``Final Answer: #N`` (with the ``final_answer`` tool when the task
offers it).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.environments._protocol import EnvError
from agentrl.messages import ToolCall

__all__ = [
    "CHECK_AGENTS",
    "CREATES",
    "FULL_LEVEL",
    "PARAMS",
    "Action",
    "ItemError",
    "KGItem",
    "content_key",
    "load_items",
    "parse_action",
    "variable_number",
]

PARAMS: dict[str, tuple[str, ...]] = {
    "get_relations": ("variable",),
    "get_neighbors": ("variable", "relation"),
    "intersection": ("variable1", "variable2"),
    "get_attributes": ("variable",),
    "argmax": ("variable", "attribute"),
    "argmin": ("variable", "attribute"),
    "count": ("variable",),
}
"""Each KG action and the names of its arguments (also its tool's parameters)."""
CREATES = frozenset({"get_neighbors", "intersection", "argmax", "argmin", "count"})
"""Actions that make the next variable ``#N``; the others only list."""

_ACTION = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.DOTALL)
_VARIABLE = re.compile(r"^\s*(?:variable\s+)?#(\d+)\s*$", re.IGNORECASE)


class ItemError(EnvError):
    """A kg data item that cannot be used: malformed, or a gold action that does not parse."""


@dataclass(frozen=True, slots=True)
class Action:
    """One parsed KG action, e.g. ``get_neighbors(#0, film.film.genre)``."""

    name: str
    args: tuple[str, ...]
    """The arguments as written (entity ids or names, ``#N``, relations), stripped."""

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)})"


@dataclass(frozen=True, slots=True)
class KGItem:
    """One question with its entities, gold actions and gold answers."""

    qid: str
    question: str
    entities: tuple[tuple[str, str], ...]
    """(name, id) of the entities the question mentions, in the data's order."""
    actions: tuple[Action, ...]
    answers: frozenset[str]
    """Gold ``answer_argument`` values (entity ids, or values such as a count)."""
    answer_names: tuple[str, ...] = ()
    level: int = 2
    """The graded level this item plays (`tasks.kg.levels`; the data set's items are level 2)."""


FULL_LEVEL = 2
"""The level number of the data set's items (AgentBench's task); 0 and 1 are generated."""


def content_key(item: KGItem) -> str:
    """What makes an item itself, for the train/test split: its question and entities."""
    return json.dumps([item.question, sorted(item.entities)])


def variable_number(text: str) -> int | None:
    """N for ``#N`` (also ``variable #N``), else None; an N of over 18 digits reads as 10**18."""
    match = _VARIABLE.match(text)
    if match is None:
        return None
    digits = match.group(1)
    return int(digits) if len(digits) <= 18 else 10**18  # no session defines that many


def parse_action(text: str) -> Action:
    """``name(arg, ...)`` -> `Action`; ValueError says what does not fit the grammar.

    Two-argument actions split at the last comma, so an entity name may hold commas.
    """
    match = _ACTION.match(text)
    if match is None:
        raise ValueError(f"not an action call: {text!r}")
    name, inner = match.group(1), match.group(2)
    params = PARAMS.get(name)
    if params is None:
        raise ValueError(f"unknown action {name!r} in {text!r}")
    args = [inner] if len(params) == 1 else inner.rsplit(",", 1)
    args = [a.strip() for a in args]
    if len(args) != len(params) or not all(args):
        raise ValueError(f"{name} takes {len(params)} argument(s): {text!r}")
    return Action(name, tuple(args))


def _check_numbering(actions: list[Action], where: str) -> None:
    made = 0
    for action in actions:
        for arg in action.args:
            n = variable_number(arg)
            if n is not None and n >= made:
                raise ItemError(f"{where}: {action} uses #{n} before it is made")
        made += action.name in CREATES


def parse_item(raw: Any, where: str) -> KGItem:
    """One AgentBench KG item -> `KGItem`; `ItemError` names what is wrong."""
    try:
        entities = raw.get("entities") or {}
        if not isinstance(entities, dict):
            raise TypeError("entities must be an object {name: id}")
        answers = raw["answer"]
        if not isinstance(answers, list) or not answers:
            raise TypeError("answer must be a non-empty list")
        item = KGItem(
            qid=str(raw.get("qid", "")),
            question=str(raw["question"]),
            entities=tuple((str(k), str(v)) for k, v in entities.items()),
            actions=tuple(parse_action(str(a)) for a in raw.get("actions") or []),
            answers=frozenset(str(a["answer_argument"]) for a in answers),
            answer_names=tuple(str(a.get("entity_name", "")) for a in answers),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ItemError(f"{where}: not a kg item ({type(exc).__name__}: {exc})") from exc
    except ValueError as exc:
        raise ItemError(f"{where}: bad gold action: {exc}") from exc
    _check_numbering(list(item.actions), where)
    return item


def load_items(path: str | Path | None = None) -> list[KGItem]:
    """Items of a KG JSON file (the built-in set ``data/kg_builtin.json`` when None)."""
    if path is None:
        source = resources.files("agentrl.environments.tasks.kg").joinpath("data/kg_builtin.json")
        text, where = source.read_text(), "built-in kg set"
    else:
        text, where = Path(path).read_text(), str(path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ItemError(f"{where}: not JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(raw, list) or not raw:
        raise ItemError(f"{where}: expected a non-empty JSON list of items")
    items = []
    for index, entry in enumerate(raw):
        qid = entry.get("qid") if isinstance(entry, dict) else None
        items.append(parse_item(entry, f"{where}[{index}]" + (f" ({qid})" if qid else "")))
    return items


# --- scripted agents for `agentrl-env check` (env: a KGTask) ---------------------------


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _final(env: Any, number: int) -> ToolCall | str:
    """The answer ``#number``: AgentBench's text, or the task's ``final_answer`` tool."""
    if getattr(env, "answer_tool", False):
        return _call("final_answer", variable=f"#{number}")
    return f"Final Answer: #{number}"


def _oracle(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall | str]:
    """Replay the item's gold actions through the tools, then answer the last variable."""
    item = env.item(index)
    names = {e: name for name, e in reversed(item.entities) if not name.startswith("#")}
    for action in item.actions:
        args = [names.get(arg, arg) for arg in action.args]
        yield _call(action.name, **dict(zip(PARAMS[action.name], args, strict=True)))
    made = sum(action.name in CREATES for action in item.actions)
    yield _final(env, max(made - 1, 0))


def _random(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall | str]:
    """One or two hops along random relations from a random entity, then answer that."""
    item = env.item(index)
    if not item.entities:
        yield _final(env, 0)
        return
    name, entity = rng.choice(item.entities)
    reached, shown, arg, made = {entity}, {entity}, name, 0
    for _ in range(rng.choice((1, 2))):
        relations = sorted(env.backend.relations(shown))
        if not relations:
            break
        relation = rng.choice(relations)
        yield _call("get_relations", variable=arg)
        yield _call("get_neighbors", variable=arg, relation=relation)
        reached = env.backend.neighbors(reached, relation)
        shown = reached - {entity}  # a variable's listings leave out the entity it starts at
        arg, made = f"#{made}", made + 1
    yield _final(env, max(made - 1, 0))


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
