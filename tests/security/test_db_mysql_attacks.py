"""Hostile SQL against the db task on a real MariaDB server (127.0.0.1:3306, root, no
password), through the task's session API: lifting the statement limit in every spelling
the server reads, holding a worker thread, reaching files or other databases, and a worker
killed with -9 leaving its database and account behind.

Skips with a reason when no server answers, unless AGENTRL_REQUIRE_MYSQL=1 (CI), in which
case it fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.environments import Status, make_task
from agentrl.environments.tasks.db.backend_mysql import KILL_GRACE
from tests.security.mysql_server import MYSQL
from tests.security.mysql_server import rows as _rows
from tests.security.mysql_server import say as _say

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0

LIFTS = [
    "SET SESSION max_statement_time = 0",
    "set @@session.MAX_STATEMENT_TIME=0",
    "SET /* c */ max_statement_time = 1000000",
    "/*!SET @@max_statement_time = 0*/",
    "SET @@local.max_statement_time = DEFAULT",
    "SET GLOBAL max_statement_time = 0",
    "SET SESSION net_read_timeout = 1000000",
    "SET SESSION max_recursive_iterations = 4294967295",
    "SELECT 1; SET SESSION max_statement_time = 0",
]
"""Ways to lift the statement limit before a long statement (GLOBAL is refused: no SUPER;
a second statement is a syntax error: no multi-statements)."""

LONG = [
    "SELECT SLEEP(1000000)",
    "select sleep(1e6)",
    "SET STATEMENT max_statement_time = 0 FOR SELECT SLEEP(1000)",
    "SET STATEMENT max_statement_time=0, net_write_timeout=1000 FOR "
    "SELECT BENCHMARK(1e12, MD5('a'))",
    "SELECT BENCHMARK(100000000000, SHA2('a', 512))",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
    "SELECT count(*) FROM seq_1_to_1000000 a, seq_1_to_1000000 b, seq_1_to_1000 c",
    "SELECT GET_LOCK('agentrl_held', 1000000)",
]
"""Statements that would hold the worker's thread for as long as the model likes (the
test holds the lock ``agentrl_held``)."""


def _running(conn, account: str) -> list[tuple]:
    """The statements the session's account is running now."""
    return _rows(
        conn,
        "SELECT ID, INFO FROM information_schema.PROCESSLIST WHERE USER = %s AND COMMAND = 'Query'",
        account,
    )


def test_no_way_of_lifting_the_statement_limit_holds_the_worker(server):
    env = make_task("db", database=MYSQL, statement_timeout=TIMEOUT, max_turns=100)
    session = env.start(0).session
    account = session.db._name
    assert _rows(server, "SELECT GET_LOCK('agentrl_held', 0)") == [(1,)]
    for lift in LIFTS:
        assert env.interact(session, _say(lift)).status == Status.RUNNING, lift
    for sql in LONG:
        started = time.monotonic()
        step = env.interact(session, _say(sql))
        took = time.monotonic() - started
        seen = step.messages[0].content
        assert took < TIMEOUT + KILL_GRACE + 2.0, (sql, took)
        assert step.status == Status.RUNNING and seen.startswith("error: "), (sql, seen)
        assert env.interact(session, _say("SELECT 1")).messages[0].content == "[(1,)]"
        # ended on the server too, not only given up on here (no connection of the
        # account is still running it)
        assert _running(server, account) == [], sql
    env.cancel(session)
    _rows(server, "SELECT RELEASE_LOCK('agentrl_held')")


def test_a_huge_result_is_read_only_as_far_as_it_is_shown(server):
    env = make_task("db", database=MYSQL, statement_timeout=5.0, max_turns=100)
    session = env.start(0).session
    started = time.monotonic()
    step = env.interact(session, _say("SELECT * FROM seq_1_to_100000000 a, seq_1_to_1000 b"))
    assert time.monotonic() - started < 2.0  # not read to its end
    assert step.messages[0].content.endswith("[TRUNCATED]")
    assert env.interact(session, _say("SELECT 1")).messages[0].content == "[(1,)]"
    assert _running(server, session.db._name) == []
    env.cancel(session)


def test_no_file_nor_other_database_is_reached(server, tmp_path):
    env = make_task("db", database=MYSQL, statement_timeout=TIMEOUT, max_turns=100)
    session = env.start(0).session
    target = tmp_path / "out.txt"
    attacks = [
        "SELECT 1 INTO OUTFILE '/tmp/agentrl_attack_out'",
        f"SELECT 1 INTO DUMPFILE '{target}'",
        "LOAD DATA INFILE '/etc/passwd' INTO TABLE t",
        "LOAD DATA LOCAL INFILE '/etc/passwd' INTO TABLE t",
        "SELECT * FROM mysql.user",
        "SHOW GRANTS FOR root@localhost",
        "CREATE DATABASE agentrl_0000000000000000",
        "DROP DATABASE mysql",
        "KILL 1",
        "GRANT ALL ON *.* TO CURRENT_USER()",
        "INSTALL SONAME 'ha_connect'",
    ]
    for sql in attacks:
        seen = env.interact(session, _say(sql)).messages[0].content
        assert seen.startswith("error: "), (sql, seen)
    seen = env.interact(session, _say("SELECT LOAD_FILE('/etc/passwd')")).messages[0].content
    assert seen == "[(None,)]"
    assert not target.exists() and not Path("/tmp/agentrl_attack_out").exists()
    env.cancel(session)


HOLDER = """
import sys, time
from agentrl.environments import make_task
env = make_task("db", database=sys.argv[1])
session = env.start(0).session
print("SESSION", session.db._name, flush=True)
sys.stdin.read()  # held until killed
"""


def _exists(conn, name: str) -> tuple[bool, bool]:
    """Whether the database and the account ``name`` exist."""
    dbs = _rows(conn, "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                name)  # fmt: skip
    users = _rows(conn, "SELECT User FROM mysql.user WHERE User = %s", name)
    return bool(dbs), bool(users)


def _crashed_session() -> str:
    """A worker process that opened a session, killed with -9: its database's name."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, MYSQL],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    name = ""
    while not name:  # log lines may come first
        line = proc.stdout.readline()
        assert line, "the worker ended before it opened a session"
        name = line.split()[1] if line.startswith("SESSION ") else ""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stdin.close()
    proc.stdout.close()
    return name


def test_a_killed_worker_s_database_and_account_are_dropped_at_the_next_start(server):
    dead = _crashed_session()
    assert dead.startswith("agentrl_")
    assert _exists(server, dead) == (True, True)  # the crash left them behind
    live_env = make_task("db", database=MYSQL)
    live = live_env.start(0).session  # a live session the sweep must leave alone
    nxt = subprocess.run(
        [sys.executable, "-c", HOLDER, MYSQL],
        cwd=ROOT,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "SESSION agentrl_" in nxt.stdout
    assert _exists(server, dead) == (False, False)
    assert _exists(server, live.db._name) == (True, True)
    assert live_env.interact(live, _say("SELECT 1")).messages[0].content == "[(1,)]"
    live_env.cancel(live)
    assert _exists(server, live.db._name) == (False, False)
