"""The db task (AgentBench DB format on SQLite) and `agentrl-env check`."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from importlib import resources
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments._protocol import InfraError, SampleError, SessionClosed, Status
from agentrl.environments.tasks.db.backend import MySQLDatabase, parse_database_url
from agentrl.environments.tasks.db.task import ItemError, load_items, user_prompt
from agentrl.messages import ChatMessage, ToolCall
from agentrl.ops.cli import agentrl_env as cli_env

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
    env = make_task("db", data=str(AGENTBENCH_DB), split="all")
    assert check("db", env, "oracle").success_rate == 1.0  # gold answers and gold SQL
    assert check("db", env, "random").success_rate < 0.2


def test_a_query_session_step_by_step():
    env = make_task("db", split="all")
    start = env.start(0)  # "How many planets have more than 20 moons?" -> 3
    assert "planets" in start.messages[-1].content
    step = env.interact(
        start.session,
        _say(("execute_sql", {"query": "SELECT COUNT(*) FROM planets WHERE moons > 20"})),
    )
    assert (step.status, step.messages[0].content) == (Status.RUNNING, "[(3,)]")
    step = env.interact(start.session, _say(("execute_sql", {"query": "SELEC nonsense"})))
    assert step.status == Status.RUNNING and step.messages[0].content.startswith("error:")
    step = env.interact(start.session, _say(("commit_final_answer", {"answers": [" 3.0 "]})))
    assert (step.status, step.reward, step.finish) == (Status.COMPLETED, 1.0, True)
    assert step.metrics["env/sql_errors"] == 1.0 and step.metrics["env/statements"] == 2.0
    with pytest.raises(SessionClosed):
        env.interact(start.session, _say(("commit_final_answer", {"answers": ["3"]})))


def test_a_change_is_judged_by_the_table_and_sessions_do_not_share_it():
    env = make_task("db", split="all")
    index = next(i for i in range(env.num_instances) if env.item(i).kind == "DELETE")
    first, second = env.start(index), env.start(index)
    env.interact(
        first.session, _say(("execute_sql", {"query": "DELETE FROM planets WHERE moons = 0"}))
    )
    done = env.interact(first.session, _say(("commit_final_answer", {"answers": []})))
    assert done.reward == 1.0
    # the other session still has all eight planets; committing without the change fails
    step = env.interact(
        second.session, _say(("execute_sql", {"query": "SELECT COUNT(*) FROM planets"}))
    )
    assert step.messages[0].content == "[(8,)]"
    assert (
        env.interact(second.session, _say(("commit_final_answer", {"answers": []}))).reward == 0.0
    )


def test_bad_calls_get_agentbench_replies_and_the_episode_goes_on():
    """Replies and limits as AgentBench's dbbench (THUDM/AgentBench,
    src/server/tasks/dbbench/task.py): no tool call -> user message "Internal error:
    No tool calls found despite finish reason." (lines 126-131); unparsable arguments ->
    tool message "Error: Failed to parse tool call. Tool call format is incorrect."
    (lines 139-146); an unknown function -> tool message "Invalid function call. Please
    call a tool instead." (lines 227-233); the first argument is read whatever its name
    (line 150: ``list(arguments.values())[0]``); 15 rounds then TASK_LIMIT_REACHED with
    reward 0 (configs/tasks/dbbench.yaml line 5 ``max_round: 15``; task.py lines 119
    and 235-237)."""
    env = make_task("db", split="all")
    session = env.start(0).session  # "How many planets have more than 20 moons?" -> 3
    step = env.interact(session, ChatMessage("assistant", "I think it is 3."))
    assert (step.status, step.finish, step.reward) == (Status.RUNNING, False, 0.0)
    assert [(m.role, m.content) for m in step.messages] == [
        ("user", "Internal error: No tool calls found despite finish reason.")
    ]
    bad_json = ChatMessage("assistant", "", [ToolCall("c0", "execute_sql", "{not json")])
    step = env.interact(session, bad_json)
    assert [(m.role, m.content, m.tool_call_id) for m in step.messages] == [
        ("tool", "Error: Failed to parse tool call. Tool call format is incorrect.", "c0")
    ]
    step = env.interact(session, _say(("drop_everything", {})))
    assert [(m.role, m.content) for m in step.messages] == [
        ("tool", "Invalid function call. Please call a tool instead.")
    ]
    step = env.interact(session, _say(("execute_sql", {"sql": "SELECT 1"})))  # first argument
    assert step.messages[0].content == "[(1,)]"
    for _ in range(10):
        step = env.interact(session, _say(("execute_sql", {"query": "SELECT 1"})))
        assert step.status == Status.RUNNING
    step = env.interact(session, _say(("execute_sql", {"query": "SELECT 1"})))  # the 15th
    assert (step.status, step.reward, step.finish) == (Status.TASK_LIMIT_REACHED, 0.0, True)
    assert step.metrics["env/bad_calls"] == 3.0 and step.metrics["env/turns"] == 15.0


def test_every_call_of_a_message_runs_until_a_commit_ends_the_episode():
    """AgentBench's dbbench runs the calls of a message in order (task.py line 133) and
    returns at the first commit (lines 171-225), so the calls after it never run."""
    env = make_task("db", split="all")
    session = env.start(0).session
    step = env.interact(
        session,
        _say(
            ("execute_sql", {"query": "SELECT 1"}),
            ("nope", {}),
            ("execute_sql", {"query": "SELECT 2"}),
        ),
    )
    assert [m.content for m in step.messages] == [
        "[(1,)]",
        "Invalid function call. Please call a tool instead.",
        "[(2,)]",
    ]
    step = env.interact(
        session,
        _say(
            ("execute_sql", {"query": "SELECT 3"}),
            ("commit_final_answer", {"answers": "3"}),
            ("execute_sql", {"query": "SELECT 4"}),
        ),
    )
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)
    assert [m.content for m in step.messages] == ["[(3,)]"]
    assert step.metrics["env/statements"] == 3.0


def test_a_commit_without_arguments_is_a_bad_call_not_an_ending():
    env = make_task("db", split="all")
    session = env.start(0).session
    step = env.interact(session, _say(("commit_final_answer", {})))
    assert step.status == Status.RUNNING
    assert (
        step.messages[0].content
        == "Error: Failed to parse tool call. Tool call format is incorrect."
    )


def test_turn_limit():
    env = make_task("db", max_turns=2, split="all")
    start = env.start(0)
    env.interact(start.session, _say(("execute_sql", {"query": "SELECT 1"})))
    step = env.interact(start.session, _say(("execute_sql", {"query": "SELECT 1"})))
    assert step.status == Status.TASK_LIMIT_REACHED and step.finish


def test_the_prompt_and_tools_are_agentbenchs():
    """AgentBench's dbbench/task.py: SYSTEM_PROMPT (lines 23-34); the user message
    "Evidence about the question: " / "Additional table information about the question: "
    / "Question: ", each line ending in a newline (lines 108-113). Tools from
    configs/tasks/dbbench.yaml lines 7-35: execute_sql(query), commit_final_answer(answers)."""
    env = make_task("db", split="all")
    system, user = env.start(0).messages
    assert system.content.startswith("I will ask you a question, then you should help me ")
    assert system.content.endswith("you have to deal with it by yourself.")
    assert len(system.content.splitlines()) == 12
    item = env.item(0)
    assert user.content == (
        f"Additional table information about the question: {item.add_description}\n"
        f"Question: {item.description}\n"
    )
    with_evidence = dataclasses.replace(item, evidence="moons are natural satellites")
    assert user_prompt(with_evidence).startswith(
        "Evidence about the question: moons are natural satellites\n"
        "Additional table information about the question: "
    )
    tools = {t["function"]["name"]: t["function"] for t in env.tools}
    assert tools["execute_sql"]["parameters"]["required"] == ["query"]
    assert tools["execute_sql"]["description"] == (
        "Executes a given SQL statement on the database and returns the result."
    )
    assert tools["commit_final_answer"]["parameters"]["properties"]["answers"]["type"] == "array"
    assert tools["commit_final_answer"]["description"] == (
        "Commits the final answer after all operations are completed."
    )


def test_observations_are_printed_as_agentbench_prints_them():
    """AgentBench's dbbench/interaction.py lines 84-105: ``str`` of the fetched row tuples,
    cut at 800 characters with "[TRUNCATED]"; an empty result is ``str([])``, "[]" (task.py
    lines 154-155 say "No response from database." only for an empty text)."""
    env = make_task("db", split="all")
    session = env.start(0).session
    step = env.interact(
        session, _say(("execute_sql", {"query": "SELECT name FROM planets WHERE moons > 90"}))
    )
    assert step.messages[0].content == "[('Jupiter',), ('Saturn',)]"
    step = env.interact(
        session, _say(("execute_sql", {"query": "SELECT * FROM planets WHERE moons > 999"}))
    )
    assert step.messages[0].content == "[]"
    long = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500) "
    step = env.interact(session, _say(("execute_sql", {"query": long + "SELECT x FROM c"})))
    assert step.messages[0].content == str([(x,) for x in range(1, 501)])[:800] + "[TRUNCATED]"


CHANGES = (
    "INSERT INTO planets VALUES ('Pluto', 5, 2377, 'dwarf')",
    "UPDATE planets SET moons = moons + 1 WHERE name = 'Earth'",
    "UPDATE planets SET moons = 0 WHERE name = 'Vulcan'",  # no row matched
    "DELETE FROM planets WHERE type = 'rocky'",
    "CREATE TABLE notes (body TEXT)",
    "DROP TABLE notes",
)
"""Statements without rows; AgentBench's MySQL executor answers each ``str([])``: its
``results`` list is filled only when ``cursor.with_rows`` (interaction.py lines 87-93)."""


def test_a_change_statement_answers_an_empty_list_as_agentbench_does():
    env = make_task("db", split="all")
    session = env.start(0).session
    for sql in CHANGES:
        step = env.interact(session, _say(("execute_sql", {"query": sql})))
        assert (step.status, step.messages[0].content) == (Status.RUNNING, "[]"), sql
    step = env.interact(session, _say(("execute_sql", {"query": "SELECT COUNT(*) FROM planets"})))
    assert step.messages[0].content == "[(5,)]"  # 8 + Pluto - 4 rocky: the changes were made


def test_answers_that_are_neither_text_nor_a_list_end_the_episode_with_reward_0():
    """AgentBench's task.py line 176 slices the committed answer (``answer[:100]``): a number
    or an object raises there and the sample ends as an error, reward 0 (lines 242-245);
    an empty answer is judged (lines 173-174), None as "0" (result_processor.py 200-202)."""
    env = make_task("db", split="all")
    step = env.interact(env.start(0).session, _say(("commit_final_answer", {"answers": 3})))
    assert (step.status, step.finish, step.reward) == (Status.COMPLETED, True, 0.0)
    step = env.interact(env.start(0).session, _say(("commit_final_answer", {"answers": "3"})))
    assert step.reward == 1.0


@pytest.mark.skipif(not AGENTBENCH_DB.exists(), reason=f"no AgentBench sample at {AGENTBENCH_DB}")
def test_a_change_is_judged_by_agentbenchs_table_hash():
    """dev.jsonl's changes carry ``answer_md5``, AgentBench's MySQL hash of the table after
    the gold SQL (result_processor.py lines 101-112; task.py lines 182-209): the gold SQL
    matches it on SQLite, a different change does not."""
    env = make_task("db", data=str(AGENTBENCH_DB), split="all")
    index = next(i for i in range(env.num_instances) if env.item(i).kind == "UPDATE")
    item = env.item(index)
    assert item.answer_md5.startswith("[('")
    for sql, reward in ((item.label[0], 1.0), (f"DELETE FROM `{item.table_name}`", 0.0)):
        session = env.start(index).session
        step = env.interact(session, _say(("execute_sql", {"query": sql})))
        assert step.messages[0].content == "[]"  # AgentBench's str(results) of no rows
        end = env.interact(session, _say(("commit_final_answer", {"answers": ["done"]})))
        assert end.reward == reward


def test_bad_data_is_reported_with_where_it_is(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"description": "x"}\n')
    with pytest.raises(ItemError, match=r"bad.jsonl:1: not a dbbench item"):
        load_items(bad)
    bad.write_text("not json\n")
    with pytest.raises(ItemError, match=r"bad.jsonl:1: not JSON"):
        load_items(bad)
    builtin = resources.files("agentrl.environments.tasks.db").joinpath("data/db_builtin.jsonl")
    item = json.loads(builtin.read_text().splitlines()[5])  # the INSERT item
    item["label"] = ["INSERT INTO nowhere VALUES (1)"]
    good = tmp_path / "gold-fails.jsonl"
    good.write_text(json.dumps(item) + "\n")
    env = make_task("db", data=str(good), split="all")
    report = check("db", env, "oracle")
    assert report.successes == 0
    assert "cannot start" in report.failures[0] and "the gold SQL fails" in report.failures[0]
    # a sample error: the rollout publishes it as task_error, untrained, and goes on
    with pytest.raises(SampleError, match="the gold SQL fails"):
        env.start(0)


def test_cli_check(capsys, tmp_path):
    assert (
        cli_env.main(["check", "--task", "db", "--agent", "oracle", "--option", "split=all"]) == 0
    )
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
    env = make_task("db", split="all", statement_timeout=0.2)
    session = env.start(0).session
    endless = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    )
    step = env.interact(session, _say(("execute_sql", {"query": endless})))
    assert step.status == Status.RUNNING
    assert step.messages[0].content == "error: the statement ran over 0.2 s"
    step = env.interact(session, _say(("execute_sql", {"query": "SELECT '\ud800'"})))
    assert step.status == Status.RUNNING and step.messages[0].content.startswith("error: ")


class _FakeCursor:
    def __init__(self, conn):
        self._conn = conn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, args=None):
        self._conn.statements.append(sql)
        if sql.startswith(self._conn.fail_on):
            raise self._conn.module.err.OperationalError(1044, "access denied")

    def fetchall(self):
        return []


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
    made = [s for s in conn.statements if s.startswith("CREATE")]
    assert made[0].startswith("CREATE DATABASE `agentrl_")
    assert made[1].startswith("CREATE USER 'agentrl_")
    assert conn.statements[-2].startswith("DROP DATABASE IF EXISTS `agentrl_")
    assert conn.statements[-1].startswith("DROP USER IF EXISTS 'agentrl_") and conn.closed
