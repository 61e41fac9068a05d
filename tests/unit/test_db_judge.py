"""The db task's judge (`tasks.db.judge`) and SQLite dialect (`tasks.db.dialect`), as AgentBench.

Expected values come from THUDM/AgentBench src/server/tasks/dbbench/result_processor.py
(cited per test) and were worked by hand from its rules.
"""

from __future__ import annotations

import hashlib

import pytest

from agentrl.environments.tasks.db.backend import SQLiteDatabase, mysql_collation
from agentrl.environments.tasks.db.dialect import to_sqlite
from agentrl.environments.tasks.db.judge import clean_answer, normalize, same_answers, table_hash


def test_values_are_normalized_as_agentbench_normalizes_them():
    """result_processor.py lines 114-155 (``_normalize_special_values``): None -> "0";
    trim; a trailing % is cut and returned at once; commas dropped unless bracketed;
    none/null/undefined/nan/inf/infinity/-inf/-infinity/"" -> "0" in any case."""
    assert normalize(None) == "0"
    assert normalize(" 12.5% ") == "12.5"
    assert normalize("nan%") == "nan"  # the % rule returns before the special values
    assert normalize("1,234,567") == "1234567"
    assert normalize("[1,2]") == "[1,2]"
    for special in ("None", "NULL", "undefined", "NaN", "inf", "-Infinity", "", "  "):
        assert normalize(special) == "0", special
    assert normalize("Dune") == "Dune"  # case kept


def test_answers_are_cleaned_into_lists_of_values():
    """result_processor.py lines 157-194 (a database result's text ``[(x,), ...]``: one
    value per one-value row) and 197-263 (``_clean_answer``: None -> ["0"]; a bracketed
    text as a list, quotes stripped, split at commas outside quotes when it is no literal;
    a list item that is a one-value tuple gives its value)."""
    assert clean_answer(None) == ["0"]
    assert clean_answer("[('Jupiter',), ('Saturn',)]") == ["Jupiter", "Saturn"]
    assert clean_answer("[(293.0,)]") == ["293.0"]
    assert clean_answer("[('a', 1), ('b',)]") == ["b"]  # rows of two values are skipped
    assert clean_answer("['a', \"b\"]") == ["a", "b"]
    assert clean_answer("[Dune,,'Ulysses', ,x]") == ["Dune", "Ulysses", "0", "x"]  # " " -> "0"
    assert clean_answer(" 'Dune' ") == ["Dune"]
    assert clean_answer(["1,000", ("x",), None, 7]) == ["1000", "x", "0", "7"]
    assert clean_answer(12) == ["12"]
    assert clean_answer("[1+1]") == ["1+1"]  # not run (AgentBench evals it to [2])
    assert clean_answer("[1][0]") == ["1][0"]  # not run (AgentBench: 1, then no answer)


@pytest.mark.parametrize(
    ("answer", "label", "same"),
    [
        (["15.005"], ["15"], True),  # within 1e-2 (lines 274-280)
        (["15.02"], ["15"], False),
        (["1,000"], ["1000.0"], True),
        (["50%"], ["50"], True),
        (["null"], ["none"], True),  # both "0" (lines 40-42)
        ([None], ["nan"], True),
        (["dune"], ["Dune"], False),  # text is compared exactly
        ("[('Jupiter',)]", ["Jupiter"], True),  # a result's text as the answer
        (["Dune", "Ulysses", "Dune"], ["Ulysses", "Dune"], True),  # sets (line 74)
        (["Dune"], ["Dune", "Ulysses"], False),
        (["1", "2", "2"], ["2", "1", "2.001"], True),  # numbers matched one to one
        (["1", "1", "2"], ["1", "2", "2"], False),
        (["1", "2"], ["1", "2", "2"], False),  # all numbers: the counts must agree
        ([], [], True),
        ([], ["x"], False),
        ("[1][0]", ["1"], False),
    ],
)
def test_answers_compare_as_agentbench_compares_them(answer, label, same):
    """result_processor.py lines 9-78 (``compare_results``): one value each -> numbers within
    1e-2 else equal text; several -> all numbers matched one to one within 1e-2, else equal
    as sets; a failure while comparing -> not equal."""
    assert same_answers(answer, label) is same


def test_the_table_hash_is_agentbenchs():
    """result_processor.py lines 101-112: ``md5(group_concat(rowhash order by rowhash))`` over
    ``substring(md5(concat_ws(',', cols...)), 1, 5)``; CONCAT_WS skips NULLs; MySQL's
    ``group_concat_max_len`` (1024) cuts the joined text; an empty table hashes to NULL,
    printed "None" (lines 93-95 keep the first value of the printed result)."""

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    rows = [("b", "2"), ("a", None)]
    row_hashes = sorted([md5("b,2")[:5], md5("a")[:5]])
    assert table_hash(rows) == md5(",".join(row_hashes))
    assert table_hash(list(reversed(rows))) == table_hash(rows)  # order-free
    many = [(str(i),) for i in range(300)]  # 300 * 6 - 1 characters joined: cut at 1024
    joined = ",".join(sorted(md5(str(i))[:5] for i in range(300)))
    assert table_hash(many) == md5(joined[:1024]) != md5(joined)
    assert table_hash([]) == "None"


@pytest.mark.parametrize(
    ("mysql", "sqlite"),
    [
        (
            "INSERT INTO 1952_British_Grand_Prix_0 (Pos, No) VALUES (22, '2nd')",
            "INSERT INTO \"1952_British_Grand_Prix_0\" (Pos, No) VALUES (22, '2nd')",
        ),
        ("SELECT t.2nd, `3rd` FROM t", 'SELECT t."2nd", `3rd` FROM t'),
        (
            r"SELECT 'Don\'t', 'a\nb', 'it''s', '50\%', '\\'",
            "SELECT 'Don''t', 'a\nb', 'it''s', '50\\%', '\\'",
        ),
        (
            "SELECT COUNT(*) FROM p WHERE moons > 20 AND d <= 1.5 ORDER BY 2 LIMIT 3",
            "SELECT COUNT(*) FROM p WHERE moons > CAST(20 AS NUMERIC) AND d <= CAST(1.5 AS REAL)"
            " ORDER BY 2 LIMIT 3",
        ),
        ("SELECT 1e-5, 0x1F, 1.5e3 # note", "SELECT 1e-5, 0x1F, 1.5e3 -- note"),
        ('SELECT "a # b" -- it\'s\n', 'SELECT "a # b" -- it\'s\n'),
        ("SELECT 'open", "SELECT 'open"),
    ],
)
def test_mysql_statements_are_rewritten_for_sqlite(mysql, sqlite):
    assert to_sqlite(mysql) == sqlite


def test_sqlite_reads_mysql_as_agentbench_s_server_does():
    """MySQL accepts a name that starts with a digit, reads backslash escapes, compares a text
    column with a number as numbers and text without regard to case or accents
    (utf8mb4_0900_ai_ci, MySQL 8 as AgentBench's environment.py line 20 runs it)."""
    db = SQLiteDatabase(
        "1st_table", [("n", "INT"), ("name", "TEXT")], [(146, "Montréal"), (9, "b")]
    )
    assert db.execute("SELECT COUNT(*) FROM 1st_table WHERE n > 20") == [(1,)]
    assert db.execute("SELECT n FROM 1st_table WHERE name = 'MONTREAL'") == [("146",)]
    db.execute(r"UPDATE 1st_table SET name = 'it\'s\nhere' WHERE n = 9")
    assert db.text_rows("1st_table", ["name", "n"]) == [("Montréal", "146"), ("it's\nhere", "9")]
    db.close()
    assert mysql_collation("Éclair", "eclair") == 0 and mysql_collation("a", "B") == -1
