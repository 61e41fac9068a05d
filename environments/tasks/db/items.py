"""Items of the ``db`` task: AgentBench's dbbench format, read into `DBItem` records.

A data file holds one JSON object per line: ``description`` (the question or
the change to make), ``add_description`` (the table's name and headers),
``table`` (``table_name``, ``table_info.columns`` with ``name``/``type``,
``table_info.rows``), ``type`` (``["INSERT"]``, ``["UPDATE"]``, ``["DELETE"]``
or a query kind such as ``["counting"]``) and ``label``: the expected answers
for queries, the gold SQL statement(s) for changes; changes may carry
``answer_md5`` (AgentBench's hash of the table after the change, ``"[('<md5>',)]"``)
and any item ``evidence`` (a hint shown before the table information).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.environments._protocol import SampleError

__all__ = [
    "FULL_LEVEL",
    "MUTATIONS",
    "DBItem",
    "ItemError",
    "content_key",
    "load_items",
    "parse_item",
]

MUTATIONS = ("INSERT", "UPDATE", "DELETE")
FULL_LEVEL = 2
"""The level number of the data set's items (AgentBench's task); 0 and 1 are generated."""


class ItemError(SampleError):
    """A data item that cannot be run: malformed, its table or its gold SQL fails.

    Raised by ``start`` it is a :class:`SampleError`: not the model's fault, not
    retried, left out of training (AgentBench ends such a sample unscored).
    """


@dataclass(frozen=True, slots=True)
class DBItem:
    """One dbbench item."""

    description: str
    table_name: str
    columns: tuple[tuple[str, str], ...]
    """(name, SQL type) per column."""
    rows: tuple[tuple[Any, ...], ...]
    kind: str
    """``INSERT``, ``UPDATE``, ``DELETE`` or a query kind (``counting``, ``other``, ...)."""
    label: tuple[str, ...]
    """Expected answers (queries) or the gold SQL statements (changes)."""
    add_description: str = ""
    evidence: str = ""
    answer_md5: str = ""
    """AgentBench's hash of the changed table (`tasks.db.judge.table_hash`); empty: the hash of
    the table the gold SQL gives on a fresh copy."""
    level: int = FULL_LEVEL
    """The graded level this item plays (`tasks.db.levels`; data-set items: the full one)."""
    query: str = ""
    """A query item's gold SQL (dbbench's ``sql.query``; empty when the item has none): what
    the oracle runs before it commits the label, so its episodes show where answers come
    from."""

    @property
    def mutation(self) -> bool:
        return self.kind in MUTATIONS


def parse_item(raw: Any, where: str) -> DBItem:
    """One dbbench JSON object -> `DBItem`; `ItemError` names what is wrong."""
    try:
        table = raw["table"]
        info = table["table_info"]
        columns = tuple((str(c["name"]), str(c.get("type") or "TEXT")) for c in info["columns"])
        rows = tuple(tuple(row) for row in info["rows"])
        kinds = raw["type"]
        kind = str(kinds[0] if isinstance(kinds, list) else kinds)
        label = raw["label"]
        label = tuple(str(v) for v in (label if isinstance(label, list) else [label]))
        item = DBItem(
            description=str(raw["description"]),
            table_name=str(table["table_name"]),
            columns=columns,
            rows=rows,
            kind=kind,
            label=label,
            add_description=str(raw.get("add_description") or ""),
            evidence=str(raw.get("evidence") or ""),
            answer_md5=str(raw.get("answer_md5") or ""),
            query=str((raw.get("sql") or {}).get("query") or "") if kind not in MUTATIONS else "",
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise ItemError(f"{where}: not a dbbench item ({type(exc).__name__}: {exc})") from exc
    if not columns:
        raise ItemError(f"{where}: the table has no columns")
    if any(len(row) != len(columns) for row in rows):
        raise ItemError(f"{where}: a row does not have {len(columns)} values")
    return item


def load_items(path: str | Path | None = None) -> list[DBItem]:
    """Items of a dbbench JSONL file (the built-in set when ``path`` is None)."""
    if path is None:
        text = resources.files("agentrl.environments.tasks.db").joinpath("data/db_builtin.jsonl")
        lines, where = text.read_text().splitlines(), "built-in db set"
    else:
        lines, where = Path(path).read_text().splitlines(), str(path)
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ItemError(f"{where}:{number}: not JSON ({exc.msg})") from exc
        items.append(parse_item(raw, f"{where}:{number}"))
    if not items:
        raise ItemError(f"{where}: no items")
    return items


def content_key(item: DBItem) -> str:
    """What makes an item itself, for the train/test split and the disjointness check:
    its question, table name and rows (never its position in a file)."""
    return json.dumps([item.description, item.table_name, item.rows], default=str)
