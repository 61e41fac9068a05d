"""The ``db`` task's default database: SQLite in memory, reading MySQL statements.

SQLite reads MySQL's string escapes and names that start with a digit through
`tasks.db.dialect.to_sqlite`, and compares text columns without regard to case or accents
(`mysql_collation`), as MySQL 8's default collation ``utf8mb4_0900_ai_ci`` does
(``'Montreal' = 'Montréal'``).

The model's statements run in the worker's process, so they are held to what an in-memory
table of a question needs:

- no file: an authorizer refuses ``ATTACH``/``DETACH`` (``VACUUM INTO`` attaches its
  target, so it is refused too), every ``PRAGMA`` but the read-only table ones
  (``table_info`` ...; ``temp_store_directory``, ``writable_schema``, ``max_page_count``,
  ``hard_heap_limit`` are refused), virtual tables and ``load_extension``/
  ``fts3_tokenizer``; ``SQLITE_LIMIT_ATTACHED`` is 0 besides;
- bounded size: a value at most ``max_value_bytes`` (``SQLITE_LIMIT_LENGTH``, a
  statement's text too), the database at most ``max_db_bytes`` (``max_page_count``), temp
  storage in memory, and SQLite's memory in the process at most ``max_memory_bytes``
  (``hard_heap_limit``, every session of the process together);
- bounded time: ``statement_timeout`` covers running the statement and reading its rows
  (a progress handler interrupts it); only the rows an observation can show are read
  (`tasks.db.shown`). SQLite calls the progress handler between steps of its program, not
  during a comparison or a sort of a batch of rows, so the collation, the only Python code a
  statement runs, holds the limit itself: past the deadline it interrupts the statement and
  answers at once without folding, and before it each call folds at most `FOLDED_CHARS`
  characters of each text (`mysql_collation`). No call holds the interpreter long, so a
  statement of one session cannot starve another session of the same worker.

A statement that hits a limit is a `StatementError` naming it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import unicodedata
from collections.abc import Sequence
from typing import Any

from agentrl.environments.tasks.db.database import (
    DatabaseSpec,
    StatementError,
    as_written,
    column_names,
)
from agentrl.environments.tasks.db.dialect import to_sqlite
from agentrl.environments.tasks.db.shown import read_rows

__all__ = ["COLLATION", "FOLDED_CHARS", "SQLiteDatabase", "mysql_collation"]

COLLATION = "agentbench"
"""The collation of every SQLite text column (`mysql_collation`)."""

FOLDED_CHARS = 1024
"""How many leading characters of a text `mysql_collation` compares without regard to case
or accents; the rest is compared as written. AgentBench's values are far shorter (269
characters at most in ``dev.jsonl``), so they compare exactly as MySQL's collation would;
the bound keeps one comparison of megabyte texts to microseconds."""

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_INSERT,
    sqlite3.SQLITE_UPDATE,
    sqlite3.SQLITE_DELETE,
    sqlite3.SQLITE_CREATE_TABLE,
    sqlite3.SQLITE_CREATE_INDEX,
    sqlite3.SQLITE_CREATE_VIEW,
    sqlite3.SQLITE_CREATE_TRIGGER,
    sqlite3.SQLITE_DROP_TABLE,
    sqlite3.SQLITE_DROP_INDEX,
    sqlite3.SQLITE_DROP_VIEW,
    sqlite3.SQLITE_DROP_TRIGGER,
    sqlite3.SQLITE_ALTER_TABLE,
    sqlite3.SQLITE_REINDEX,
    sqlite3.SQLITE_ANALYZE,
    sqlite3.SQLITE_TRANSACTION,
    sqlite3.SQLITE_SAVEPOINT,
    sqlite3.SQLITE_RECURSIVE,
    sqlite3.SQLITE_FUNCTION,
}
"""Authorizer actions the model's statements may take: reading and changing tables of
the main database. Not: ATTACH/DETACH, PRAGMA (but `_READ_PRAGMAS`), temp objects,
virtual tables."""

_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info",
                 "index_xinfo", "foreign_key_list"}  # fmt: skip
"""Pragmas that only read the schema (``PRAGMA table_info(t)``)."""

_REFUSED_FUNCTIONS = {"load_extension", "fts3_tokenizer"}
"""Functions that load code or take a pointer."""

_heap_lock = threading.Lock()


def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def mysql_collation(a: str, b: str) -> int:
    """Order two texts without regard to case or accents (-1, 0, 1), as MySQL's
    ``utf8mb4_0900_ai_ci`` does for the letters it folds, in their first `FOLDED_CHARS`
    characters; texts that fold alike there are ordered by the rest as written (a total
    order still, so sorts and indexes stay consistent)."""
    x, y = _fold(a[:FOLDED_CHARS]), _fold(b[:FOLDED_CHARS])
    if x == y and (len(a) > FOLDED_CHARS or len(b) > FOLDED_CHARS):
        x, y = a[FOLDED_CHARS:], b[FOLDED_CHARS:]
    return (x > y) - (x < y)


def _dq(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _authorize(action: int, arg1: str | None, arg2: str | None, _db, _trigger) -> int:
    if action == sqlite3.SQLITE_PRAGMA:
        return sqlite3.SQLITE_OK if (arg1 or "").lower() in _READ_PRAGMAS else sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _REFUSED_FUNCTIONS else 0
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _limit_heap(limit: int) -> None:
    """SQLite's hard heap limit for the process: ``limit``, or a lower one already set."""
    with _heap_lock:
        probe = sqlite3.connect(":memory:")
        try:
            (current,) = probe.execute("PRAGMA hard_heap_limit").fetchone()
            if current == 0 or current > limit:
                probe.execute(f"PRAGMA hard_heap_limit = {int(limit)}")
        finally:
            probe.close()


class SQLiteDatabase:
    """An in-memory SQLite database reading MySQL statements, within the limits of
    ``spec`` (see the module doc)."""

    def __init__(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
        spec: DatabaseSpec | None = None,
    ) -> None:
        spec = spec or DatabaseSpec()
        self._spec = spec
        self._deadline = float("inf")
        _limit_heap(spec.max_memory_bytes)
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.create_collation(COLLATION, self._collate)
        self._db.set_progress_handler(lambda: time.monotonic() > self._deadline, 10_000)
        self._db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, spec.max_value_bytes)
        self._db.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, spec.max_value_bytes)
        (page,) = self._db.execute("PRAGMA page_size").fetchone()
        self._db.execute(f"PRAGMA max_page_count = {max(1, spec.max_db_bytes // page)}")
        self._db.execute("PRAGMA temp_store = MEMORY")
        cols = ", ".join(f"{_dq(name)} TEXT COLLATE {COLLATION}" for name in column_names(columns))
        marks = ", ".join("?" for _ in columns)
        try:
            self._db.execute(f"CREATE TABLE {_dq(table)} ({cols})")
            self._db.executemany(f"INSERT INTO {_dq(table)} VALUES ({marks})", as_written(rows))
            self._db.commit()
        except (sqlite3.Error, MemoryError) as exc:
            self._db.close()
            raise StatementError(self._explain(exc)) from exc
        self._db.set_authorizer(_authorize)

    def _collate(self, a: str, b: str) -> int:
        """`mysql_collation` until the statement's deadline; past it, interrupt the
        statement and answer at once (the statement fails, its order no longer matters)."""
        if time.monotonic() > self._deadline:
            self._db.interrupt()
            return 0
        return mysql_collation(a, b)

    def _explain(self, exc: BaseException) -> str:
        """The observation for a failed statement: the limit it hit, else SQLite's text."""
        text = str(exc)
        spec = self._spec
        if isinstance(exc, MemoryError) or text == "out of memory":
            return (f"out of memory: the statement needs more than the "
                    f"{spec.max_memory_bytes >> 20} MiB SQLite may use")  # fmt: skip
        if text == "interrupted":
            return f"the statement ran over {spec.statement_timeout:g} s"
        if text in ("string or blob too big", "statement too long"):
            return f"{text}: a value or statement may be at most {spec.max_value_bytes} bytes"
        if text == "database or disk is full":
            return f"{text}: the database may hold at most {spec.max_db_bytes >> 20} MiB"
        if text in ("not authorized", "authorization denied") or text.startswith("too many att"):
            return (f"{text}: only the session's own tables may be read and changed "
                    "(no ATTACH, PRAGMA, VACUUM INTO, extensions)")  # fmt: skip
        return text

    def execute(self, sql: str, *, max_chars: int | None = None) -> list[tuple]:
        self._deadline = time.monotonic() + self._spec.statement_timeout
        try:
            cursor = self._db.execute(to_sqlite(sql.strip()))
            if max_chars is None:
                rows = cursor.fetchall()
            else:
                rows = read_rows(cursor.fetchmany, max_chars)
            cursor.close()  # a SELECT not read to its end is ended here
            self._db.commit()
        except (sqlite3.Error, sqlite3.Warning, MemoryError) as exc:
            raise StatementError(self._explain(exc)) from exc
        except (UnicodeEncodeError, ValueError, OverflowError) as exc:
            raise StatementError(str(exc)) from exc
        finally:
            self._deadline = float("inf")
        return rows

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        cols = ", ".join(f"CAST({_dq(name)} AS TEXT)" for name in columns)
        return self.execute(f"SELECT {cols} FROM {_dq(table)}")

    def close(self) -> None:
        self._db.close()
