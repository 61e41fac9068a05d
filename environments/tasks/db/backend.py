"""Databases for the ``db`` task: SQLite in memory (default) or a MySQL/MariaDB server.

Both give each session a database of its own that holds only the item's table,
built as AgentBench builds it: every column ``TEXT``, every value written as
Python's ``str(value)`` (so ``None`` is the text ``None``). The interface
(`Database`): ``execute`` one statement, ``text_rows`` (a table's values read as
text, for the judge's hash), ``close``. Errors the
statement causes (syntax, unknown column, a statement over the time limit) are
`StatementError`: an observation for the model. Losing the server is
`InfraError`: the rollout retries the episode on a fresh environment.

The MySQL backend runs AgentBench's SQL in its own dialect (backquoted names,
``\\'`` escapes, MySQL functions). The model's statements run as an account made for the session
(``agentrl_<random>``, privileges on its own database only, dropped with it), so a
session cannot read or drop another's; the URL's account needs CREATE USER and GRANT.
SQLite reads MySQL's string escapes and names
that start with a digit through `tasks.db.dialect.to_sqlite`, and compares text columns
without regard to case or accents (`mysql_collation`), as MySQL 8's default
collation ``utf8mb4_0900_ai_ci`` does (``'Montreal' = 'Montréal'``). On a server,
the session's ``sql_mode`` drops the STRICT modes: AgentBench's labels were made on
a server where ``UPDATE ... WHERE text_column = 16`` changes the rows that compare
equal instead of failing on the ones that are not numbers.
Each session creates a
database ``agentrl_<random>`` on the server and drops it on ``close``; a
statement runs at most ``statement_timeout`` seconds (MariaDB's
``max_statement_time``, MySQL's ``max_execution_time`` for SELECT).
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import structlog

from agentrl.environments._protocol import EnvError, InfraError
from agentrl.environments.tasks.db.dialect import to_sqlite

__all__ = [
    "Database",
    "DatabaseSpec",
    "MySQLDatabase",
    "SQLiteDatabase",
    "StatementError",
    "column_names",
    "mysql_collation",
    "open_database",
    "parse_database_url",
]

log = structlog.get_logger(__name__)

DATABASE_PREFIX = "agentrl_"
"""Name prefix of the per-session databases made on a MySQL server."""


class StatementError(EnvError):
    """Raised when a statement fails on the database (its message is shown to the model)."""


class Database(Protocol):
    """One session's private database."""

    def execute(self, sql: str) -> list[tuple]:
        """Run one statement, commit, return the rows it produced (empty for changes)."""
        ...

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        """The ``columns`` of every row of ``table`` read as text (NULL as None)."""
        ...

    def close(self) -> None:
        """Release the database (dropped on a server); idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class DatabaseSpec:
    """Where sessions get their databases: ``sqlite`` (in memory) or a MySQL server."""

    backend: str = "sqlite"
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    statement_timeout: float = 10.0
    """Seconds one statement may run on the server."""


def parse_database_url(url: str | None, *, statement_timeout: float = 10.0) -> DatabaseSpec:
    """``None``/``sqlite`` -> in-memory SQLite; ``mysql://user:pass@host:port`` -> a server.

    Raises ValueError naming the problem (the password is never echoed).
    """
    if url is None or url in ("sqlite", "sqlite://"):
        return DatabaseSpec(statement_timeout=statement_timeout)
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
        statement_timeout=statement_timeout,
    )


def open_database(
    spec: DatabaseSpec,
    table: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
) -> Database:
    """A fresh database holding ``table`` with ``rows``; `StatementError` if they do not fit."""
    if spec.backend == "mysql":
        return MySQLDatabase(spec, table, columns, rows)
    return SQLiteDatabase(table, columns, rows, statement_timeout=spec.statement_timeout)


def _as_written(rows: Sequence[Sequence[Any]]) -> list[tuple[str, ...]]:
    """Rows as AgentBench inserts them: every value ``str(value)``."""
    return [tuple(str(v) for v in row) for row in rows]


def column_names(columns: Sequence[tuple[str, str]]) -> list[str]:
    """The names the columns get (MySQL refuses an empty name: such a column is ``_col<i>``)."""
    return [name or f"_col{i}" for i, (name, _kind) in enumerate(columns)]


# --- SQLite --------------------------------------------------------------------------


COLLATION = "agentbench"
"""The collation of every SQLite text column (`mysql_collation`)."""


def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def mysql_collation(a: str, b: str) -> int:
    """Order two texts without regard to case or accents (-1, 0, 1), as MySQL's
    ``utf8mb4_0900_ai_ci`` does for the letters it folds."""
    x, y = _fold(a), _fold(b)
    return (x > y) - (x < y)


def _dq(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SQLiteDatabase:
    """An in-memory SQLite database reading MySQL statements (`tasks.db.dialect.to_sqlite`).

    A statement is interrupted after ``statement_timeout`` seconds (a recursive
    query may otherwise never end).
    """

    def __init__(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
        *,
        statement_timeout: float = 10.0,
    ) -> None:
        self._timeout = statement_timeout
        self._deadline = float("inf")
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.create_collation(COLLATION, mysql_collation)
        self._db.set_progress_handler(lambda: time.monotonic() > self._deadline, 10_000)
        cols = ", ".join(f"{_dq(name)} TEXT COLLATE {COLLATION}" for name in column_names(columns))
        marks = ", ".join("?" for _ in columns)
        try:
            self._db.execute(f"CREATE TABLE {_dq(table)} ({cols})")
            self._db.executemany(f"INSERT INTO {_dq(table)} VALUES ({marks})", _as_written(rows))
            self._db.commit()
        except sqlite3.Error as exc:
            self._db.close()
            raise StatementError(str(exc)) from exc

    def execute(self, sql: str) -> list[tuple]:
        self._deadline = time.monotonic() + self._timeout
        try:
            cursor = self._db.execute(to_sqlite(sql.strip()))
            rows = cursor.fetchall()
            self._db.commit()
        except sqlite3.OperationalError as exc:
            if str(exc) == "interrupted":
                raise StatementError(f"the statement ran over {self._timeout:g} s") from exc
            raise StatementError(str(exc)) from exc
        except (sqlite3.Error, sqlite3.Warning, UnicodeEncodeError, ValueError) as exc:
            raise StatementError(str(exc)) from exc
        finally:
            self._deadline = float("inf")
        return rows

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        cols = ", ".join(f"CAST({_dq(name)} AS TEXT)" for name in columns)
        return self.execute(f"SELECT {cols} FROM {_dq(table)}")

    def close(self) -> None:
        self._db.close()


# --- MySQL / MariaDB ------------------------------------------------------------------


def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MySQLDatabase:
    """A database of its own on a MySQL/MariaDB server, dropped on ``close``."""

    def __init__(
        self,
        spec: DatabaseSpec,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> None:
        import pymysql

        self._pymysql = pymysql
        self._name = DATABASE_PREFIX + uuid.uuid4().hex[:16]
        """The session's database, and the name of the account its statements run as."""
        self._lock = threading.Lock()
        self._closed = False
        self._conn = None
        self._user_made = False
        self._admin = self._connect(spec, spec.user, spec.password)
        password = secrets.token_hex(16)
        try:
            self._server_call(f"CREATE DATABASE {_bq(self._name)} CHARACTER SET utf8mb4")
            # The model's statements run as an account that sees only this database, so
            # one session cannot read or drop another's (the admin account could).
            self._server_call(f"CREATE USER '{self._name}'@'%' IDENTIFIED BY '{password}'")
            self._user_made = True
            self._server_call(f"GRANT ALL PRIVILEGES ON {_bq(self._name)}.* TO '{self._name}'@'%'")
            self._conn = self._connect(spec, self._name, password, database=self._name)
            self._limit_statements(spec.statement_timeout)
        except BaseException:
            self.close()  # drops what was made, closes the connections
            raise
        # Every column TEXT, as AgentBench builds its MySQL tables: the data's declared
        # types do not always fit its values ('No INT' in an INT column, dates in prose).
        cols = ", ".join(f"{_bq(name)} TEXT" for name in column_names(columns))
        marks = ", ".join("%s" for _ in columns)
        try:
            self._run(f"CREATE TABLE {_bq(table)} ({cols})")
            with self._conn.cursor() as cursor:
                cursor.executemany(f"INSERT INTO {_bq(table)} VALUES ({marks})", _as_written(rows))
        except (StatementError, pymysql.err.MySQLError) as exc:
            self.close()
            raise StatementError(str(exc)) from exc

    def _connect(self, spec: DatabaseSpec, user: str, password: str, **more):
        try:
            return self._pymysql.connect(
                host=spec.host,
                port=spec.port,
                user=user,
                password=password,
                charset="utf8mb4",
                autocommit=True,
                connect_timeout=10,
                **more,
            )
        except self._pymysql.err.MySQLError as exc:
            where = f"{user}@{spec.host}:{spec.port}"
            raise InfraError(f"db: cannot reach the MySQL server {where}: {exc}") from exc

    def _limit_statements(self, seconds: float) -> None:
        try:
            with self._conn.cursor() as cursor:
                cursor.execute("SELECT VERSION(), @@SESSION.sql_mode")
                version, mode = (str(v) for v in cursor.fetchone())
        except self._pymysql.err.MySQLError as exc:
            raise InfraError(f"db: the MySQL server failed SELECT VERSION(): {exc}") from exc
        if "mariadb" in version.lower():
            limit = f"SET SESSION max_statement_time = {float(seconds)}"
        else:
            limit = f"SET SESSION max_execution_time = {int(seconds * 1000)}"
        self._server_call(limit, self._conn)
        lenient = ",".join(m for m in mode.split(",") if m and not m.startswith("STRICT_"))
        self._server_call(f"SET SESSION sql_mode = '{lenient}'", self._conn)

    def _server_call(self, sql: str, conn=None) -> None:
        """A statement of ours (on the admin connection unless ``conn``): any failure
        here is the server's, not the model's."""
        try:
            with (conn or self._admin).cursor() as cursor:
                cursor.execute(sql)
        except self._pymysql.err.MySQLError as exc:
            raise InfraError(f"db: the MySQL server failed {sql.split()[0]}: {exc}") from exc

    def _run(self, sql: str) -> list[tuple]:
        err = self._pymysql.err
        with self._lock:
            if self._closed:
                raise StatementError("the database is closed")
            try:
                with self._conn.cursor() as cursor:
                    cursor.execute(sql)
                    return list(cursor.fetchall()) if cursor.description else []
            except (err.OperationalError, err.InterfaceError) as exc:
                if _lost(exc):
                    raise InfraError(f"db: lost the MySQL server: {exc}") from exc
                raise StatementError(str(exc)) from exc
            except (err.MySQLError, UnicodeEncodeError) as exc:  # a lone surrogate too
                raise StatementError(str(exc)) from exc

    def execute(self, sql: str) -> list[tuple]:
        # The model's text goes in as it is: ``%`` is not a placeholder without args.
        return self._run(sql.strip())

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        cols = ", ".join(f"CAST({_bq(name)} AS CHAR)" for name in columns)
        return self._run(f"SELECT {cols} FROM {_bq(table)}")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._conn is not None:
            self._conn.close()
        drops = [f"DROP DATABASE IF EXISTS {_bq(self._name)}"]
        if self._user_made:
            drops.append(f"DROP USER IF EXISTS '{self._name}'@'%'")
        try:
            with self._admin.cursor() as cursor:
                for sql in drops:
                    cursor.execute(sql)
        except self._pymysql.err.MySQLError as exc:
            # The server went away: nothing left to drop on our side; say so.
            log.warning(
                "db: could not drop the session database", database=self._name, error=str(exc)
            )
        finally:
            self._admin.close()


_LOST_CODES = {2006, 2013, 2003, 2055}
"""Client error codes for a server that went away or cannot be reached."""


def _lost(exc: Exception) -> bool:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    return code in _LOST_CODES or code is None
