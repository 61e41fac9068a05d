"""The db task (AgentBench DB format on SQLite) and `agentrl-env check`."""

from __future__ import annotations

import json
import sys
import types
from importlib import resources
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments._dbbackend import MySQLDatabase, parse_database_url
from agentrl.environments._dbbench import ItemError, load_items, same_answers
from agentrl.environments._protocol import InfraError, SessionClosed, Status
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops import cli_env

AGENTBENCH_DB = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "dbbench" / "dev.jsonl"
)


def _say(*calls: tuple[str, dict]) -> ChatMessage:
    return ChatMessage(
        "assistant",
        "",
        [ToolCall(f"c{i}", name, json.dumps(a)) for i, (name, a) in enumerate(calls)],
    )


def test_built_in_set_oracle_succeeds_everywhere_and_random_nowhere():
    env = make_task("db")
    assert check("db", env, "oracle").success_rate == 1.0
    report = check("db", env, "random")
    assert report.successes == 0 and len(report.failures) == env.num_instances


@pytest.mark.skipif(not AGENTBENCH_DB.exists(), reason=f"no AgentBench sample at {AGENTBENCH_DB}")
def test_the_agentbench_sample_loads_and_runs_end_to_end():
    items = load_items(AGENTBENCH_DB)
    assert len(items) == 60
    assert {i.kind for i in items} >= {"INSERT", "UPDATE", "counting", "other"}
    env = make_task("db", data=str(AGENTBENCH_DB))
    assert check("db", env, "oracle").success_rate == 1.0  # gold answers and gold SQL
    assert check("db", env, "random").success_rate < 0.2


def test_a_query_session_step_by_step():
    env = make_task("db")
    start = env.start(0)  # "How many planets have more than 20 moons?" -> 3
    assert "planets" in start.messages[-1].content
    step = env.interact(
        start.session,
        _say(("execute_sql", {"sql": "SELECT COUNT(*) FROM planets WHERE moons > 20"})),
    )
    assert (step.status, step.messages[0].content) == (Status.RUNNING, "[[3]]")
    step = env.interact(start.session, _say(("execute_sql", {"sql": "SELEC nonsense"})))
    assert step.status == Status.RUNNING and step.messages[0].content.startswith("error:")
    step = env.interact(start.session, _say(("commit_final_answer", {"answers": [" 3.0 "]})))
    assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
    assert step.metrics["env/sql_errors"] == 1.0 and step.metrics["env/statements"] == 2.0
    with pytest.raises(SessionClosed):
        env.interact(start.session, _say(("commit_final_answer", {"answers": ["3"]})))


def test_a_change_is_judged_by_the_table_and_sessions_do_not_share_it():
    env = make_task("db")
    index = next(i for i in range(env.num_instances) if env.item(i).kind == "DELETE")
    first, second = env.start(index), env.start(index)
    env.interact(
        first.session, _say(("execute_sql", {"sql": "DELETE FROM planets WHERE moons = 0"}))
    )
    done = env.interact(first.session, _say(("commit_final_answer", {"answers": []})))
    assert done.reward == 1.0
    # the other session still has all eight planets; committing without the change fails
    step = env.interact(
        second.session, _say(("execute_sql", {"sql": "SELECT COUNT(*) FROM planets"}))
    )
    assert step.messages[0].content == "[[8]]"
    assert (
        env.interact(second.session, _say(("commit_final_answer", {"answers": []}))).reward == 0.0
    )


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (ChatMessage("assistant", "I think it is 3."), Status.AGENT_INVALID_ACTION),
        (_say(("drop_everything", {})), Status.AGENT_INVALID_ACTION),
        (_say(("execute_sql", {"query": "SELECT 1"})), Status.AGENT_INVALID_ACTION),
        (_say(("commit_final_answer", {"answer": "3"})), Status.AGENT_INVALID_ACTION),
    ],
)
def test_model_failures_end_with_their_status(message, status):
    env = make_task("db")
    step = env.interact(env.start(0).session, message)
    assert (step.status, step.reward, step.finish) == (status, 0.0, True)


def test_turn_limit():
    env = make_task("db", max_turns=2)
    start = env.start(0)
    env.interact(start.session, _say(("execute_sql", {"sql": "SELECT 1"})))
    step = env.interact(start.session, _say(("execute_sql", {"sql": "SELECT 1"})))
    assert step.status == Status.TASK_LIMIT_REACHED and step.finish


def test_answers_compare_as_multisets_of_values():
    assert same_answers(["Ulysses", "Dune"], ["Dune", "Ulysses"])
    assert same_answers(["15.0"], ["15"]) and same_answers(["1,000"], ["1000"])
    assert not same_answers(["Dune"], ["Dune", "Ulysses"])
    assert not same_answers(["dune"], ["Dune"])
    assert not same_answers(["15.01"], ["15"])


def test_bad_data_is_reported_with_where_it_is(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"description": "x"}\n')
    with pytest.raises(ItemError, match=r"bad.jsonl:1: not a dbbench item"):
        load_items(bad)
    bad.write_text("not json\n")
    with pytest.raises(ItemError, match=r"bad.jsonl:1: not JSON"):
        load_items(bad)
    builtin = resources.files("agentrl.environments").joinpath("data/db_builtin.jsonl")
    item = json.loads(builtin.read_text().splitlines()[5])  # the INSERT item
    item["label"] = ["INSERT INTO nowhere VALUES (1)"]
    good = tmp_path / "gold-fails.jsonl"
    good.write_text(json.dumps(item) + "\n")
    report = check("db", make_task("db", data=str(good)), "oracle")
    assert report.successes == 0
    assert "cannot start" in report.failures[0] and "the gold SQL fails" in report.failures[0]


def test_cli_check(capsys, tmp_path):
    assert cli_env.main(["check", "--task", "db", "--agent", "oracle"]) == 0
    assert "task db, agent oracle: 8/8 succeeded (1.000)" in capsys.readouterr().out
    assert cli_env.main(["check", "--task", "db", "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "agentrl-env:" in capsys.readouterr().err
    assert cli_env.main(["check", "--task", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err
    # calculator has 10,000 instances by default; the check handles any count
    env = make_task("calculator", num_instances=30)
    assert check("calculator", env, "oracle").success_rate == 1.0
    assert check("calculator", env, "random").success_rate == 0.0


def test_a_statement_over_the_time_limit_and_unencodable_sql_are_error_observations():
    env = make_task("db", statement_timeout=0.2)
    session = env.start(0).session
    endless = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    )
    step = env.interact(session, _say(("execute_sql", {"sql": endless})))
    assert step.status == Status.RUNNING
    assert step.messages[0].content == "error: the statement ran over 0.2 s"
    step = env.interact(session, _say(("execute_sql", {"sql": "SELECT '\ud800'"})))
    assert step.status == Status.RUNNING and step.messages[0].content.startswith("error: ")


class _FakeCursor:
    def __init__(self, conn):
        self._conn = conn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql):
        self._conn.statements.append(sql)
        if sql.startswith(self._conn.fail_on):
            raise self._conn.module.err.OperationalError(1044, "access denied")


def test_a_mysql_session_whose_setup_fails_drops_its_database_and_connection(monkeypatch):
    """A fake pymysql whose server refuses GRANT: the database and the session account made
    are dropped, the admin link closed, no session link opened."""
    err = types.SimpleNamespace(MySQLError=type("MySQLError", (Exception,), {}))
    err.OperationalError = type("OperationalError", (err.MySQLError,), {})
    err.InterfaceError = type("InterfaceError", (err.MySQLError,), {})
    conns = []

    class Conn:
        module, fail_on = types.SimpleNamespace(err=err), "GRANT"

        def __init__(self, **kwargs):
            self.statements, self.closed = [], False
            conns.append(self)

        def cursor(self):
            return _FakeCursor(self)

        def close(self):
            self.closed = True

    monkeypatch.setitem(sys.modules, "pymysql", types.SimpleNamespace(connect=Conn, err=err))
    with pytest.raises(InfraError):
        MySQLDatabase(parse_database_url("mysql://root@db"), "t", [("a", "TEXT")], [])
    (conn,) = conns
    assert conn.statements[0].startswith("CREATE DATABASE `agentrl_")
    assert conn.statements[1].startswith("CREATE USER 'agentrl_")
    assert conn.statements[-2].startswith("DROP DATABASE IF EXISTS `agentrl_")
    assert conn.statements[-1].startswith("DROP USER IF EXISTS 'agentrl_") and conn.closed
