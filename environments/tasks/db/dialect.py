"""MySQL statements made readable by SQLite (the ``db`` task's default database).

AgentBench's data and the models trained on it write MySQL. `to_sqlite` rewrites
the parts SQLite would read differently or refuse, outside quoted names and
comments, and leaves everything else as written:

- string literals ``'...'`` with MySQL's backslash escapes (``\\n``, ``\\'``,
  ``\\\\``, ...) become SQLite literals holding the same characters (SQLite reads
  ``\\n`` as two characters and ends the string at ``\\'``);
- unquoted names that start with a digit (``1952_British_Grand_Prix_0``, ``2nd``),
  which MySQL accepts and SQLite refuses, are double-quoted; numbers (``12``,
  ``1e5``, ``1e-5``, ``0x1F``) stay numbers;
- a number right after a comparison (``moons > 20``, ``x = 1.5``) becomes
  ``CAST(20 AS NUMERIC)`` (``REAL`` with a decimal point): SQLite then compares the
  ``TEXT`` column as a number, as MySQL compares a text column with a number
  (SQLite alone compares ``'146' > 20`` as text, false);
- ``#`` comments become ``--`` comments.

What SQLite cannot follow remains (docs/tasks.md lists it): a number on the left of
a comparison or in ``IN``/``BETWEEN`` is compared with a text column as text;
MySQL-only functions (``CONCAT``, ``MD5``, ...) are unknown to SQLite.
"""

from __future__ import annotations

import re

__all__ = ["to_sqlite"]

_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}
"""MySQL's backslash escapes that stand for another character (the rest stand for
themselves; ``\\%`` and ``\\_`` keep their backslash, for LIKE)."""

_WORD = re.compile(r"[\w$]+")
_NUMBER = re.compile(r"\d+|\d+[eE]\d+|0[xX][0-9a-fA-F]+|0[bB][01]+")
_EXPONENT = re.compile(r"\d+[eE][+-]\d+")
_DECIMAL = re.compile(r"\d*\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)")
_COMPARED = re.compile(r"(?:<=|>=|<>|!=|<=>|=|<|>)\s*$")
"""Output ending with a comparison: a number next is compared with what precedes it."""


def _mysql_string(sql: str, start: int) -> tuple[str, int]:
    """The MySQL literal opening at ``sql[start]`` (a ``'``) as a SQLite literal, and the
    index after it; an unterminated literal is returned as written."""
    chars, i = [], start + 1
    while i < len(sql):
        char = sql[i]
        if char == "\\" and i + 1 < len(sql):
            escaped = sql[i + 1]
            chars.append(_ESCAPES.get(escaped, "\\" + escaped if escaped in "%_" else escaped))
            i += 2
        elif char == "'" and sql[i + 1 : i + 2] == "'":
            chars.append("'")
            i += 2
        elif char == "'":
            return "'" + "".join(chars).replace("'", "''") + "'", i + 1
        else:
            chars.append(char)
            i += 1
    return sql[start:], len(sql)


def _quoted(sql: str, start: int, close: str) -> int:
    """The index after the quoted name or comment opening at ``start``."""
    end = sql.find(close, start + 1)
    return len(sql) if end < 0 else end + len(close)


def _number_or_name(sql: str, start: int, out: list[str]) -> int:
    """Append the number or digit-led name at ``start`` to ``out``; the index after it."""
    compared = _COMPARED.search("".join(out[-4:])) is not None
    decimal = _DECIMAL.match(sql, start)
    if (
        decimal
        and not _WORD.match(sql, decimal.end())
        and sql[decimal.end() : decimal.end() + 1] != "."
    ):
        text = sql[start : decimal.end()]
        out.append(f"CAST({text} AS REAL)" if compared else text)
        return decimal.end()
    word = _WORD.match(sql, start)
    if word is None:  # a lone "." before digits that are not a number
        out.append(sql[start])
        return start + 1
    text = sql[start : word.end()]
    if not _NUMBER.fullmatch(text):
        out.append('"' + text + '"')
    elif compared and text.isdigit():
        out.append(f"CAST({text} AS NUMERIC)")
    else:
        out.append(text)
    return word.end()


def to_sqlite(sql: str) -> str:
    """``sql`` (MySQL) with the rewrites above."""
    out, i = [], 0
    while i < len(sql):
        char = sql[i]
        if char == "'":
            literal, i = _mysql_string(sql, i)
            out.append(literal)
            continue
        if char in '"`':
            end = _quoted(sql, i, char)
        elif sql.startswith("--", i) or char == "#":
            end = _quoted(sql, i, "\n")
            if char == "#":
                out.append("--")
                i += 1
        elif sql.startswith("/*", i):
            end = _quoted(sql, i + 1, "*/")
        elif char.isdigit() or (char == "." and sql[i + 1 : i + 2].isdigit()):
            i = _number_or_name(sql, i, out)
            continue
        elif char == "_" or char == "$" or char.isalpha():
            word = _WORD.match(sql, i)
            end = word.end() if word else i + 1
        else:
            end = i + 1
        out.append(sql[i:end])
        i = end
    return "".join(out)
