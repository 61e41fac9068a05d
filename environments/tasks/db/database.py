"""What every ``db`` backend shares: the `Database` interface, its errors and its limits.

`DatabaseSpec` is where sessions get their databases (SQLite in memory, or a MySQL/MariaDB
server) and the limits every statement of the model runs under; `parse_database_url` reads
the task's ``database`` option into one. The backends are `tasks.db.backend_sqlite` and
`tasks.db.backend_mysql`; `tasks.db.backend.open_database` picks one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from agentrl.environments._protocol import EnvError

__all__ = [
    "DATABASE_PREFIX",
    "DEFAULT_LIMITS",
    "Database",
    "DatabaseFull",
    "DatabaseSpec",
    "StatementError",
    "as_written",
    "column_names",
    "parse_database_url",
]

DATABASE_PREFIX = "agentrl_"
"""Name prefix of the per-session databases (and accounts) made on a MySQL server."""


DEFAULT_LIMITS = {"max_value_bytes": 1 << 20, "max_db_bytes": 64 << 20,
                  "max_memory_bytes": 256 << 20}  # fmt: skip
"""The task's byte limits by default (`DatabaseSpec`)."""


class StatementError(EnvError):
    """Raised when a statement fails on the database, or hits a limit (its message is
    shown to the model)."""


class DatabaseFull(StatementError):
    """Raised when a statement made the session's database larger than ``max_db_bytes``
    on a server (the task ends the episode: the server's disk is shared)."""


class Database(Protocol):
    """One session's private database."""

    def execute(self, sql: str, *, max_chars: int | None = None) -> list[tuple]:
        """Run one statement, commit, return the rows it produced (empty for changes).

        With ``max_chars``, rows are read only until Python's text of the list of them
        (``str(rows)``) is longer than ``max_chars``: the rest are never read (an
        observation shows no more than that)."""
        ...

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        """The ``columns`` of every row of ``table`` read as text (NULL as None)."""
        ...

    def close(self) -> None:
        """Release the database (dropped on a server); idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class DatabaseSpec:
    """Where sessions get their databases: ``sqlite`` (in memory) or a MySQL server, and
    the limits the model's statements run under (the task's options of the same names)."""

    backend: str = "sqlite"
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    statement_timeout: float = 10.0
    """Seconds one statement may run, reading its rows included (both backends)."""
    max_value_bytes: int = DEFAULT_LIMITS["max_value_bytes"]
    """SQLite: the longest text or blob a statement may make (``SQLITE_LIMIT_LENGTH``)."""
    max_db_bytes: int = DEFAULT_LIMITS["max_db_bytes"]
    """The most a session's database may hold: SQLite's ``max_page_count``; on a server,
    the size of its table files, watched while each statement runs (`DatabaseFull`)."""
    max_memory_bytes: int = DEFAULT_LIMITS["max_memory_bytes"]
    """SQLite: the most memory SQLite may allocate in the process, every session of it
    together (``hard_heap_limit``)."""


def parse_database_url(url: str | None, **limits: Any) -> DatabaseSpec:
    """``None``/``sqlite`` -> in-memory SQLite; ``mysql://user:pass@host:port`` -> a server.
    ``limits``: `DatabaseSpec`'s limit fields.

    Raises ValueError naming the problem (the password is never echoed).
    """
    if url is None or url in ("sqlite", "sqlite://"):
        return DatabaseSpec(**limits)
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"db: database must be sqlite or mysql://..., got scheme {parts.scheme!r}")
    if parts.path not in ("", "/"):
        raise ValueError("db: the mysql URL takes no database name (each session makes its own)")
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise ValueError(f"db: bad port in the mysql URL ({exc})") from exc
    return DatabaseSpec(
        backend="mysql",
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        **limits,
    )


def as_written(rows: Sequence[Sequence[Any]]) -> list[tuple[str, ...]]:
    """Rows as AgentBench inserts them: every value ``str(value)``."""
    return [tuple(str(v) for v in row) for row in rows]


def column_names(columns: Sequence[tuple[str, str]]) -> list[str]:
    """The names the columns get (MySQL refuses an empty name: such a column is ``_col<i>``)."""
    return [name or f"_col{i}" for i, (name, _kind) in enumerate(columns)]
