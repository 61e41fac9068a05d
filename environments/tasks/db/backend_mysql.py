"""The ``db`` task on a MySQL/MariaDB server (``database: mysql://user:pass@host:port``).

The server runs AgentBench's SQL in its own dialect (backquoted names, ``\\'`` escapes,
MySQL functions). Each session creates a database ``agentrl_<random>`` and drops it on
``close``. The model's statements run as an account made for the session (the same name,
`SESSION_PRIVILEGES` on its own database only, dropped with it), so a session cannot read
or drop another's, nor reach files (no FILE privilege, no ``LOCAL INFILE`` on the client);
the URL's account needs CREATE USER, GRANT, PROCESS (to read table file sizes) and KILL of
its sessions' queries (it owns none of them: root, or an account with CONNECTION
ADMIN/SUPER). The session's ``sql_mode`` drops the STRICT modes: AgentBench's labels were
made on a server where ``UPDATE ... WHERE text_column = 16`` changes the rows that compare
equal instead of failing on the ones that are not numbers.

Limits the model cannot lift:

- time: a statement runs at most ``statement_timeout`` seconds, reading its rows
  included. The session's ``max_statement_time`` (MariaDB; ``max_execution_time`` on MySQL)
  is set, but the model may set it back (``SET SESSION``, ``SET STATEMENT ... FOR``), so a
  watchdog ends any statement still running a second later with ``KILL QUERY`` from the
  session's admin connection, and the client's read timeout ends a wait on a server that
  does not answer even that.
- files: ``DATA DIRECTORY``/``INDEX DIRECTORY`` need no privilege on MariaDB, so the
  session's ``sql_mode`` holds ``NO_DIR_IN_CREATE`` (the server ignores both, in CREATE and
  ALTER, for tables and partitions) and statements that could change it are refused before
  they reach the server (`vet`: naming ``sql_mode``, or dynamic SQL, ``PREPARE``/
  ``EXECUTE [IMMEDIATE]``, which could hide the name). Table files stay in the server's
  data directory.
- disk: the session's table files (InnoDB tablespaces, other engines' data and index)
  may hold ``max_db_bytes``; their size is read every `DISK_POLL` seconds while a statement
  runs and once after it, and a statement past the bound is killed and ends the episode
  (`DatabaseFull`). A statement writes at most what the server writes in `DISK_POLL`
  seconds past the bound before it is killed (a few MB).
- no background work: no EVENT, TRIGGER, CREATE ROUTINE or CREATE TEMPORARY TABLES
  privilege, so nothing runs outside the statement the watchdog watches, and no table lives
  outside the database measured.
- rows: only the rows an observation can show are read (`tasks.db.shown`); the statement
  is then ended (``KILL QUERY``) instead of read to its end.
- leftovers: a session holds the server lock ``GET_LOCK('<its name>')`` on its admin
  connection while it lives. The server frees it when that connection ends, a worker
  killed with -9 included, so the first session a process opens on a server drops every
  ``agentrl_<16 hex>`` database and account whose lock is free (`sweep_leftovers`).

A connection the model ended (``KILL CONNECTION_ID()``, ``SET wait_timeout = 1``) is an
error observation and the next statement runs on a new one; a server that cannot be
reached is `InfraError`.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import structlog

from agentrl.environments._protocol import InfraError
from agentrl.environments.tasks.db.database import (
    DATABASE_PREFIX,
    DatabaseFull,
    DatabaseSpec,
    StatementError,
    as_written,
    column_names,
)
from agentrl.environments.tasks.db.shown import read_rows

__all__ = ["DISK_POLL", "KILL_GRACE", "SESSION_PRIVILEGES", "MySQLDatabase", "sweep_leftovers",
           "vet"]  # fmt: skip

log = structlog.get_logger(__name__)

KILL_GRACE = 1.0
"""Seconds past ``statement_timeout`` before the watchdog kills a statement."""
READ_GRACE = 10.0
"""Seconds past ``statement_timeout`` before the client stops waiting for the server."""
DISK_POLL = 0.25
"""Seconds between two readings of a session's table file sizes while a statement runs."""
SESSION_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, REFERENCES, "
                      "CREATE VIEW, SHOW VIEW")  # fmt: skip
"""What a session's account may do in its database: read and change tables and views."""
_NO_DIR = "NO_DIR_IN_CREATE"
_REFUSED = re.compile(r"sql_mode|\b(?:prepare|execute)\b", re.IGNORECASE)
"""Text that could change the session's ``sql_mode``: its name, or dynamic SQL (module doc).
Matched anywhere, comments and strings included: MariaDB runs ``/*! ... */`` comments."""
SESSION_NAME = re.compile(re.escape(DATABASE_PREFIX) + r"[0-9a-f]{16}")
"""The name of a session's database and account (nothing else is swept)."""

_swept: set[tuple[str, int]] = set()
_swept_lock = threading.Lock()


def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


_LOST_CODES = {2006, 2013, 2003, 2055}
"""Client error codes for a server that went away or cannot be reached."""


def _lost(exc: Exception) -> bool:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    return code in _LOST_CODES or code is None


def sweep_leftovers(conn) -> list[str]:
    """Drop the session databases and accounts on ``conn``'s server whose owner is gone
    (their ``GET_LOCK`` is free); the names dropped."""
    import pymysql

    with conn.cursor() as cursor:
        cursor.execute("SHOW DATABASES")
        names = {row[0] for row in cursor.fetchall()}
        try:
            cursor.execute("SELECT User FROM mysql.user")
            names |= {row[0] for row in cursor.fetchall()}
        except pymysql.err.MySQLError as exc:  # no privilege: databases only, said
            log.warning("db: cannot list accounts to sweep", error=str(exc))
        dropped = []
        for name in sorted(n for n in names if SESSION_NAME.fullmatch(n)):
            cursor.execute("SELECT IS_USED_LOCK(%s)", (name,))
            if cursor.fetchone()[0] is not None:
                continue  # a live session's
            cursor.execute(f"DROP DATABASE IF EXISTS {_bq(name)}")
            cursor.execute(f"DROP USER IF EXISTS '{name}'@'%'")
            dropped.append(name)
    if dropped:
        log.info("db: dropped the databases of dead sessions", names=dropped)
    return dropped


def vet(sql: str) -> None:
    """Raise `StatementError` for a statement that could change the session's ``sql_mode``."""
    if _REFUSED.search(sql):
        raise StatementError(
            "sql_mode, PREPARE and EXECUTE are not available: the session's SQL mode is fixed"
        )


class _Watchdog:
    """Calls ``kill`` once, after ``seconds`` ("time") or when ``full()`` says so, read every
    `DISK_POLL` seconds ("disk"), unless stopped first."""

    def __init__(self, kill, seconds: float, full) -> None:
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.fired: str | None = None
        self._kill = kill
        self._full = full
        self._deadline = time.monotonic() + seconds
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(min(DISK_POLL, max(0.0, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                self._fire("time")
                return
            try:
                full = self._full()
            except InfraError as exc:  # the time limit still holds; the next reading may work
                log.warning("db: could not read a database's size", error=str(exc))
                continue
            if full:
                self._fire("disk")
                return

    def _fire(self, why: str) -> None:
        with self._lock:  # stop() waits for a kill under way, so it ends this statement
            if self._stopped.is_set():
                return
            self.fired = why
            self._kill()

    def stop(self) -> str | None:
        """Stop watching; why the statement was killed, if it was."""
        with self._lock:
            self._stopped.set()
            return self.fired


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
        self._spec = spec
        self._name = DATABASE_PREFIX + uuid.uuid4().hex[:16]
        """The session's database, and the name of the account its statements run as."""
        self._lock = threading.Lock()
        self._admin_lock = threading.Lock()
        self._closed = False
        self._conn = None
        self._monitor = None
        self._monitor_lock = threading.Lock()
        self._user_made = False
        self._password = secrets.token_hex(16)
        self._admin = self._connect(spec.user, spec.password)
        try:
            self._sweep_once()
            self._server_call(f"SELECT GET_LOCK('{self._name}', 0)")
            self._server_call(f"CREATE DATABASE {_bq(self._name)} CHARACTER SET utf8mb4")
            # The model's statements run as an account that sees only this database, so
            # one session cannot read or drop another's (the admin account could).
            self._server_call(f"CREATE USER '{self._name}'@'%' IDENTIFIED BY '{self._password}'")
            self._user_made = True
            self._server_call(
                f"GRANT {SESSION_PRIVILEGES} ON {_bq(self._name)}.* TO '{self._name}'@'%'"
            )
            self._monitor = self._connect(spec.user, spec.password)
            self._server_call("SET SESSION lock_wait_timeout = 1", self._monitor)
            self._open_session()
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
                cursor.executemany(f"INSERT INTO {_bq(table)} VALUES ({marks})", as_written(rows))
        except (StatementError, pymysql.err.MySQLError) as exc:
            self.close()
            raise StatementError(str(exc)) from exc

    def _connect(self, user: str, password: str, **more):
        spec = self._spec
        try:
            return self._pymysql.connect(
                host=spec.host,
                port=spec.port,
                user=user,
                password=password,
                charset="utf8mb4",
                autocommit=True,
                connect_timeout=10,
                read_timeout=spec.statement_timeout + READ_GRACE,
                write_timeout=spec.statement_timeout + READ_GRACE,
                **more,
            )
        except self._pymysql.err.MySQLError as exc:
            where = f"{user}@{spec.host}:{spec.port}"
            raise InfraError(f"db: cannot reach the MySQL server {where}: {exc}") from exc

    def _sweep_once(self) -> None:
        key = (self._spec.host, self._spec.port)
        with _swept_lock:
            if key in _swept:
                return
            try:
                with self._admin_lock:
                    sweep_leftovers(self._admin)
            except self._pymysql.err.MySQLError as exc:
                raise InfraError(f"db: the MySQL server failed the sweep: {exc}") from exc
            _swept.add(key)

    def _open_session(self) -> None:
        """The model's connection, as the session's account, with its limits set."""
        self._conn = self._connect(self._name, self._password, database=self._name)
        try:
            with self._conn.cursor() as cursor:
                cursor.execute("SELECT VERSION(), @@SESSION.sql_mode")
                version, mode = (str(v) for v in cursor.fetchone())
        except self._pymysql.err.MySQLError as exc:
            raise InfraError(f"db: the MySQL server failed SELECT VERSION(): {exc}") from exc
        seconds = self._spec.statement_timeout
        if "mariadb" in version.lower():
            limit = f"SET SESSION max_statement_time = {float(seconds)}"
        else:
            limit = f"SET SESSION max_execution_time = {int(seconds * 1000)}"
        self._server_call(limit, self._conn)
        modes = [m for m in mode.split(",") if m and not m.startswith("STRICT_")]
        modes += [] if _NO_DIR in modes else [_NO_DIR]
        self._server_call(f"SET SESSION sql_mode = '{','.join(modes)}'", self._conn)

    def _server_call(self, sql: str, conn=None) -> None:
        """A statement of ours (on the admin connection unless ``conn``): any failure
        here is the server's, not the model's."""
        try:
            if conn is not None:
                with conn.cursor() as cursor:
                    cursor.execute(sql)
                return
            with self._admin_lock, self._admin.cursor() as cursor:
                cursor.execute(sql)
        except self._pymysql.err.MySQLError as exc:
            raise InfraError(f"db: the MySQL server failed {sql.split()[0]}: {exc}") from exc

    def _kill(self, thread_id: int) -> None:
        """End the statement running on the model's connection ``thread_id``."""
        try:
            with self._admin_lock, self._admin.cursor() as cursor:
                cursor.execute(f"KILL QUERY {int(thread_id)}")
        except self._pymysql.err.MySQLError as exc:
            # The client's read timeout still ends the wait; say why it had to.
            log.warning("db: KILL QUERY failed", database=self._name, error=str(exc))

    def _bytes(self) -> int:
        """The size of the session's table files (on the monitor connection, so that a
        reading held up by the model's statement never holds up a kill)."""
        sql = (
            "SELECT (SELECT COALESCE(SUM(FILE_SIZE), 0)"
            " FROM information_schema.INNODB_SYS_TABLESPACES WHERE NAME LIKE %s)"
            " + (SELECT COALESCE(SUM(DATA_LENGTH + INDEX_LENGTH), 0)"
            " FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND ENGINE <> 'InnoDB')"
        )
        try:
            with self._monitor_lock, self._monitor.cursor() as cursor:
                cursor.execute(sql, (self._name + "/%", self._name))
                return int(cursor.fetchone()[0])
        except self._pymysql.err.MySQLError as exc:
            raise InfraError(f"db: the MySQL server failed to measure a database: {exc}") from exc

    def _full(self) -> bool:
        return self._bytes() > self._spec.max_db_bytes

    def _run(self, sql: str, max_chars: int | None = None) -> list[tuple]:
        err = self._pymysql.err
        with self._lock:
            if self._closed:
                raise StatementError("the database is closed")
            thread_id = self._conn.thread_id()
            watchdog = _Watchdog(
                lambda: self._kill(thread_id), self._spec.statement_timeout + KILL_GRACE, self._full
            )
            cut = False
            try:
                cursor = self._conn.cursor(self._pymysql.cursors.SSCursor)
                try:
                    cursor.execute(sql)
                    if not cursor.description:
                        rows = []
                    elif max_chars is None:
                        rows = list(cursor.fetchall())
                    else:
                        rows = read_rows(cursor.fetchmany, max_chars)
                        if cursor.fetchone() is not None:
                            cut = True  # not read to its end: end it on the server
                            self._kill(thread_id)
                finally:
                    try:
                        cursor.close()  # reads what is left of the result
                    except err.OperationalError as exc:
                        if not cut or exc.args[0] != 1317:  # 1317: the kill of the cut
                            raise
            except (err.OperationalError, err.InterfaceError) as exc:
                if why := watchdog.stop():
                    raise self._over(why) from exc
                if _lost(exc):
                    raise self._relink(exc) from exc
                raise StatementError(str(exc)) from exc
            except (err.MySQLError, UnicodeEncodeError) as exc:  # a lone surrogate too
                watchdog.stop()
                raise StatementError(str(exc)) from exc
            if why := watchdog.stop():
                raise self._over(why)  # killed, yet it answered (BENCHMARK does)
            if self._full():
                raise self._over("disk")
            return rows

    def _over(self, why: str) -> StatementError:
        if why == "disk":
            limit = self._spec.max_db_bytes >> 20
            return DatabaseFull(f"the database may hold at most {limit} MiB")
        return StatementError(f"the statement ran over {self._spec.statement_timeout:g} s")

    def _relink(self, exc: Exception) -> Exception:
        """The model's connection ended: a new one if the server answers (the model
        ended it; an observation), else `InfraError` (the server is gone)."""
        try:
            self._server_call("SELECT 1")
        except InfraError as lost:
            return InfraError(f"db: lost the MySQL server: {exc} ({lost})")
        if self._conn.open:
            self._conn.close()
        self._open_session()
        return StatementError(f"the connection was lost and opened again: {exc}")

    def execute(self, sql: str, *, max_chars: int | None = None) -> list[tuple]:
        # The model's text goes in as it is: ``%`` is not a placeholder without args.
        vet(sql)
        return self._run(sql.strip(), max_chars)

    def text_rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        # On the admin connection: nothing the model set on its own session (character
        # sets, sql_mode) changes what the judge reads.
        cols = ", ".join(f"CAST({_bq(name)} AS CHAR)" for name in columns)
        sql = f"SELECT {cols} FROM {_bq(self._name)}.{_bq(table)}"
        err = self._pymysql.err
        try:
            with self._admin_lock, self._admin.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchall())
        except (err.OperationalError, err.InterfaceError) as exc:
            if _lost(exc):
                raise InfraError(f"db: lost the MySQL server: {exc}") from exc
            raise StatementError(str(exc)) from exc
        except err.MySQLError as exc:
            raise StatementError(str(exc)) from exc

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for conn in (self._conn, self._monitor):
            if conn is not None and conn.open:
                conn.close()
        drops = [f"DROP DATABASE IF EXISTS {_bq(self._name)}"]
        if self._user_made:
            drops.append(f"DROP USER IF EXISTS '{self._name}'@'%'")
        try:
            with self._admin_lock, self._admin.cursor() as cursor:
                for sql in drops:
                    cursor.execute(sql)
        except self._pymysql.err.MySQLError as exc:
            # The server went away: the lock went with the connection, so the next
            # process's sweep drops what is left; say so.
            log.warning(
                "db: could not drop the session database", database=self._name, error=str(exc)
            )
        finally:
            self._admin.close()
