"""Rows as the model sees them, read and written within a bound.

AgentBench shows a statement's rows as Python's text of the list of row tuples, cut at
800 characters. A statement may produce far more than that (a cross join, a 1 MB value):
`read_rows` stops reading once the rows read are longer than the cut, and `render` writes
no more of a value than can be shown, so a result costs the worker what it shows, not
what the statement made. The text is the exact prefix of ``str(rows)`` (same quotes, same
escapes), so observations are AgentBench's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["read_rows", "render"]

_BATCH = 64
"""Rows fetched at a time while reading."""


def _value_text(value: Any, budget: int) -> str:
    """``repr(value)``, or a text at least ``budget`` long that starts as it does."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > budget:
        quote, other = ("'", '"') if isinstance(value, str) else (b"'", b'"')
        # repr picks its quotes from the whole value: adding the quote characters the whole
        # value holds makes the cut one pick the same, and each character's escape does not
        # depend on its neighbours, so the cut's text starts as the whole's.
        extra = (quote if quote in value else quote[:0]) + (other if other in value else other[:0])
        return repr(value[:budget] + extra)
    return repr(value)


def _row_text(row: Sequence[Any], budget: int) -> str:
    """``repr(tuple(row))``, or a text longer than ``budget`` that starts as it does."""
    parts, length = [], -1  # "(" and a ", " before each value but the first
    for value in row:
        text = _value_text(value, budget)
        parts.append(text)
        length += len(text) + 2
        if length > budget:
            return "(" + ", ".join(parts)
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def render(rows: Iterable[Sequence[Any]], limit: int) -> str:
    """``str([tuple(r) for r in rows])``, or a text longer than ``limit`` that starts as it
    does (the caller cuts it at ``limit``)."""
    parts, length = [], -1  # "[" and a ", " before each row but the first
    for row in rows:
        text = _row_text(row, limit)
        parts.append(text)
        length += len(text) + 2
        if length > limit:
            return "[" + ", ".join(parts)
    return "[" + ", ".join(parts) + "]"


def read_rows(fetchmany: Callable[[int], Sequence[Sequence[Any]]], max_chars: int) -> list[tuple]:
    """Rows from ``fetchmany(n)`` until there are no more or their text (`render`) is
    longer than ``max_chars``; the rest are not fetched."""
    rows: list[tuple] = []
    length = -1  # as `render` counts
    while batch := fetchmany(_BATCH):
        for row in batch:
            rows.append(tuple(row))
            length += len(_row_text(row, max_chars)) + 2
            if length > max_chars:
                return rows
    return rows
