"""Generated levels of the ``kg`` task: relation hops from a named entity of the local graph.

- Level 0: one hop. The question names an entity (with its id) and a relation;
  one ``get_neighbors(entity, relation)`` makes ``#0``, which is the answer.
- Level 1: two hops, ``get_neighbors`` along two named relations in turn, then
  answer ``#1``.

Instances are `KGItem`s whose gold actions are those hops, so the task's oracle
replays them like any data item. They are drawn from every path of the local
RDF graph (`RDFBackend`) whose start is a named entity AgentBench's actions
accept (an id ``m.…``/``f.…``) and whose answer is not empty; the answer leaves
the start out, as AgentBench's query of the variable does (`tasks.kg.actions`): a film's
genre's films are the other films of that genre. The built-in graph holds 132
one-hop and 404 two-hop such paths, so level 0 has about a hundred distinct
training instances there; a bigger ``graph`` file gives more. The content key is
the question.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentrl.environments.tasks.kg.actions import ENTITY
from agentrl.environments.tasks.kg.backend import RDFBackend, _local
from agentrl.environments.tasks.kg.items import Action, KGItem

__all__ = ["GENERATED_LEVELS", "LEVEL_TURNS", "HopPaths"]

GENERATED_LEVELS = (0, 1)
LEVEL_TURNS = {0: 4, 1: 5}
"""Turn limit of each generated level (the full level uses ``max_turns``)."""


@dataclass(frozen=True, slots=True)
class _Hop:
    entity: str
    name: str
    relations: tuple[str, ...]
    answers: frozenset[str]


class HopPaths:
    """Every one- and two-hop path of a local graph, in a fixed order (module doc)."""

    def __init__(self, backend: RDFBackend) -> None:
        subjects = sorted({s for s in map(_local, backend.graph.subjects()) if s})
        names = backend.names(subjects)
        self._paths: dict[int, list[_Hop]] = {0: [], 1: []}
        for entity in subjects:
            if entity not in names or not ENTITY.match(entity):
                continue
            for first in sorted(backend.relations({entity})):
                middle = backend.neighbors({entity}, first)
                if not middle - {entity}:
                    continue
                answer = frozenset(middle - {entity})
                self._paths[0].append(_Hop(entity, names[entity], (first,), answer))
                # the second hop is one of the relations listed for #0 (without the start)
                for second in sorted(backend.relations(middle - {entity})):
                    end = backend.neighbors(middle, second) - {entity}
                    if end:
                        hop = _Hop(entity, names[entity], (first, second), frozenset(end))
                        self._paths[1].append(hop)
        if not self._paths[0]:
            raise ValueError("kg: the graph has no named entity with a relation: no levels 0, 1")

    def count(self, level: int) -> int:
        """How many distinct paths ``level`` draws from."""
        return len(self._paths[level])

    def make(self, level: int, rng: random.Random) -> tuple[KGItem, str]:
        """One instance of ``level`` drawn with ``rng``, and its content key."""
        hop = rng.choice(self._paths[level])
        if level == 0:
            question = (
                f"Which entities are linked to {hop.name} by the relation {hop.relations[0]}?"
            )
        else:
            question = (
                f"Which entities are reached from {hop.name} by the relation "
                f"{hop.relations[0]} and then by the relation {hop.relations[1]}?"
            )
        actions = [Action("get_neighbors", (hop.entity, hop.relations[0]))]
        if level == 1:
            actions.append(Action("get_neighbors", ("#0", hop.relations[1])))
        item = KGItem(
            qid=f"level{level}",
            question=question,
            entities=((hop.name, hop.entity),),
            actions=tuple(actions),
            answers=hop.answers,
            level=level,
        )
        return item, question
