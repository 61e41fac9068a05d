"""Hostile SQL against the db task's SQLite backend, played through the task's session API
as a model under training would: reaching files of the host, and exhausting the worker's
memory or time. Each attack class is played in many spellings; each must end in an error
observation (or a bounded one), with no file of the host read or made, the worker's
memory and time bounded, no reward, and the session still answering."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.environments import Status, make_task
from agentrl.environments.tasks.db.database import DEFAULT_LIMITS
from agentrl.messages import ChatMessage, ToolCall

ROOT = Path(__file__).resolve().parents[2]
SECRET = "host-secret-7f3a"

FILE_ATTACKS = [
    "ATTACH DATABASE '{db}' AS x",
    "attach '{db}' as x",
    "AtTaCh /* a comment */ DATABASE\n'{db}' AS x",
    "ATTACH 'file:{db}?mode=ro' AS x",
    "ATTACH 'file:{db}?immutable=1' AS x",
    "ATTACH 'file:{new}?mode=rwc' AS x",
    "ATTACH '{new}' AS x",
    "ATTACH ('{dir}' || '/made.db') AS x",
    "ATTACH ':memory:' AS x",
    "VACUUM INTO '{new}'",
    "vacuum main into 'file:{new}'",
    "SELECT load_extension('{dir}/evil.so')",
    "SELECT load_extension('libc.so.6', 'system')",
    "SELECT fts3_tokenizer('simple')",
    "CREATE VIRTUAL TABLE v USING fts5(x)",
    "PRAGMA temp_store_directory = '{dir}'",
    "PRAGMA writable_schema = ON",
    "pragma MAIN.max_page_count = 2147483646",
    "PRAGMA hard_heap_limit = 0",
    "PRAGMA soft_heap_limit = 0",
    "PRAGMA journal_mode = WAL",
    "PRAGMA temp_store = FILE",
    "PRAGMA mmap_size = 268435456",
    "SELECT * FROM pragma_database_list",
    "CREATE TEMP TABLE tt AS SELECT 1",
]
"""Reaching the host's files: ATTACH in every spelling (URIs, expressions), VACUUM INTO,
extensions, pragmas that touch files or lift limits, virtual and temp tables."""

EXHAUSTION_ATTACKS = [
    "SELECT zeroblob(200000000)",
    "SELECT randomblob(200000000)",
    "SELECT hex(zeroblob(100000000))",
    "SELECT printf('%.*c', 200000000, 'x')",
    "SELECT replace(hex(zeroblob(400000)), '0', hex(zeroblob(400000)))",
    "SELECT upper(zeroblob(1000000)) || upper(zeroblob(1000000))",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT group_concat(x) FROM r",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r LIMIT 5000) "
    "SELECT group_concat(zeroblob(500000)) FROM r",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
    "SELECT x, randomblob(9999) FROM r",
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r LIMIT 30000000) "
    "SELECT x, randomblob(100) FROM r ORDER BY random()",
    "CREATE TABLE big AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
    "SELECT randomblob(900000) AS b FROM r",
    "SELECT * FROM {table} a, {table} b, {table} c, {table} d, {table} e, {table} f",
    "SELECT a.*, zeroblob(1000000) FROM {table} a, {table} b, {table} c",
]
"""Exhausting memory or time: huge values, recursive CTEs, huge aggregates, sorts, cross
joins with huge results, a table that grows without end."""


def _say(sql: str) -> ChatMessage:
    call = ToolCall(id="c", name="execute_sql", arguments=json.dumps({"query": sql}))
    return ChatMessage("assistant", "", [call])


def _commit(answers: list[str]) -> ChatMessage:
    call = ToolCall(id="c", name="commit_final_answer", arguments=json.dumps({"answers": answers}))
    return ChatMessage("assistant", "", [call])


@pytest.fixture
def host(tmp_path):
    """A SQLite file of the host's holding a secret, and where an attack would make one."""
    db = tmp_path / "host.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE secret (v TEXT)")
    conn.execute("INSERT INTO secret VALUES (?)", (SECRET,))
    conn.commit()
    conn.close()
    return {"db": str(db), "new": str(tmp_path / "made.db"), "dir": str(tmp_path)}


def test_no_spelling_of_file_access_reads_or_makes_a_host_file(host, tmp_path):
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    env = make_task("db", split="all", max_turns=4 * len(FILE_ATTACKS) + 10)
    session = env.start(0).session
    for attack in FILE_ATTACKS:
        sql = attack.format(**host)
        step = env.interact(session, _say(sql))
        seen = step.messages[0].content
        assert step.status == Status.RUNNING, sql
        assert seen.startswith("error: "), f"{sql!r} was allowed: {seen}"
        for after in ("SELECT * FROM x.secret", "SELECT * FROM secret", "SELECT * FROM v"):
            assert SECRET not in env.interact(session, _say(after)).messages[0].content
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing made or changed
    table = env.item(0).table_name
    step = env.interact(session, _say(f'SELECT count(*) FROM "{table}"'))
    assert step.messages[0].content.startswith("[(")  # the session still answers
    assert env.interact(session, _commit([SECRET])).reward == 0.0


def test_the_read_only_table_pragmas_still_answer():
    env = make_task("db", split="all")
    session = env.start(0).session
    table = env.item(0).table_name
    step = env.interact(session, _say(f"PRAGMA table_info('{table}')"))
    assert step.messages[0].content.startswith("[(0, "), step.messages[0].content


def _probe(statements: list[str], **options) -> dict:
    """`tests.security.db_probe` in a process of its own (its peak RSS is the attack's)."""
    spec = {"options": {"split": "all", "max_turns": len(statements) + 5, **options},
            "statements": statements, "answer": ["0"]}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "tests.security.db_probe", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]  # the worker did not crash
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_memory_and_time_exhaustion_stay_within_the_limits():
    timeout = 2.0
    table = make_task("db", split="all").item(0).table_name
    attacks = [a.format(table=f'"{table}"') for a in EXHAUSTION_ATTACKS]
    report = _probe([*attacks, "SELECT 1"], statement_timeout=timeout)
    *played, last = report["played"]
    start = played[0]["rss_before_kib"]
    for p in played:
        assert p["status"] == "running", p["sql"]
        # the time limit covers running the statement and reading and showing its rows
        assert p["seconds"] < timeout + 1.5, (p["sql"], p["seconds"])
        assert len(p["observation"]) <= 800 + len("[TRUNCATED]") + 200, p["sql"]
    peak = (played[-1]["rss_after_kib"] - start) << 10
    # SQLite allocates at most max_memory_bytes; Python holds no more than the shown rows
    assert peak < DEFAULT_LIMITS["max_memory_bytes"] + (96 << 20), [
        (p["sql"][:60], (p["rss_after_kib"] - p["rss_before_kib"]) >> 10) for p in played
    ]
    assert last["observation"] == "[(1,)]"  # the worker still answers
    assert report["reward"] == 0.0


@pytest.mark.slow
def test_a_lower_memory_limit_holds_the_worker_to_it():
    sort = EXHAUSTION_ATTACKS[10]
    report = _probe([sort, "SELECT 1"], statement_timeout=5.0, max_memory_bytes=32 << 20)
    played, last = report["played"]
    assert played["observation"].startswith("error: out of memory"), played["observation"]
    assert (played["rss_after_kib"] - played["rss_before_kib"]) << 10 < 80 << 20
    assert last["observation"] == "[(1,)]"
