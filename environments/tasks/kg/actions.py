"""The actions of the ``kg`` task on a graph, as AgentBench's ``knowledgegraph/api.py`` does them.

AgentBench keeps a variable as a logical-form program and runs it as one SPARQL
query (``utils/logic_form_util.py`` ``lisp_to_sparql``), which drops every entity
the program names from its result (``FILTER (?x != ns:<entity>)``), while a
variable used inside a later program brings its unfiltered set. So a `Variable`
here holds the set its program derives (`Variable.members`) and the entities it
names (`Variable.entities`); `Variable.visible` is what a listing, a count and a
final answer see. E.g. the films sharing a genre with film F, reached from F,
leave F out.

How each action treats its arguments (``api.py``; an argument is a variable, or
a value passed on as written, after an entity name of the question was replaced
by its id):

- ``get_relations`` and ``get_neighbors`` take a variable or an entity id
  matching ``^([mf])\\.[\\w_]+$``; ``get_neighbors`` needs one of the
  relations ``get_relations`` lists (it computes them itself);
- ``intersection`` takes two variables of the same type; ``get_attributes``,
  ``argmax``, ``argmin`` and ``count`` take a variable only (not an entity);
  ``argmax``/``argmin`` need one of the attributes ``get_attributes`` lists and
  keep every member tied at the extreme value.

A refused action raises `ToolError` with AgentBench's words (Python's own for
what it gets from Python, e.g. ``'str' object has no attribute 'program'``); the
task shows them as ``Error processing tool call: <words>``. Relations and
attributes are those of the backend (entity-valued and numeric/date-valued
predicates), kept to AgentBench's ontology when a `Vocab` is given.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.environments.tasks.kg.backend import KGBackend

__all__ = ["ENTITY", "GraphActions", "ToolError", "Variable", "Vocab", "resolve"]

ENTITY = re.compile(r"^([mf])\.[\w_]+$")
"""An entity id ``get_relations``/``get_neighbors`` accept (``api.py``)."""
NUMBER_TYPE = "type.int"
"""The type of a count (``api.py`` ``count``)."""


class ToolError(Exception):
    """Raised when an action or an argument is refused; the message is shown to the model."""


@dataclass(frozen=True, slots=True)
class Variable:
    """The set a program derives, the entities it names, its type (a count: a number)."""

    members: frozenset[str]
    """The program's set before its named entities are dropped (a count: the counted set)."""
    type: str
    entities: frozenset[str] = frozenset()
    """Entity ids the program names; dropped from `visible`."""
    number: bool = False

    @property
    def visible(self) -> frozenset[str]:
        """What the program's query returns: the members less its entities, or the count."""
        kept = self.members - self.entities
        return frozenset({str(len(kept))}) if self.number else kept


@dataclass(frozen=True, slots=True)
class Vocab:
    """AgentBench's ontology (``ontology/vocab.json``): the relations and attributes it lists."""

    relations: frozenset[str]
    attributes: frozenset[str]

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a ``vocab.json`` (``{"relations": [...], "attributes": [...], ...}``)."""
        raw = json.loads(Path(path).read_text())
        try:
            return cls(frozenset(raw["relations"]), frozenset(raw["attributes"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"kg: {path}: not a vocab.json (relations, attributes)") from exc


def resolve(value: Any, variables: list[Variable], entities: dict[str, str]) -> Any:
    """One argument as AgentBench's ``task.py`` reads it: ``#N`` -> variable N (Python's
    indexing, so ``#-1`` is the last one), a name of the question's entities -> its id,
    anything else as it is. `ToolError` carries Python's words for what fails."""
    try:
        if isinstance(value, str) and value.startswith("#"):
            return variables[int(value[1:])]
        return entities.get(value, value)
    except (ValueError, IndexError, TypeError) as exc:
        raise ToolError(str(exc)) from None


def _no_attribute(value: Any, attribute: str) -> ToolError:
    return ToolError(f"'{type(value).__name__}' object has no attribute '{attribute}'")


class GraphActions:
    """KG actions on ``backend`` (module doc); sessions cache what the graph answered."""

    def __init__(self, backend: KGBackend, vocab: Vocab | None = None) -> None:
        self.backend = backend
        self.vocab = vocab

    def run(self, session: Any, name: str, args: list[Any]) -> str:
        """Carry out one action on resolved ``args``; its observation. `ToolError` if refused.

        ``session`` has ``variables``, ``relations``, ``attributes`` and ``actions``
        (see `tasks.kg.task._Session`); a made variable is appended to ``variables``.
        """
        session.actions += 1
        made, text = getattr(self, f"_{name}")(session, *args)
        if made is None:
            return text
        session.variables.append(made)
        return f"Observation: variable #{len(session.variables) - 1}, {text}"

    # --- listings ----------------------------------------------------------------------

    def _get_relations(self, session: Any, target: Any) -> tuple[None, str]:
        return None, _listing(self._relations(session, target, "get_relations"))

    def _get_attributes(self, session: Any, target: Any) -> tuple[None, str]:
        return None, _listing(self._attributes(session, target))

    def _relations(self, session: Any, target: Any, action: str) -> set[str]:
        if isinstance(target, Variable):
            members = frozenset() if target.number else target.visible
        else:
            try:
                is_entity = ENTITY.match(target) is not None
            except TypeError as exc:  # not text: Python's words, as AgentBench shows them
                raise ToolError(str(exc)) from None
            if not is_entity:
                raise ToolError(f"{action}: variable must be a variable or an entity")
            members = frozenset({target})
        if members not in session.relations:
            found = self.backend.relations(members)
            session.relations[members] = found & self.vocab.relations if self.vocab else found
        return session.relations[members]

    def _attributes(self, session: Any, target: Any) -> set[str]:
        if not isinstance(target, Variable):
            raise _no_attribute(target, "program")
        members = frozenset() if target.number else target.visible
        if members not in session.attributes:
            found = self.backend.attributes(members)
            session.attributes[members] = found & self.vocab.attributes if self.vocab else found
        return session.attributes[members]

    # --- actions that make a variable --------------------------------------------------

    def _get_neighbors(self, session: Any, target: Any, relation: Any) -> tuple[Variable, str]:
        relations = self._relations(session, target, "get_neighbors")
        if not isinstance(relation, str) or relation not in relations:
            raise ToolError("get_neighbors: relation must be a relation of the variable")
        kind = self.backend.relation_type(relation)
        if kind is None:  # AgentBench looks the range up in its ontology: a KeyError
            raise ToolError(repr(relation))
        if isinstance(target, Variable):
            base, named = target.members, target.entities
        else:
            base = named = frozenset({target})
        reached = frozenset(self.backend.neighbors(base, relation))
        return Variable(reached, kind, named), f"which are instances of {kind}"

    def _intersection(self, session: Any, first: Any, second: Any) -> tuple[Variable, str]:
        for value in (first, second):
            if not isinstance(value, Variable):
                raise _no_attribute(value, "type")
        if first.type != second.type:
            raise ToolError("intersection: two variables must have the same type")
        made = Variable(
            first.members & second.members,
            first.type,
            first.entities | second.entities,
            number=first.number and second.number,
        )
        return made, f"which are instances of {first.type}"

    def _argmax(self, session: Any, target: Any, attribute: Any) -> tuple[Variable, str]:
        return self._extreme(session, target, attribute, "argmax")

    def _argmin(self, session: Any, target: Any, attribute: Any) -> tuple[Variable, str]:
        return self._extreme(session, target, attribute, "argmin")

    def _extreme(
        self, session: Any, target: Any, attribute: Any, action: str
    ) -> tuple[Variable, str]:
        """The members holding the extreme value of ``attribute`` among the visible ones
        (AgentBench: the top value of the filtered query, then every member that has it)."""
        attributes = self._attributes(session, target)
        if not isinstance(attribute, str) or attribute not in attributes:
            raise ToolError(f"{action}: attribute must be an attribute of the variable")
        pick = max if action == "argmax" else min
        values = self.backend.attribute_values(target.members, attribute)
        visible = target.visible
        seen = [key for entity, keys in values.items() if entity in visible for key in keys]
        best = pick(seen) if seen else None
        chosen = frozenset(e for e, keys in values.items() if seen and best in keys)
        made = Variable(chosen, target.type, target.entities)
        return made, f"which are instances of {target.type}"

    def _count(self, session: Any, target: Any) -> tuple[Variable, str]:
        if not isinstance(target, Variable):
            raise _no_attribute(target, "program")
        # a count of a count is the same count (AgentBench's COUNT marks the query only)
        return Variable(target.members, NUMBER_TYPE, target.entities, number=True), (
            "which is a number"
        )


def _listing(names: set[str]) -> str:
    return f"Observation: [{', '.join(sorted(names))}]"
