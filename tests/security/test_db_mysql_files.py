"""Hostile SQL against the db task on a real MariaDB server (127.0.0.1:3306, root, no
password), through the task's session API: table files placed where the model chooses
(``DATA DIRECTORY``/``INDEX DIRECTORY`` in every spelling the server reads), a database
that grows without bound, and work the server would run after the statement (events,
triggers, routines).

Skips with a reason when no server answers, unless AGENTRL_REQUIRE_MYSQL=1 (CI), in which
case it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.environments import Status, make_task
from agentrl.environments.tasks.db.backend_mysql import vet
from agentrl.environments.tasks.db.database import StatementError
from tests.security.mysql_server import MYSQL
from tests.security.mysql_server import rows as _rows
from tests.security.mysql_server import say as _say

pytestmark = pytest.mark.integration

PLACES = ["/dev/shm", "/tmp", "/var/tmp"]

PLACED = [
    "CREATE TABLE a1 (x TEXT) DATA DIRECTORY = '{d}'",
    "CREATE TABLE a2 (x TEXT) ENGINE = MyISAM DATA DIRECTORY = '{d}' INDEX DIRECTORY = '{d}'",
    "CREATE TABLE a3 (x TEXT) ENGINE = Aria DATA DIRECTORY = '{d}'",
    "CREATE TABLE a4 (x INT) PARTITION BY HASH(x) (PARTITION p0 DATA DIRECTORY = '{d}', "
    "PARTITION p1 INDEX DIRECTORY = '{d}')",
    "CREATE OR REPLACE TABLE a5 (x TEXT) DATA DIRECTORY = '{d}' SELECT 'x' AS x",
    "ALTER TABLE a5 ENGINE = MyISAM DATA DIRECTORY = '{d}'",
    "ALTER TABLE a4 ADD PARTITION (PARTITION p9 DATA DIRECTORY = '{d}')",
    "SET SESSION sql_mode = ''",
    "SET @@SESSION.SQL_MODE = 'ANSI'",
    "SET STATEMENT sql_mode = '' FOR CREATE TABLE b1 (x TEXT) DATA DIRECTORY = '{d}'",
    "/*!SET STATEMENT sql_mode='' FOR CREATE TABLE b2 (x TEXT) DATA DIRECTORY = '{d}'*/",
    "EXECUTE IMMEDIATE 'SET STATEMENT sql_mode='''' FOR CREATE TABLE b3 (x TEXT) "
    "DATA DIRECTORY=''{d}'''",
    "EXECUTE IMMEDIATE CONCAT('SET STATEMENT sql_', 'mode='''' FOR CREATE TABLE b4 (x TEXT) "
    "DATA DIRECTORY=''{d}''')",
    "PREPARE s FROM 'SET STATEMENT sql_mode='''' FOR CREATE TABLE b5 (x TEXT) "
    "DATA DIRECTORY=''{d}'''",
    "execute s",
    "/*M!100000 PREPARE t FROM 'CREATE TABLE b6 (x TEXT) DATA DIRECTORY=''{d}''' */",
    "CREATE TABLE b7 (x TEXT) DATA DIRECTORY = '{d}'",
]
"""Table files outside the data directory: every engine, partitions, ALTER, and every way
of first lifting ``NO_DIR_IN_CREATE`` (the session's mode, SET STATEMENT, dynamic SQL)."""

BACKGROUND = [
    "CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO INSERT INTO a1 VALUES ('x')",
    "CREATE TRIGGER tr BEFORE INSERT ON a1 FOR EACH ROW SET NEW.x = REPEAT('x', 1000)",
    "CREATE PROCEDURE p() BEGIN LOOP SELECT SLEEP(1); END LOOP; END",
    "CREATE FUNCTION f() RETURNS INT RETURN 1",
    "CREATE TEMPORARY TABLE tt (x TEXT)",
    "LOCK TABLES a1 WRITE",
]
"""Work the server would run outside the watched statement, or tables outside the database
measured."""


@pytest.mark.parametrize("place", PLACES)
def test_no_table_file_is_placed_outside_the_data_directory(server, place):
    env = make_task("db", database=MYSQL, statement_timeout=5.0, max_turns=100)
    session = env.start(0).session
    name = session.db._name
    for attack in PLACED:
        env.interact(session, _say(attack.format(d=place)))
        placed = _rows(
            server,
            "SELECT TABLE_NAME, CREATE_OPTIONS FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = %s AND CREATE_OPTIONS LIKE '%%DIRECTORY%%'",
            name,
        )
        assert placed == [], (attack, placed)
        assert not Path(place, name).exists(), attack  # where the server runs here
    mode = env.interact(session, _say("SELECT 1")).messages[0].content
    assert mode == "[(1,)]"  # the session still answers
    env.cancel(session)
    assert not Path(place, name).exists()


def test_nothing_runs_after_the_statement(server):
    env = make_task("db", database=MYSQL, statement_timeout=5.0, max_turns=100)
    session = env.start(0).session
    name = session.db._name
    env.interact(session, _say("CREATE TABLE a1 (x TEXT)"))
    for attack in BACKGROUND:
        seen = env.interact(session, _say(attack)).messages[0].content
        assert seen.startswith("error: "), (attack, seen)
    for table, column in [("EVENTS", "EVENT_SCHEMA"), ("TRIGGERS", "TRIGGER_SCHEMA"),
                          ("ROUTINES", "ROUTINE_SCHEMA")]:  # fmt: skip
        assert _rows(server, f"SELECT * FROM information_schema.{table} WHERE {column} = %s",
                     name) == []  # fmt: skip
    env.cancel(session)


def test_a_database_past_its_bound_is_stopped_and_ends_the_episode(server):
    limit = 8 << 20
    env = make_task("db", database=MYSQL, statement_timeout=10.0, max_db_bytes=limit)
    session = env.start(0).session
    name = session.db._name
    env.interact(session, _say("CREATE TABLE big (x LONGTEXT)"))
    grow = "INSERT INTO big SELECT REPEAT('x', 60000) FROM seq_1_to_1000000"
    step = env.interact(session, _say(grow))
    seen = step.messages[0].content
    assert seen == "error: the database may hold at most 8 MiB", seen
    assert step.status == Status.COMPLETED and step.reward == 0.0
    gone = _rows(server, "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", name)
    assert gone == []  # the episode's end dropped it


def test_many_small_statements_past_the_bound_end_the_episode(server):
    env = make_task("db", database=MYSQL, max_db_bytes=4 << 20, max_turns=100)
    session = env.start(0).session
    env.interact(session, _say("CREATE TABLE g (x LONGTEXT)"))
    for turn in range(60):  # noqa: B007 (read after the loop)
        step = env.interact(session, _say("INSERT INTO g VALUES (REPEAT('y', 500000))"))
        if step.status != Status.RUNNING:
            break
    assert step.messages[0].content == "error: the database may hold at most 4 MiB"
    assert step.status == Status.COMPLETED and 4 < turn < 40, turn


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT @@sql_mode",
        "prepare s from 'select 1'",
        "EXECUTE IMMEDIATE 'SELECT 1'",
        "/*!execute s*/",
        "SET @@Sql_Mode = ''",
    ],
)
def test_statements_that_could_change_the_sql_mode_are_refused(sql):
    with pytest.raises(StatementError, match="sql_mode, PREPARE and EXECUTE are not available"):
        vet(sql)


@pytest.mark.parametrize(
    "sql", ["SELECT * FROM t WHERE role = 'Executive'", "SELECT prepared FROM t"]
)
def test_ordinary_statements_pass_the_gate(sql):
    vet(sql)
