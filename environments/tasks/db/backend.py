"""Databases for the ``db`` task: SQLite in memory (default) or a MySQL/MariaDB server.

Both give each session a database of its own that holds only the item's table,
built as AgentBench builds it: every column ``TEXT``, every value written as
Python's ``str(value)`` (so ``None`` is the text ``None``). The interface
(`Database`, `tasks.db.database`): ``execute`` one statement, ``text_rows`` (a table's
values read as text, for the judge's hash), ``close``. Errors the statement causes
(syntax, unknown column, a statement over the time limit, any other limit hit) are
`StatementError`: an observation for the model. Losing the server is `InfraError`: the
rollout retries the episode on a fresh environment.

The backends and the limits each holds the model's statements to:
`tasks.db.backend_sqlite` (no file access, bounded values, database, memory and time) and
`tasks.db.backend_mysql` (a time limit the session cannot lift, a private account, no
leftovers after a crash). Only the rows an observation can show are read
(`tasks.db.shown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.environments.tasks.db.backend_mysql import MySQLDatabase, sweep_leftovers
from agentrl.environments.tasks.db.backend_sqlite import SQLiteDatabase, mysql_collation
from agentrl.environments.tasks.db.database import (
    DATABASE_PREFIX,
    Database,
    DatabaseSpec,
    StatementError,
    column_names,
    parse_database_url,
)

__all__ = [
    "DATABASE_PREFIX",
    "Database",
    "DatabaseSpec",
    "MySQLDatabase",
    "SQLiteDatabase",
    "StatementError",
    "column_names",
    "mysql_collation",
    "open_database",
    "parse_database_url",
    "sweep_leftovers",
]


def open_database(
    spec: DatabaseSpec,
    table: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
) -> Database:
    """A fresh database holding ``table`` with ``rows``; `StatementError` if they do not fit."""
    if spec.backend == "mysql":
        return MySQLDatabase(spec, table, columns, rows)
    return SQLiteDatabase(table, columns, rows, spec)
