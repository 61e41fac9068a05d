"""Generated levels of the ``db`` task: small tables and one-statement questions.

- Level 0: a table of 2-4 rows and 3 columns; the question names the table and
  one column and asks for all its values: one ``SELECT column FROM table``, then
  commit the values it shows.
- Level 1: a table of 6-9 rows and 4 columns whose ``name`` column is unique;
  the question asks for one column of the row with a given name: one ``SELECT
  ... WHERE name = ...``, then commit the single value.

Each is an ordinary `DBItem` (kind ``select`` or ``filter``, label the expected
answers), judged like any dbbench query. Its content key is the question and
the table's rows, so two instances with the same key are the same instance.
"""

from __future__ import annotations

import random

from agentrl.environments.tasks.db.items import DBItem, content_key

__all__ = ["GENERATED_LEVELS", "LEVEL_TURNS", "make_level"]

GENERATED_LEVELS = (0, 1)
LEVEL_TURNS = {0: 4, 1: 4}
"""Turn limit of each generated level (the full level uses ``max_turns``)."""

_TABLES = (
    "shops", "orders", "pets", "books", "players", "cities", "cars", "movies",
    "songs", "students", "teams", "planets", "rivers", "gardens", "hotels", "lakes",
)  # fmt: skip
_NAMES = (
    "alice", "bruno", "chen", "dara", "emil", "fatima", "goran", "hana", "ivan", "julia",
    "kofi", "lena", "marco", "nina", "omar", "priya", "quinn", "rosa", "sven", "tara",
)  # fmt: skip
_WORDS = {
    "city": ("paris", "lima", "oslo", "cairo", "quito", "delhi", "perth", "tokyo", "rome"),
    "colour": ("red", "blue", "green", "black", "white", "amber", "violet", "grey"),
    "country": ("peru", "chad", "fiji", "iran", "mali", "oman", "laos", "cuba", "togo"),
    "kind": ("small", "large", "old", "new", "rare", "cheap", "fast", "slow"),
}
_NUMBERS = {
    "age": (5, 95),
    "price": (1, 999),
    "score": (0, 100),
    "stock": (0, 500),
    "year": (1950, 2024),
}


def _value(column: str, rng: random.Random) -> str | int:
    if column in _WORDS:
        return rng.choice(_WORDS[column])
    low, high = _NUMBERS[column]
    return rng.randint(low, high)


def _columns(rng: random.Random, count: int) -> list[str]:
    return rng.sample(sorted(_WORDS) + sorted(_NUMBERS), count)


def _type(column: str) -> str:
    return "INT" if column in _NUMBERS else "TEXT"


def _level0(rng: random.Random) -> DBItem:
    table = rng.choice(_TABLES)
    columns = _columns(rng, 3)
    rows = tuple(tuple(_value(c, rng) for c in columns) for _ in range(rng.randint(2, 4)))
    asked = rng.randrange(3)
    return DBItem(
        description=(f'List every value of the column "{columns[asked]}" in the table "{table}".'),
        table_name=table,
        columns=tuple((c, _type(c)) for c in columns),
        rows=rows,
        kind="select",
        label=tuple(str(row[asked]) for row in rows),
        add_description=f"The table is named {table}; its columns are {', '.join(columns)}.",
        level=0,
        query=f"SELECT {columns[asked]} FROM {table}",
    )


def _level1(rng: random.Random) -> DBItem:
    table = rng.choice(_TABLES)
    columns = ["name", *_columns(rng, 3)]
    names = rng.sample(_NAMES, rng.randint(6, 9))
    rows = tuple(tuple([name] + [_value(c, rng) for c in columns[1:]]) for name in names)
    row, asked = rng.choice(rows), rng.randrange(1, 4)
    return DBItem(
        description=(
            f'In the table "{table}", what is the "{columns[asked]}" of the row whose '
            f'"name" is "{row[0]}"?'
        ),
        table_name=table,
        columns=tuple((c, _type(c)) for c in columns),
        rows=rows,
        kind="filter",
        label=(str(row[asked]),),
        add_description=f"The table is named {table}; its columns are {', '.join(columns)}.",
        level=1,
        query=f"SELECT {columns[asked]} FROM {table} WHERE name = '{row[0]}'",
    )


def make_level(level: int, rng: random.Random) -> tuple[DBItem, str]:
    """One instance of generated ``level`` drawn with ``rng``, and its content key."""
    item = _level0(rng) if level == 0 else _level1(rng)
    return item, content_key(item)
