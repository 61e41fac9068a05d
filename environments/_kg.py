"""The ``kg`` task: answer a question by walking a Freebase-like knowledge graph (AgentBench KG).

Each instance is one item of AgentBench's KnowledgeGraph JSON (see `_kg_data`): a
question, the entities it names (``{name: id}``), the gold action sequence and
the gold answers. The model calls one tool per action; arguments are an entity
(its id such as ``m.0kf01``, or its name as listed in the question) or a
variable ``#N``:

- ``get_relations(variable)``, ``get_attributes(variable)``: list the relations
  (edges to entities) or the numeric/date attributes of the variable's members.
  They make no variable.
- ``get_neighbors(variable, relation)``, ``intersection(variable1, variable2)``,
  ``argmax(variable, attribute)``, ``argmin(variable, attribute)``,
  ``count(variable)``: each makes the next variable of the session, ``#0``, ``#1``,
  ... The observation reads "Variable #N, which are instances of <type>" (the
  relation's expected type) followed by its size and up to five members; a
  count reads "Variable #N, which is a number: <n>". ``argmax``/``argmin`` keep
  every member tied at the extreme value.

As in AgentBench, ``get_neighbors`` needs a relation of the variable,
``argmax``/``argmin`` an attribute of it (no prior listing call is required:
the environment computes them), and ``intersection`` two variables of the same
type. A failed action (an undefined ``#N``, a relation the variable does not
have, mismatched types, a number where entities are needed, an unknown entity)
is an ``Error: ...`` observation: the episode goes on, and the error counts in
``env/errors`` (``env/kg/errors`` in the run's metrics).

The episode ends with a final answer, given either way:

- an assistant message with no tool call whose text holds ``Final Answer: #N``
  (AgentBench's form; ``Find Answer: #N`` too), or
- the ``final_answer(variable)`` tool (for models that only emit tool calls).

An undefined ``#N`` in a final answer is an error observation, not an ending.
The reward is the F1 between the variable's members and the gold answer set
(AgentBench's F1: 0 when nothing matches); success (reward 1.0, status
``completed``) is an exact set match. Other endings, with reward 0: a message
with neither a tool call nor a final answer, an unknown tool or bad arguments ->
``agent_invalid_action``; ``max_turns`` assistant messages without an answer ->
``task_limit_reached``.

Options: ``data=PATH`` (AgentBench KG JSON; default the built-in set),
``graph=PATH`` (an RDF file for the local backend; default the built-in
Turtle graph) or ``endpoint=URL`` (a Freebase SPARQL endpoint), ``max_turns``
(default 15, as AgentBench), ``timeout`` (seconds per SPARQL request).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import structlog

from agentrl.environments._kg_backend import KGBackend, RDFBackend, SPARQLBackend, load_graph
from agentrl.environments._kg_data import (
    CHECK_AGENTS,
    PARAMS,
    ItemError,
    KGItem,
    load_items,
    variable_number,
)
from agentrl.environments._protocol import SessionClosed, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.messages import ChatMessage

__all__ = ["CHECK_AGENTS", "ItemError", "KGItem", "KGTask", "Variable", "f1_score"]

log = structlog.get_logger(__name__)

SHOWN = 5
_FINAL = re.compile(r"(?:Find|Final) Answer:\s*#(\d+)")
_ENTITY_ID = re.compile(r"^[A-Za-z0-9_]+\.[A-Za-z0-9_.\-]+$")

SYSTEM_PROMPT = (
    "You answer questions from a knowledge base by calling its tools. An argument is an "
    "entity (its id, e.g. m.0kf01, or its name as listed with the question) or a variable "
    "#N. get_neighbors, intersection, argmax, argmin and count each make a new variable, "
    "numbered #0, #1, ... in order; get_relations and get_attributes only list what you can "
    "use. Call get_neighbors with a relation from get_relations, argmax/argmin with an "
    "attribute from get_attributes; intersection needs two variables of the same type. "
    "When a variable holds the answer, reply 'Final Answer: #N' or call final_answer."
)

_ARG_DOC = {
    "variable": "An entity id (m.0kf01), an entity name from the question, or a variable #N.",
    "variable1": "A variable #N.",
    "variable2": "A variable #N of the same type as variable1.",
    "relation": "A relation listed by get_relations, e.g. film.film.directed_by.",
    "attribute": "An attribute listed by get_attributes, e.g. film.film.runtime.",
}
_TOOL_DOC = {
    "get_relations": "List the relations from the variable's entities to other entities.",
    "get_neighbors": "Entities reached from the variable along a relation; makes a variable.",
    "intersection": "Entities in both variables (same type); makes a variable.",
    "get_attributes": "List the numeric or date attributes of the variable's entities.",
    "argmax": "The entities with the largest value of an attribute; makes a variable.",
    "argmin": "The entities with the smallest value of an attribute; makes a variable.",
    "count": "The number of entities in the variable; makes a variable (a number).",
    "final_answer": "Give the variable #N that answers the question. This ends the task.",
}


def _tool(name: str, params: tuple[str, ...], **docs: str) -> dict:
    properties = {p: {"type": "string", "description": docs.get(p, _ARG_DOC[p])} for p in params}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": _TOOL_DOC[name],
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


TOOLS: list[dict] = [_tool(name, params) for name, params in PARAMS.items()]
TOOLS.append(_tool("final_answer", ("variable",), variable="The answer variable, e.g. #3."))


@dataclass(frozen=True, slots=True)
class Variable:
    """A set of entity ids (or one value, for a count) and the type of its members."""

    members: frozenset[str]
    type: str | None
    number: bool = False


class _ActionError(Exception):
    """An action the graph cannot carry out; its message is shown to the model."""


@dataclass(slots=True)
class _Session:
    item: KGItem
    variables: list[Variable] = field(default_factory=list)
    relations: dict[frozenset[str], set[str]] = field(default_factory=dict)
    attributes: dict[frozenset[str], set[str]] = field(default_factory=dict)
    turns: int = 0
    actions: int = 0
    errors: int = 0
    done: bool = False


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
        max_turns: int = 15,
        timeout: float = 30.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError("kg: max_turns must be >= 1")
        if graph is not None and endpoint is not None:
            raise ValueError("kg: give graph or endpoint, not both")
        self._items = load_items(data)
        self._max_turns = max_turns
        self.backend: KGBackend = (
            SPARQLBackend(endpoint, timeout=timeout)
            if endpoint is not None
            else RDFBackend(load_graph(graph))
        )

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def num_instances(self) -> int:
        return len(self._items)

    def item(self, index: int) -> KGItem:
        if not 0 <= index < len(self._items):
            raise IndexError(f"kg: index {index} not in [0, {len(self._items)})")
        return self._items[index]

    def describe(self, index: int) -> str:
        item = self.item(index)
        return f"{item.qid} {item.question[:80]!r}"

    def start(self, index: int) -> Start:
        item = self.item(index)
        listed = ", ".join(f"{name} ({eid})" for name, eid in item.entities)
        question = f"Question: {item.question}\nEntities: [{listed}]"
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=question),
        ]
        return Start(session=_Session(item), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        if session.done:
            raise SessionClosed("kg: interact on a session that has ended")
        session.turns += 1
        replies: list[ChatMessage] = []
        if not message.tool_calls:
            final = _FINAL.search(message.content or "")
            if final is None:
                return self._end(session, Status.AGENT_INVALID_ACTION, "no tool call")
            answer = self._answer(session, f"#{final.group(1)}")
            if isinstance(answer, Step):
                return answer
            replies.append(ChatMessage(role="user", content=answer))
        for call in message.tool_calls:
            args = call_arguments(call)
            if call.name == "final_answer":
                variable = args.get("variable") if args is not None else None
                if not isinstance(variable, str | int) or isinstance(variable, bool):
                    why = "bad arguments"
                    return self._end(session, Status.AGENT_INVALID_ACTION, why, replies)
                answer = self._answer(session, str(variable))
                if isinstance(answer, Step):
                    return answer
                replies.append(tool_reply(call, answer))
                continue
            params = PARAMS.get(call.name)
            if params is None:
                return self._end(session, Status.AGENT_INVALID_ACTION, "unknown tool", replies)
            values = [args.get(p) if args is not None else None for p in params]
            if not all(isinstance(v, str) and v.strip() for v in values):
                return self._end(session, Status.AGENT_INVALID_ACTION, "bad arguments", replies)
            replies.append(tool_reply(call, self.run(session, call.name, values)))
        if session.turns >= self._max_turns:
            return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
        return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False, metrics={})

    def cancel(self, session: _Session) -> None:
        session.done = True

    # --- actions ---------------------------------------------------------------------

    def run(self, session: _Session, name: str, args: list[str]) -> str:
        """Carry out one action; the observation (an ``Error: ...`` one when it fails)."""
        session.actions += 1
        try:
            made = self._apply(session, name, [a.strip() for a in args])
        except _ActionError as exc:
            session.errors += 1
            return f"Error: {name}({', '.join(args)}) cannot be executed: {exc}"
        if isinstance(made, str):
            return made
        session.variables.append(made)
        return self._show(len(session.variables) - 1, made)

    def _apply(self, session: _Session, name: str, args: list[str]) -> Variable | str:
        if name == "intersection":
            first, second = (self._variable_only(session, a) for a in args)
            if first.number or second.number:
                raise _ActionError("a number is not a set of entities")
            if first.type and second.type and first.type != second.type:
                raise _ActionError(
                    f"the two variables must have the same type ({first.type} vs {second.type})"
                )
            return Variable(first.members & second.members, first.type or second.type)
        target = self._resolve(session, args[0])
        if name == "count":
            if target.number:
                raise _ActionError(f"{args[0]} is a number, not a set of entities")
            return Variable(frozenset({str(len(target.members))}), "type.int", number=True)
        if target.number:
            raise _ActionError(f"{args[0]} is a number; it has no relations or attributes")
        if name == "get_relations":
            return f"[{', '.join(sorted(self._relations(session, target)))}]"
        if name == "get_attributes":
            return f"[{', '.join(sorted(self._attributes(session, target)))}]"
        if name == "get_neighbors":
            relation = args[1]
            if relation not in self._relations(session, target):
                raise _ActionError(f"{relation} is not a relation of {args[0]} (see get_relations)")
            reached = self.backend.neighbors(target.members, relation)
            return Variable(frozenset(reached), self.backend.relation_type(relation))
        attribute = args[1]  # argmax / argmin
        if attribute not in self._attributes(session, target):
            raise _ActionError(f"{attribute} is not an attribute of {args[0]} (see get_attributes)")
        values = self.backend.attribute_values(target.members, attribute)
        pick = max if name == "argmax" else min
        best = {entity: pick(keys) for entity, keys in values.items() if keys}
        if not best:
            raise _ActionError(f"no member of {args[0]} has a value for {attribute}")
        extreme = pick(best.values())
        return Variable(frozenset(e for e, k in best.items() if k == extreme), target.type)

    def _relations(self, session: _Session, target: Variable) -> set[str]:
        if target.members not in session.relations:
            session.relations[target.members] = self.backend.relations(target.members)
        return session.relations[target.members]

    def _attributes(self, session: _Session, target: Variable) -> set[str]:
        if target.members not in session.attributes:
            session.attributes[target.members] = self.backend.attributes(target.members)
        return session.attributes[target.members]

    def _variable_only(self, session: _Session, arg: str) -> Variable:
        if variable_number(arg) is None:
            raise _ActionError(f"{arg!r} is not a variable #N")
        return self._resolve(session, arg)

    def _resolve(self, session: _Session, arg: str) -> Variable:
        number = variable_number(arg)
        if number is not None:
            if number >= len(session.variables):
                made = len(session.variables)
                defined = f"#0 to #{made - 1}" if made else "none yet"
                raise _ActionError(f"variable #{number} is not defined (defined: {defined})")
            return session.variables[number]
        by_name = dict(session.item.entities)
        folded = {name.casefold(): eid for name, eid in session.item.entities}
        entity = by_name.get(arg) or folded.get(arg.casefold())
        if entity is None and _ENTITY_ID.match(arg):
            entity = arg
        if entity is None:
            raise _ActionError(f"unknown entity {arg!r}: give an id such as m.0abc1 or #N")
        return Variable(frozenset({entity}), None)

    def _show(self, number: int, variable: Variable) -> str:
        if variable.number:
            return f"Variable #{number}, which is a number: {next(iter(variable.members))}"
        size = len(variable.members)
        head = f"Variable #{number}, which are instances of {variable.type or 'unknown type'}"
        if size == 0:
            return f"{head}: no entities (an empty set)"
        shown = sorted(variable.members)[:SHOWN]
        names = self.backend.names(shown)
        listed = ", ".join(f"{names[e]} ({e})" if e in names else e for e in shown)
        more = f", ... ({size - SHOWN} more)" if size > SHOWN else ""
        return f"{head}: {size} entit{'y' if size == 1 else 'ies'}: {listed}{more}"

    # --- the end ---------------------------------------------------------------------

    def _answer(self, session: _Session, variable: str) -> Step | str:
        """The finishing step for a defined ``#N``, else the error observation."""
        number = variable_number(variable)
        if number is None and variable.strip().isdecimal():  # a bare N, as int() reads it
            number = variable_number(f"#{variable.strip()}")
        if number is None or number >= len(session.variables):
            session.errors += 1
            made = len(session.variables)
            return (
                f"Error: invalid final answer {variable!r}: answer with a defined variable "
                f"({'#0 to #' + str(made - 1) if made else 'none made yet'})"
            )
        predicted = session.variables[number].members
        f1 = f1_score(predicted, session.item.answers)
        return self._end(
            session, Status.COMPLETED, "answered", f1=f1, exact=predicted == session.item.answers
        )

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
        session.done = True
        metrics = {
            "env/f1": f1,
            "env/success": float(exact),
            "env/answered": float(status == Status.COMPLETED),
            "env/turns": float(session.turns),
            "env/actions": float(session.actions),
            "env/errors": float(session.errors),
            "env/variables": float(len(session.variables)),
        }
        log.debug("kg episode ended", status=status.value, why=why, **metrics)
        return Step.end(status, f1, metrics, replies)
