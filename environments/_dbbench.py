"""The ``db`` task: answer questions about a table, or change it, with SQL (AgentBench DB).

Each instance is one item in AgentBench's dbbench format (a JSON object per line):
``description`` (the question or the change to make), ``add_description`` (the
table's name and headers), ``table`` (``table_name``, ``table_info.columns`` with
``name``/``type``, ``table_info.rows``), ``type`` (``["INSERT"]``, ``["UPDATE"]``,
``["DELETE"]`` or a query kind such as ``["counting"]``) and ``label``: the
expected answers for queries, the gold SQL statement(s) for changes.

A session gets a fresh database holding only the item's table, nothing shared
between sessions: SQLite in memory by default, or with ``database=mysql://user:pass@host:port``
a database of its own on a MySQL/MariaDB server, dropped when the session ends
(`_dbbackend`; ``statement_timeout`` seconds per statement). Tools, as in AgentBench:

- ``execute_sql(sql)``: runs one statement; the observation is the result rows
  (JSON, at most 50 shown) or the database's error message. An error is an
  observation the model can react to, not an ending.
- ``commit_final_answer(answers)``: ends the episode. Queries succeed when the
  answers equal the label as a multiset of values (numbers compared within 1e-6
  after parsing, text after trimming); changes succeed when the table holds
  exactly the rows the gold SQL produces on a fresh copy (compared as sorted
  rows: AgentBench hashes the table the same way, on MySQL).

Endings other than ``completed``: no tool call, an unknown tool or bad arguments
-> ``agent_invalid_action``; ``max_turns`` assistant messages without a commit ->
``task_limit_reached``. An item whose table cannot be built or whose gold SQL
does not run raises `ItemError` when it is started (a data problem, reported by
``agentrl-env check``).

Data: ``data=PATH`` reads a JSONL file in this format (the full AgentBench
``dev.jsonl`` works); without it the built-in set ``data/db_builtin.jsonl`` is used.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import structlog

from agentrl.environments._dbbackend import (
    Database,
    StatementError,
    open_database,
    parse_database_url,
)
from agentrl.environments._protocol import EnvError, SessionClosed, Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.messages import ChatMessage

__all__ = ["DBItem", "DBTask", "ItemError", "load_items"]

log = structlog.get_logger(__name__)

MUTATIONS = ("INSERT", "UPDATE", "DELETE")
SHOWN_ROWS = 50
_TOLERANCE = 1e-6

SYSTEM_PROMPT = (
    "You answer questions about a database table, or change it as asked, using SQL. "
    "Run statements with execute_sql. When you know the answer, call commit_final_answer "
    "with the answer values; after a change (INSERT, UPDATE, DELETE), call it with an "
    "empty list."
)

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "execute_sql",
            "description": "Execute one SQL statement on the database and see its result.",
            "parameters": {
                "type": "object",
                "properties": {
                    "sql": {
                        "type": "string",
                        "description": "The SQL statement.",
                        "examples": ["SELECT COUNT(*) FROM `people`"],
                    }
                },
                "required": ["sql"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "commit_final_answer",
            "description": "Give the final answer values. This ends the task.",
            "parameters": {
                "type": "object",
                "properties": {
                    "answers": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The answer values (empty after a change).",
                        "examples": [["42"]],
                    }
                },
                "required": ["answers"],
            },
        },
    },
]


class ItemError(EnvError):
    """A data item that cannot be run: malformed, its table or its gold SQL fails."""


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
        text = resources.files("agentrl.environments").joinpath("data/db_builtin.jsonl")
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


@dataclass(slots=True)
class _Session:
    item: DBItem
    db: Database
    expected: list[tuple] | None
    """Sorted rows the table must hold after a change (None for queries)."""
    turns: int = 0
    statements: int = 0
    errors: int = 0
    done: bool = False


class DBTask:
    """The DB environment (registered as ``db``)."""

    def __init__(
        self,
        *,
        data: str | None = None,
        max_turns: int = 6,
        database: str | None = None,
        statement_timeout: float = 10.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError("db: max_turns must be >= 1")
        if statement_timeout <= 0:
            raise ValueError("db: statement_timeout must be > 0")
        self._spec = parse_database_url(database, statement_timeout=statement_timeout)
        self._items = load_items(data)
        self._max_turns = max_turns

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def num_instances(self) -> int:
        return len(self._items)

    def item(self, index: int) -> DBItem:
        if not 0 <= index < len(self._items):
            raise IndexError(f"db: index {index} not in [0, {len(self._items)})")
        return self._items[index]

    def describe(self, index: int) -> str:
        """One line naming instance ``index`` (shown beside its failures by the check)."""
        item = self.item(index)
        return f"[{item.kind}] {item.description[:80]!r}"

    def start(self, index: int) -> Start:
        item = self.item(index)
        expected = None
        if item.mutation:
            reference = self._open(item, index)
            try:
                for sql in item.label:
                    reference.execute(sql)
                expected = reference.table_rows(item.table_name)
            except StatementError as exc:
                raise ItemError(f"item {index}: the gold SQL fails: {exc}") from exc
            finally:
                reference.close()
        db = self._open(item, index)
        question = item.description
        if item.add_description:
            question += "\n" + item.add_description
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=question),
        ]
        return Start(session=_Session(item, db, expected), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        if session.done:
            raise SessionClosed("db: interact on a session that has ended")
        session.turns += 1
        if not message.tool_calls:
            return self._end(session, Status.AGENT_INVALID_ACTION, "no tool call")
        replies: list[ChatMessage] = []
        for call in message.tool_calls:
            args = call_arguments(call)
            if call.name == "execute_sql":
                sql = args.get("sql") if args is not None else None
                if not isinstance(sql, str) or not sql.strip():
                    return self._end(session, Status.AGENT_INVALID_ACTION, "bad execute_sql args")
                session.statements += 1
                try:
                    result = _show(session.db.execute(sql))
                except StatementError as exc:
                    session.errors += 1
                    result = f"error: {exc}"
                replies.append(tool_reply(call, result))
            elif call.name == "commit_final_answer":
                answers = args.get("answers") if args is not None else None
                if isinstance(answers, str | int | float) and not isinstance(answers, bool):
                    answers = [answers]
                if not isinstance(answers, list):
                    return self._end(session, Status.AGENT_INVALID_ACTION, "bad answer args")
                correct = self._judge(session, [str(a) for a in answers])
                return self._end(session, Status.COMPLETED, "committed", success=correct)
            else:
                return self._end(session, Status.AGENT_INVALID_ACTION, "unknown tool", replies)
        if session.turns >= self._max_turns:
            return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
        return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False, metrics={})

    def _open(self, item: DBItem, index: int) -> Database:
        try:
            return open_database(self._spec, item.table_name, item.columns, item.rows)
        except StatementError as exc:
            raise ItemError(f"item {index}: cannot build its table: {exc}") from exc

    def cancel(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            session.db.close()

    def _judge(self, session: _Session, answers: list[str]) -> bool:
        if session.expected is not None:
            try:
                return session.db.table_rows(session.item.table_name) == session.expected
            except StatementError:
                return False  # the model dropped or renamed the table
        return same_answers(answers, list(session.item.label))

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        success: bool = False,
    ) -> Step:
        session.done = True
        session.db.close()
        metrics = {
            "env/turns": float(session.turns),
            "env/statements": float(session.statements),
            "env/sql_errors": float(session.errors),
            "env/mutation": float(session.item.mutation),
            "env/success": float(success),
        }
        log.debug("db episode ended", status=status.value, why=why, **metrics)
        return Step.end(status, 1.0 if success else 0.0, metrics, replies)


# --- the database -------------------------------------------------------------------


def same_answers(given: list[str], label: list[str]) -> bool:
    """Equal as multisets of values: numbers within 1e-6, text after trimming."""
    if len(given) != len(label):
        return False
    remaining = [_value(v) for v in label]
    for value in map(_value, given):
        match = next((i for i, want in enumerate(remaining) if _equal(value, want)), None)
        if match is None:
            return False
        remaining.pop(match)
    return True


def _value(text: str) -> float | str:
    cleaned = text.strip()
    try:
        number = float(cleaned.replace(",", ""))
    except ValueError:
        return cleaned
    return number if math.isfinite(number) else cleaned


def _equal(a: float | str, b: float | str) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=0.0, abs_tol=_TOLERANCE)
    return a == b


def _show(rows: list[tuple]) -> str:
    shown = json.dumps([list(row) for row in rows[:SHOWN_ROWS]], default=str)
    if len(rows) > SHOWN_ROWS:
        return f"{shown} ... ({len(rows)} rows, first {SHOWN_ROWS} shown)"
    return shown
