"""How the ``db`` task judges a commit: AgentBench's dbbench rules, in their order.

AgentBench (``src/server/tasks/dbbench/result_processor.py``) cleans both the
committed answer and the label into lists of strings (`clean_answer`), then
compares them (`same_answers`):

- one value each: ``"0"`` equals ``"0"``; two numbers are equal within 1e-2;
  otherwise the strings must be equal;
- several values: all numbers on both sides -> matched one to one within 1e-2
  (a multiset); otherwise equal as sets (order and repeats do not count).

Cleaning a value (`normalize`): trim; a trailing ``%`` is dropped (and nothing
else is done to it); commas are removed unless the value looks like a list;
``none``, ``null``, ``undefined``, ``nan``, ``inf``, ``infinity`` (any case,
either sign) and the empty string read as ``"0"``. An answer given as the text
of a database result, ``"[('x',), ('y',)]"``, is read as its one-column values;
another bracketed text as a list (quotes around each value stripped).

A change (INSERT, UPDATE, DELETE) is judged by the table, not the answer:
`table_hash` is AgentBench's MySQL hash of the table's rows with every column
read as text (``md5(group_concat(substring(md5(concat_ws(',', cols)), 1, 5)
order by ...))``, group_concat cut at MySQL's default 1024 bytes), compared
with the item's ``answer_md5``.

One deliberate difference: AgentBench reads bracketed answers with Python's
``eval``; here only literals are read (`ast.literal_eval`), so an answer such
as ``"[1+1]"`` or ``"[1][0]"`` is split as text, never run.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "GROUP_CONCAT_MAX_LEN",
    "TOLERANCE",
    "clean_answer",
    "normalize",
    "same_answers",
    "same_table",
    "table_hash",
]

TOLERANCE = 1e-2
"""Two numbers within this are equal (AgentBench's ``_float_equal``)."""

GROUP_CONCAT_MAX_LEN = 1024
"""MySQL's default ``group_concat_max_len``: AgentBench's hash sees at most this many bytes."""

_SPECIAL = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}
"""Values that read as ``"0"`` (compared in lower case)."""


def normalize(value: Any) -> str:
    """One value as AgentBench compares it (``_normalize_special_values``)."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return "0" if text.lower() in _SPECIAL else text


def _unquote(value: Any) -> str:
    return str(value).strip().strip("'\"")


def _literal(text: str) -> Any:
    """``text`` read as a Python literal, or `_NOT_LITERAL`."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _result_values(text: str) -> list[str] | None:
    """The values of a database result's text ``[(a,), (b,)]`` (``_clean_mysql_result``):
    one per one-value row (other rows are skipped); None when ``text`` is not one."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    parsed = _literal(text)
    if isinstance(parsed, list) and all(isinstance(row, tuple) for row in parsed):
        return [_unquote(row[0]) for row in parsed if len(row) == 1]
    inner = text.strip("[]")
    if inner.count("(") == 1 and inner.startswith("(") and inner.endswith(",)"):
        return [_unquote(inner[1:-2])]
    return None


def _item(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    return normalize(_unquote(value))


def _split_list(inner: str) -> list[str]:
    """A bracketed list that is not a literal, split at commas outside quotes."""
    items, current, quoted = [], "", False
    for char in inner:
        if char in "\"'":
            quoted = not quoted
        elif char == "," and not quoted:
            if current:
                items.append(normalize(_unquote(current)))
                current = ""
        else:
            current += char
    if current:
        items.append(normalize(_unquote(current)))
    return items


def clean_answer(answer: Any) -> list[str]:
    """An answer or a label as the list of values AgentBench compares (``_clean_answer``)."""
    if answer is None:
        return ["0"]
    values = _result_values(answer) if isinstance(answer, str) else None
    if values is not None:
        return [normalize(v) for v in values]
    if isinstance(answer, str):
        answer = answer.strip()
        if not (answer.startswith("[") and answer.endswith("]")):
            return [normalize(_unquote(answer))]
        parsed = _literal(answer)
        if not isinstance(parsed, list):  # a bracketed literal is a list
            return _split_list(answer[1:-1])
        return [_item(v) for v in parsed]
    if isinstance(answer, (list, tuple)):
        return [_item(v) for v in answer]
    return [normalize(_unquote(answer))]


def _is_float(value: str) -> bool:
    try:
        float(value)
    except (ValueError, TypeError):
        return False
    return True


def _close(a: str, b: str) -> bool:
    return abs(float(a) - float(b)) <= TOLERANCE


def same_answers(answer: Any, label: Any) -> bool:
    """Whether a committed answer matches a query's label (``compare_results``)."""
    given, wanted = clean_answer(answer), clean_answer(label)
    if len(given) == 1 and len(wanted) == 1:
        a, b = given[0], wanted[0]
        if _is_float(a) and _is_float(b):
            return _close(a, b)
        return a == b
    if all(map(_is_float, given)) and all(map(_is_float, wanted)):
        if len(given) != len(wanted):
            return False
        free = list(wanted)
        for value in given:
            match = next((i for i, want in enumerate(free) if _close(value, want)), None)
            if match is None:
                return False
            free.pop(match)
        return True
    return set(given) == set(wanted)


def table_hash(rows: Iterable[Sequence[str | None]]) -> str:
    """AgentBench's hash of a table whose values are read as text, NULL as None
    (``_get_table_hash_async``; ``"None"`` for an empty table, as MySQL's NULL prints)."""
    row_hashes = sorted(
        hashlib.md5(",".join(v for v in row if v is not None).encode()).hexdigest()[:5]
        for row in rows
    )
    if not row_hashes:
        return "None"
    joined = ",".join(row_hashes).encode()[:GROUP_CONCAT_MAX_LEN]
    return hashlib.md5(joined).hexdigest()


def same_table(table: str, expected: str) -> bool:
    """Whether a table's hash matches the expected one (``"[('<md5>',)]"`` as in
    dbbench's ``answer_md5``, or the bare hash), compared as AgentBench compares them."""
    return clean_answer(table) == clean_answer(expected)
