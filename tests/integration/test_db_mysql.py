"""The db task on a real MySQL/MariaDB server (127.0.0.1:3306, root, no password).

Skips with a reason when no server answers, unless AGENTRL_REQUIRE_MYSQL=1 (CI), in
which case it fails.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

from agentrl.environments import InfraError, Status, make_task
from agentrl.environments._check import check
from agentrl.environments.tasks.db.backend import DATABASE_PREFIX
from agentrl.environments.tasks.db.judge import table_hash
from agentrl.messages import ChatMessage, ToolCall
from tests.unit.test_db import CHANGES

from .conftest import broker_answers

pytestmark = pytest.mark.integration

MYSQL = "mysql://root@127.0.0.1:3306"
SAMPLE = Path(__file__).resolve().parents[2].parent / "shared/agentbench/dbbench/dev.jsonl"


def session_databases(conn) -> set[str]:
    with conn.cursor() as cursor:
        cursor.execute("SHOW DATABASES")
        return {row[0] for row in cursor.fetchall() if row[0].startswith(DATABASE_PREFIX)}


def call(name: str, **arguments) -> ChatMessage:
    return ChatMessage(
        "assistant", "", [ToolCall(id="c", name=name, arguments=json.dumps(arguments))]
    )


def test_the_agentbench_sample_runs_on_the_server(server):
    if not SAMPLE.exists():
        pytest.skip(f"{SAMPLE} is absent")
    before = session_databases(server)
    env = make_task("db", data=str(SAMPLE), database=MYSQL, split="all")
    oracle = check("db", env, "oracle")
    assert oracle.instances == 60
    assert oracle.success_rate == 1.0, oracle.format()
    randomly = check("db", env, "random", seed=3)
    assert randomly.success_rate < 0.2, randomly.format()
    # every session's database was dropped (and a dead worker's left before, swept)
    assert session_databases(server) <= before


def test_the_built_in_set_runs_on_the_server(server):
    env = make_task("db", database=MYSQL)
    report = check("db", env, "oracle")
    assert report.success_rate == 1.0, report.format()


def test_sessions_are_private_and_dropped_at_the_end(server):
    env = make_task("db", database=MYSQL)
    index = next(i for i in range(env.num_instances) if env.item(i).mutation)
    item = env.item(index)
    a, b = env.start(index), env.start(index)
    assert len(session_databases(server)) >= 2
    step = env.interact(a.session, call("execute_sql", query=f"DELETE FROM `{item.table_name}`"))
    assert step.status == Status.RUNNING
    step = env.interact(
        b.session, call("execute_sql", query=f"SELECT COUNT(*) FROM `{item.table_name}`")
    )
    assert ast.literal_eval(step.messages[0].content) == [
        (len(item.rows),)
    ]  # b does not see a's change
    env.cancel(a.session)
    env.cancel(a.session)  # idempotent
    end = env.interact(b.session, call("commit_final_answer", answers=[]))
    assert end.finish and end.reward == 0.0  # nothing changed: the gold change was not made
    leftover = {
        name
        for name in session_databases(server)
        if name in {a.session.db._name, b.session.db._name}
    }
    assert leftover == set()


def test_no_rows_answer_an_empty_list_as_agentbench_does(server):
    """AgentBench's MySQL executor prints ``str(results)``, "[]" for an empty SELECT and
    every statement without rows (dbbench/interaction.py lines 84-105): as on SQLite."""
    env = make_task("db", database=MYSQL, split="all")
    session = env.start(0).session
    for sql in ("SELECT * FROM planets WHERE moons > 999", *CHANGES):
        step = env.interact(session, call("execute_sql", query=sql))
        assert (step.status, step.messages[0].content) == (Status.RUNNING, "[]"), sql
    step = env.interact(session, call("execute_sql", query="SELECT COUNT(*) FROM planets"))
    assert step.messages[0].content == "[(5,)]"  # 8 + Pluto - 4 rocky: the changes were made
    env.cancel(session)


def test_sql_errors_and_slow_statements_are_observations(server):
    env = make_task("db", database=MYSQL, statement_timeout=1.0)
    start = env.start(0)
    step = env.interact(start.session, call("execute_sql", query="SELEC nonsense"))
    assert step.status == Status.RUNNING and "error" in step.messages[0].content
    step = env.interact(start.session, call("execute_sql", query="SELECT SLEEP(5)"))
    # MariaDB stops the statement at max_statement_time: an error the model sees (or the
    # interrupted SLEEP's 1), never a wait of 5 s
    content = step.messages[0].content
    assert step.status == Status.RUNNING and ("error" in content or content == "[(1,)]"), content
    env.cancel(start.session)


def test_an_unreachable_server_is_an_infra_error():
    port = random.randint(20000, 30000)
    while broker_answers("127.0.0.1", port):
        port += 1
    env = make_task("db", database=f"mysql://root@127.0.0.1:{port}")
    with pytest.raises(InfraError, match="cannot reach"):
        env.start(0)


def test_bad_database_urls_are_refused():
    with pytest.raises(ValueError, match="scheme 'postgres'"):
        make_task("db", database="postgres://x")
    with pytest.raises(ValueError, match="takes no database name"):
        make_task("db", database="mysql://root@127.0.0.1/test")


def test_check_cli_takes_the_server_as_an_option(server, capsys):
    from agentrl.ops.cli.agentrl_env import main

    assert main(["check", "--task", "db", "--option", f"database={MYSQL}"]) == 0
    assert "succeeded (1.000)" in capsys.readouterr().out
    assert main(["check", "--task", "db", "--option", "database"]) == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err


def test_a_session_cannot_see_or_drop_another_sessions_database(server):
    env = make_task("db", database=MYSQL)
    a, b = env.start(0), env.start(0)
    other = b.session.db._name
    step = env.interact(a.session, call("execute_sql", query="SHOW DATABASES"))
    shown = {row[0] for row in ast.literal_eval(step.messages[0].content)}
    assert a.session.db._name in shown and other not in shown
    step = env.interact(a.session, call("execute_sql", query=f"DROP DATABASE `{other}`"))
    assert step.status == Status.RUNNING and "denied" in step.messages[0].content
    assert other in session_databases(server)
    mine = {a.session.db._name, other}
    env.cancel(a.session)
    env.cancel(b.session)
    with server.cursor() as cursor:  # (another test's dead session may wait for its sweep)
        cursor.execute("SELECT User FROM mysql.user WHERE User LIKE 'agentrl\\_%'")
        left = {row[0] for row in cursor.fetchall()}
    assert not mine & left  # the session accounts are dropped with their databases


def test_the_judges_table_hash_is_agentbenchs_sql_on_the_server(server):
    """AgentBench computes the hash in SQL (result_processor.py lines 101-112) on MySQL 8,
    whose group_concat_max_len is 1024; `table_hash` over the rows read as text gives the
    same value, NULLs and a table past 1024 joined characters included."""
    env = make_task("db", database=MYSQL, split="all")
    index = next(i for i in range(env.num_instances) if env.item(i).mutation)
    item, session = env.item(index), env.start(index).session
    table = item.table_name
    for sql in (
        f"INSERT INTO `{table}` SELECT * FROM `{table}`",
        f"UPDATE `{table}` SET `{item.columns[0][0]}` = NULL LIMIT 1",
    ) + (f"INSERT INTO `{table}` SELECT * FROM `{table}`",) * 5:
        step = env.interact(session, call("execute_sql", query=sql))
        assert step.messages[0].content == "[]", step.messages[0].content
    names = [name for name, _kind in item.columns]
    cols = ", ".join(f"`{name}`" for name in names)
    session.db.execute("SET SESSION group_concat_max_len = 1024")
    (agentbench,) = session.db.execute(
        "select md5(group_concat(rowhash order by rowhash)) as hash from( SELECT "
        f"substring(MD5(CONCAT_WS(',', {cols})), 1, 5) AS rowhash FROM `{table}`) as sub;"
    )
    rows = session.db.text_rows(table, names)
    assert len(rows) * 6 > 1024
    assert table_hash(rows) == agentbench[0]
    env.cancel(session)
