"""Hostile SQL against the db task's SQLite collation, played through the task's session
API as a model would: comparisons of megabyte texts under ``COLLATE agentbench`` (the one
Python function a statement runs, where SQLite's progress handler does not reach) must end
within the statement limit, and must not starve another session of the same worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.environments.tasks.db.backend_sqlite import FOLDED_CHARS, mysql_collation

ROOT = Path(__file__).resolve().parents[2]

BIG = (
    "CREATE TABLE big AS WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
    "LIMIT 30) SELECT replace(hex(zeroblob(450000)), '00', 'é') || i AS x FROM r"
)
"""30 texts of 900 KB that differ only in their last character."""

ATTACKS = [
    "SELECT count(*) FROM big a, big b WHERE a.x = b.x COLLATE agentbench",
    "SELECT count(*) FROM big a, big b WHERE a.x < b.x COLLATE agentbench",
    "SELECT x FROM (SELECT a.x || b.x AS x FROM big a, big b) ORDER BY x COLLATE agentbench",
    "SELECT count(DISTINCT a.x || b.x COLLATE agentbench) FROM big a, big b",
]
"""Joins, sorts and distinct counts that call the collation once per pair of huge texts."""

VICTIM = (
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 40000) "
    "SELECT count(DISTINCT ('Montréal ' || (i % 5000)) COLLATE agentbench) FROM r"
)
"""An honest statement of another session that calls the collation many times."""

SCRIPT = """
import json, sys, threading, time
from agentrl.environments import make_task
from agentrl.messages import ChatMessage, ToolCall

def say(sql):
    call = ToolCall(id="c", name="execute_sql", arguments=json.dumps({"query": sql}))
    return ChatMessage("assistant", "", [call])

spec = json.loads(sys.argv[1])
env = make_task("db", split="all", max_turns=20, statement_timeout=spec["timeout"])
victim_env = make_task("db", split="all", max_turns=20, statement_timeout=60.0)
attacker, victim = env.start(0).session, victim_env.start(0).session

def timed(e, session, sql):
    start = time.monotonic()
    seen = e.interact(session, say(sql)).messages[0].content
    return seen, time.monotonic() - start

report = {"made": timed(env, attacker, spec["big"])[0]}
report["alone"] = timed(victim_env, victim, spec["victim"])
report["attacks"], report["shared"] = [], []
for attack in spec["attacks"]:
    done = threading.Event()
    def play():
        report["attacks"].append(timed(env, attacker, attack))
        done.set()
    thread = threading.Thread(target=play)
    thread.start()
    time.sleep(0.2)
    report["shared"].append(timed(victim_env, victim, spec["victim"]))
    thread.join()
print(json.dumps(report))
"""


@pytest.mark.slow
def test_huge_texts_under_the_collation_end_in_time_and_starve_no_other_session():
    timeout = 2.0
    spec = {"timeout": timeout, "big": BIG, "attacks": ATTACKS, "victim": VICTIM}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # every statement, all four attacks together, stays far below this
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["made"] == "[]", report["made"]
    alone_seen, alone = report["alone"]
    for (seen, took), attack in zip(report["attacks"], ATTACKS, strict=True):
        assert took < timeout + 1.5, (attack, took, seen)
    for seen, took in report["shared"]:
        assert seen == alone_seen, seen  # answered, not over its own limit
        # two statements share the interpreter: about twice the time, with room for a
        # loaded machine; a starved session waits for the attack's whole run instead
        assert took < 3 * alone + timeout + 1.0, (took, alone)


def test_the_collation_folds_case_and_accents_of_realistic_values():
    assert mysql_collation("Montréal", "MONTREAL") == 0
    assert mysql_collation("Éclair", "eclair") == 0
    assert mysql_collation("apple", "Banana") == -1
    assert mysql_collation("Zoë", "zoe ") == -1
    long_a, long_b = "é" * FOLDED_CHARS + "a", "E" * FOLDED_CHARS + "a"
    assert mysql_collation(long_a, long_b) == 0  # folded up to the bound, then as written
    assert mysql_collation(long_a, "E" * FOLDED_CHARS + "A") == 1


def test_the_collation_is_a_total_order_across_the_bound():
    texts = [
        "a", "A", "á", "b", "a" * FOLDED_CHARS + "x", "A" * FOLDED_CHARS + "X",
        "á" * FOLDED_CHARS + "x", "a" * FOLDED_CHARS, "a" * (FOLDED_CHARS - 1) + "b",
    ]  # fmt: skip
    for x in texts:
        assert mysql_collation(x, x) == 0
        for y in texts:
            assert mysql_collation(x, y) == -mysql_collation(y, x)
            for z in texts:
                if mysql_collation(x, y) <= 0 and mysql_collation(y, z) <= 0:
                    assert mysql_collation(x, z) <= 0, (x[-3:], y[-3:], z[-3:])
