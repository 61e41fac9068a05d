"""Knowledge-graph backends of the ``kg`` task: a local rdflib graph or a SPARQL endpoint.

Both speak Freebase's shape: every entity, relation and type is an IRI under
``http://rdf.freebase.com/ns/`` and is named by its local part (``m.0j50kb6``,
``film.film.directed_by``, ``film.film``). Names come from ``type.object.name``,
types from ``type.object.type`` and a relation's range from
``type.property.expected_type``. The kinds of edges, as the task uses them:

- a *relation* links an entity to another entity (an object IRI under ``ns:``);
  schema predicates (``type.*``) are not relations;
- an *attribute* links an entity to a number or a date (a typed literal), the
  values ``argmax``/``argmin`` compare.

`KGBackend` is the protocol; `RDFBackend` walks an rdflib Graph (the built-in
Turtle file or any ``graph=PATH``) and `SPARQLBackend` sends SPARQL 1.1 queries
over HTTP, shaped like AgentBench's executor, to a Freebase endpoint (Virtuoso).
A backend that cannot answer raises `InfraError` (the environment broke, not the
model).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterable
from importlib import resources
from pathlib import Path
from typing import Protocol

import rdflib
from rdflib import Literal, URIRef

from agentrl.environments._protocol import InfraError

__all__ = ["NS", "KGBackend", "RDFBackend", "SPARQLBackend", "load_graph", "value_key"]

NS = "http://rdf.freebase.com/ns/"
XSD = "http://www.w3.org/2001/XMLSchema#"
NUMERIC = {f"{XSD}{t}" for t in ("integer", "int", "long", "float", "double", "decimal")}
TEMPORAL = {f"{XSD}{t}" for t in ("date", "dateTime", "gYear", "gYearMonth")}
_NAME = URIRef(NS + "type.object.name")
_TYPE = URIRef(NS + "type.object.type")
_EXPECTED = URIRef(NS + "type.property.expected_type")
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
"""What an id (an IRI's local part under ns:) may look like; anything else is not queried."""


class KGBackend(Protocol):
    """What the kg task asks of a knowledge graph; sets of ids in, sets of ids out."""

    def relations(self, entities: Collection[str]) -> set[str]:
        """Relations leaving any of ``entities`` (towards another entity)."""
        ...

    def neighbors(self, entities: Collection[str], relation: str) -> set[str]:
        """Entities reached from any of ``entities`` along ``relation``."""
        ...

    def attributes(self, entities: Collection[str]) -> set[str]:
        """Numeric or date attributes of any of ``entities``."""
        ...

    def attribute_values(self, entities: Collection[str], attribute: str) -> dict[str, list]:
        """Each entity that has ``attribute`` -> its values as `value_key` tuples."""
        ...

    def names(self, entities: Collection[str]) -> dict[str, str]:
        """Display names (``type.object.name``) of those entities that have one."""
        ...

    def relation_type(self, relation: str) -> str | None:
        """The type a relation leads to (``type.property.expected_type``), if known."""
        ...


def value_key(lexical: str, datatype: str | None) -> tuple[int, float | str]:
    """A sortable key of a literal: numbers by value, dates by their ISO text.

    Keys of different kinds compare by kind first, so a mix never raises.
    """
    if datatype in TEMPORAL:
        return (1, lexical)
    try:
        return (0, float(lexical))
    except ValueError:
        return (1, lexical)


def _local(term: object) -> str | None:
    text = str(term)
    return text[len(NS) :] if isinstance(term, URIRef) and text.startswith(NS) else None


def _is_relation(name: str) -> bool:
    return not name.startswith("type.")


def load_graph(path: str | Path | None = None) -> rdflib.Graph:
    """The built-in Turtle graph, or the RDF file at ``path`` (format from its suffix)."""
    graph = rdflib.Graph()
    if path is None:
        text = (
            resources.files("agentrl.environments.tasks.kg")
            .joinpath("data/kg_builtin.ttl")
            .read_text()
        )
        graph.parse(data=text, format="turtle")
    else:
        graph.parse(str(path))
    return graph


class RDFBackend:
    """A knowledge graph held in memory as an rdflib Graph; reads under one lock."""

    def __init__(self, graph: rdflib.Graph) -> None:
        self.graph = graph
        self._lock = threading.Lock()

    def _subjects(self, entities: Iterable[str]) -> list[URIRef]:
        return [URIRef(NS + e) for e in entities if _ID.match(e)]

    def relations(self, entities: Collection[str]) -> set[str]:
        found: set[str] = set()
        with self._lock:
            for subject in self._subjects(entities):
                for p, o in self.graph.predicate_objects(subject):
                    name = _local(p)
                    if name and _is_relation(name) and _local(o) is not None:
                        found.add(name)
        return found

    def neighbors(self, entities: Collection[str], relation: str) -> set[str]:
        found: set[str] = set()
        with self._lock:
            for subject in self._subjects(entities):
                for o in self.graph.objects(subject, URIRef(NS + relation)):
                    name = _local(o)
                    if name is not None:
                        found.add(name)
        return found

    def attributes(self, entities: Collection[str]) -> set[str]:
        found: set[str] = set()
        with self._lock:
            for subject in self._subjects(entities):
                for p, o in self.graph.predicate_objects(subject):
                    name = _local(p)
                    if name and _is_relation(name) and _is_value(o):
                        found.add(name)
        return found

    def attribute_values(self, entities: Collection[str], attribute: str) -> dict[str, list]:
        values: dict[str, list] = {}
        with self._lock:
            for subject in self._subjects(entities):
                for o in self.graph.objects(subject, URIRef(NS + attribute)):
                    if _is_value(o):
                        key = value_key(str(o), str(o.datatype))  # type: ignore[attr-defined]
                        values.setdefault(_local(subject) or "", []).append(key)
        return values

    def names(self, entities: Collection[str]) -> dict[str, str]:
        names: dict[str, str] = {}
        with self._lock:
            for subject in self._subjects(entities):
                for o in self.graph.objects(subject, _NAME):
                    if isinstance(o, Literal) and o.language in (None, "en"):
                        names[str(subject)[len(NS) :]] = str(o)
        return names

    def relation_type(self, relation: str) -> str | None:
        with self._lock:
            for o in self.graph.objects(URIRef(NS + relation), _EXPECTED):
                return _local(o)
        return None

    def unknown(self, entities: Iterable[str]) -> set[str]:
        """The ids among ``entities`` the graph does not hold (in no triple, as subject or
        object); a text that is not an id is left out."""
        missing = set()
        with self._lock:
            for entity in filter(_ID.match, entities):
                term = URIRef(NS + entity)
                if (term, None, None) not in self.graph and (None, None, term) not in self.graph:
                    missing.add(entity)
        return missing


def _is_value(term: object) -> bool:
    return isinstance(term, Literal) and str(term.datatype) in NUMERIC | TEMPORAL


# --- SPARQL over HTTP -----------------------------------------------------------------

_PREFIX = f"PREFIX ns: <{NS}>\nPREFIX xsd: <{XSD}>\n"
"""Queries name Freebase terms by full IRI (``<NS + name>``), never as ``ns:a.b.c``:
Freebase names hold several dots, and not every engine's prefixed-name lexer reads them
(Oxigraph 0.5 refuses ``ns:location.location.area``); a full IRI is read by all."""
_VALUE_FILTER = "isLiteral(?o) && datatype(?o) IN ({})".format(
    ", ".join(f"<{t}>" for t in sorted(NUMERIC | TEMPORAL))
)


class SPARQLBackend:
    """A Freebase SPARQL endpoint (``endpoint=URL``), queried with full ``ns`` IRIs.

    Entity sets are sent as ``VALUES`` blocks of at most ``chunk`` ids per
    query. Transport or server errors raise `InfraError` with the cause chained.
    """

    def __init__(self, endpoint: str, *, timeout: float = 30.0, chunk: int = 200) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"kg: endpoint must be an http(s) URL, got {endpoint!r}")
        self.endpoint = endpoint
        self._timeout = timeout
        self._chunk = chunk
        self._types: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def query(self, sparql: str) -> list[dict[str, dict]]:
        """Run one SELECT query; its result bindings (SPARQL JSON results)."""
        body = urllib.parse.urlencode({"query": sparql}).encode()
        request = urllib.request.Request(
            self.endpoint,
            data=body,
            headers={
                "Accept": "application/sparql-results+json",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                payload = json.loads(response.read())
            return payload["results"]["bindings"]
        except (urllib.error.URLError, OSError) as exc:
            raise InfraError(f"kg: SPARQL endpoint {self.endpoint} failed: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise InfraError(f"kg: SPARQL endpoint {self.endpoint} sent a bad answer") from exc

    def _each_chunk(self, entities: Collection[str]) -> Iterable[str]:
        ids = sorted(e for e in entities if _ID.match(e))
        for i in range(0, len(ids), self._chunk):
            yield " ".join(f"<{NS}{e}>" for e in ids[i : i + self._chunk])

    def _select(self, entities: Collection[str], pattern: str, var: str) -> list[dict]:
        rows: list[dict] = []
        for values in self._each_chunk(entities):
            rows += self.query(
                f"{_PREFIX}SELECT DISTINCT {var} WHERE {{\nVALUES ?x {{ {values} }}\n{pattern}\n}}"
            )
        return rows

    def relations(self, entities: Collection[str]) -> set[str]:
        rows = self._select(
            entities, f"?x ?r ?o .\nFILTER (isIRI(?o) && STRSTARTS(STR(?o), '{NS}'))", "?r"
        )
        names = (_ns_local(row.get("r")) for row in rows)
        return {n for n in names if n and _is_relation(n)}

    def neighbors(self, entities: Collection[str], relation: str) -> set[str]:
        if not _ID.match(relation):
            return set()
        rows = self._select(entities, f"?x <{NS}{relation}> ?o .\nFILTER (isIRI(?o))", "?o")
        return {n for n in (_ns_local(row.get("o")) for row in rows) if n}

    def attributes(self, entities: Collection[str]) -> set[str]:
        rows = self._select(entities, f"?x ?r ?o .\nFILTER ({_VALUE_FILTER})", "?r")
        names = (_ns_local(row.get("r")) for row in rows)
        return {n for n in names if n and _is_relation(n)}

    def attribute_values(self, entities: Collection[str], attribute: str) -> dict[str, list]:
        if not _ID.match(attribute):
            return {}
        rows = self._select(
            entities, f"?x <{NS}{attribute}> ?o .\nFILTER ({_VALUE_FILTER})", "?x ?o"
        )
        values: dict[str, list] = {}
        for row in rows:
            entity, literal = _ns_local(row.get("x")), row.get("o") or {}
            if entity and "value" in literal:
                key = value_key(literal["value"], literal.get("datatype"))
                values.setdefault(entity, []).append(key)
        return values

    def names(self, entities: Collection[str]) -> dict[str, str]:
        pattern = (
            f"?x <{NS}type.object.name> ?n .\nFILTER (lang(?n) = '' || langMatches(lang(?n), 'en'))"
        )
        names: dict[str, str] = {}
        for row in self._select(entities, pattern, "?x ?n"):
            entity, name = _ns_local(row.get("x")), (row.get("n") or {}).get("value")
            if entity and name:
                names[entity] = name
        return names

    def relation_type(self, relation: str) -> str | None:
        with self._lock:
            if relation in self._types:
                return self._types[relation]
        found = None
        if _ID.match(relation):
            rows = self.query(
                f"{_PREFIX}SELECT ?t WHERE {{ <{NS}{relation}> "
                f"<{NS}type.property.expected_type> ?t }}"
                " LIMIT 1"
            )
            found = _ns_local(rows[0].get("t")) if rows else None
        with self._lock:
            self._types[relation] = found
        return found


def _ns_local(binding: dict | None) -> str | None:
    if not binding or binding.get("type") != "uri":
        return None
    value = str(binding.get("value", ""))
    return value[len(NS) :] if value.startswith(NS) else None
