"""The ``db`` task: answer questions about a table, or change it, with SQL (AgentBench DB).

Each full-level instance is one item in AgentBench's dbbench format (`tasks.db.items`).
A session gets a fresh database holding only the item's table, nothing shared
between sessions: SQLite in memory by default, or with ``database=mysql://user:pass@host:port``
a database of its own on a MySQL/MariaDB server, dropped when the session ends
(`tasks.db.backend`; ``statement_timeout`` seconds per statement), every column ``TEXT``
as AgentBench builds its tables. The prompt is AgentBench's (``dbbench/task.py``):
its system prompt, then one user message ``Evidence about the question: ...``
(when the item has evidence), ``Additional table information about the
question: ...`` and ``Question: ...``. Tools, as AgentBench's ``dbbench.yaml``:

- ``execute_sql(query)``: runs one statement; the observation is the result rows
  as Python prints them (``[('Jupiter',)]``), cut at 800 characters then
  ``[TRUNCATED]``; ``[]`` when there are none (an empty SELECT, a change, a DDL
  statement: AgentBench's ``str(results)`` of an empty list), or the database's
  error message. An error is an observation the model can react to, not an ending.
- ``commit_final_answer(answers)``: ends the episode, judged as AgentBench judges
  it (`tasks.db.judge`): a query's answers against its label (numbers within 1e-2, sets
  of values, ``%`` and thousands separators dropped, null/none/nan as ``0``); a
  change by AgentBench's hash of the table against the item's ``answer_md5`` (or,
  without one, the hash of the table the gold SQL gives on a fresh copy). An
  ``answers`` that is neither text nor a list (a number, an object) ends the
  episode with reward 0, as it stops AgentBench's episode with an error.

Bad calls, as AgentBench's ``dbbench/task.py`` answers them (the episode goes
on): a message with no tool call gets the user message `NO_TOOL_CALL`; a call
whose arguments are not a JSON object gets the tool message `BAD_ARGUMENTS`; a
call to another tool gets `INVALID_FUNCTION`. Every call of a message runs in
order, up to a commit, which ends the episode at once. Like AgentBench, a tool
reads its first argument when its own name is missing (``{"query": ...}`` works
for ``execute_sql``); a call with no argument at all gets `BAD_ARGUMENTS`. The
only other ending: the turn limit (``max_turns`` assistant messages, 15 as in
AgentBench's ``configs/tasks/dbbench.yaml``, or the level's own limit) without
a commit -> ``task_limit_reached``, reward 0. An item whose table cannot be
built or whose gold SQL does not run raises `ItemError` when it is started (a
data problem, reported by ``agentrl-env check``).

Limits (`tasks.db.backend`; docs/tasks.md): ``statement_timeout`` (seconds a statement
may run, its rows read included, on either backend, whatever the session sets),
``max_value_bytes``, ``max_memory_bytes`` (SQLite), ``max_db_bytes`` (both); hitting one is
an error observation, but a server's database over ``max_db_bytes`` ends the episode with
reward 0 (`DatabaseFull`).

Options: ``data=PATH`` reads a dbbench JSONL file (the full AgentBench
``dev.jsonl`` works; default the built-in ``data/db_builtin.jsonl``); ``split``
(``train``, ``test`` or ``all``) and ``seed`` choose the items by a hash of
their content (`tasks.toolkit.split`); ``levels`` (default ``[2]``, the data set only) mixes
in the generated levels of `tasks.db.levels` (0: select a named column, 1: a WHERE
filter; 4 turns each): instance ``index`` plays ``levels[index % len(levels)]``
(`tasks.toolkit.levels`), and ``generated`` sets how many instances per generated level
there are when level 2 is not among them.

Metrics on the finishing step: ``env/turns``, ``env/statements``,
``env/sql_errors``, ``env/bad_calls`` (protocol replies above), ``env/mutation``,
``env/level``, ``env/success``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.environments._protocol import Start, Status, Step
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.environments.tasks.db.backend import (
    Database,
    StatementError,
    column_names,
    open_database,
    parse_database_url,
)
from agentrl.environments.tasks.db.database import DEFAULT_LIMITS, DatabaseFull
from agentrl.environments.tasks.db.items import (
    FULL_LEVEL,
    MUTATIONS,
    DBItem,
    ItemError,
    content_key,
    load_items,
    parse_item,
)
from agentrl.environments.tasks.db.judge import same_answers, same_table, table_hash
from agentrl.environments.tasks.db.levels import GENERATED_LEVELS, LEVEL_TURNS, make_level
from agentrl.environments.tasks.db.shown import render
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.levels import LevelPlan, check_levels, pick
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.messages import ChatMessage

__all__ = [
    "FULL_LEVEL",
    "MUTATIONS",
    "DBItem",
    "DBTask",
    "ItemError",
    "load_items",
    "parse_item",
    "same_answers",
]


SHOWN_CHARS = 800
"""An observation longer than this is cut and ends with ``[TRUNCATED]`` (AgentBench's)."""

NO_TOOL_CALL = "Internal error: No tool calls found despite finish reason."
"""User message answering a message without a tool call (AgentBench's text)."""
BAD_ARGUMENTS = "Error: Failed to parse tool call. Tool call format is incorrect."
"""Tool message answering a call whose arguments cannot be read (AgentBench's text)."""
INVALID_FUNCTION = "Invalid function call. Please call a tool instead."
"""Tool message answering a call to an unknown tool (AgentBench's text)."""

SYSTEM_PROMPT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose to operate or to answer with the two specific tools provided.
If you should execute a SQL query, use the `execute_sql` function, Your SQL should be in one line.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If you are done operating, and you want to commit your final answer, then use the `commit_final_answer` function.
DO NOT use this tool unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
You should always use the tools provided to submit your answer. Be careful not to write it in the content field.
Your input will be raw MySQL response, you have to deal with it by yourself."""  # noqa: E501
"""AgentBench's system prompt, word for word (``src/server/tasks/dbbench/task.py``)."""

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": "execute_sql",
            "description": "Executes a given SQL statement on the database and returns the result.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The SQL query to be executed."}
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "commit_final_answer",
            "description": "Commits the final answer after all operations are completed.",
            "parameters": {
                "type": "object",
                "properties": {
                    "answers": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The list of final answers to commit.",
                    }
                },
                "required": ["answers"],
                "additionalProperties": False,
            },
        },
    },
]
"""AgentBench's tools (``configs/tasks/dbbench.yaml``)."""


def user_prompt(item: DBItem) -> str:
    """The user message AgentBench opens with (its ``start_sample``)."""
    text = ""
    if item.evidence:
        text += f"Evidence about the question: {item.evidence}\n"
    if item.add_description:
        text += f"Additional table information about the question: {item.add_description}\n"
    return text + f"Question: {item.description}\n"


@dataclass(slots=True)
class _Session:
    item: DBItem
    db: Database
    expected: str | None
    """The hash the table must have after a change (None for queries)."""
    max_turns: int
    turns: int = 0
    statements: int = 0
    errors: int = 0
    bad_calls: int = 0
    done: bool = False


class DBTask:
    """The DB environment (registered as ``db``)."""

    def __init__(
        self,
        *,
        data: str | None = None,
        max_turns: int = 15,
        database: str | None = None,
        statement_timeout: float = 10.0,
        max_value_bytes: int = DEFAULT_LIMITS["max_value_bytes"],
        max_db_bytes: int = DEFAULT_LIMITS["max_db_bytes"],
        max_memory_bytes: int = DEFAULT_LIMITS["max_memory_bytes"],
        split: str = "train",
        seed: int = 0,
        levels: Sequence[int] = (FULL_LEVEL,),
        generated: int = 1000,
    ) -> None:
        if max_turns < 1:
            raise ValueError("db: max_turns must be >= 1")
        if statement_timeout <= 0:
            raise ValueError("db: statement_timeout must be > 0")
        if generated < 1:
            raise ValueError("db: generated must be >= 1")
        limits = {"max_value_bytes": max_value_bytes, "max_db_bytes": max_db_bytes,
                  "max_memory_bytes": max_memory_bytes}  # fmt: skip
        for name, value in limits.items():
            if not isinstance(value, int) or value < 1 << 16:
                raise ValueError(f"db: {name} must be a whole number of bytes >= 65536")
        self._split = check_split(split, "db")
        self._seed = seed
        self._levels = check_levels(levels, (*GENERATED_LEVELS, FULL_LEVEL), "db")
        self._spec = parse_database_url(database, statement_timeout=statement_timeout, **limits)
        items = load_items(data) if FULL_LEVEL in self._levels else []
        self._items = split_items(items, map(content_key, items), split, seed)
        if FULL_LEVEL in self._levels and not self._items:
            raise ValueError(f"db: the {split} split of the data holds no item")
        self._plan = LevelPlan(self._levels, FULL_LEVEL, len(self._items), generated)
        self._max_turns = max_turns

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def levels(self) -> tuple[int, ...]:
        """The ``levels`` option: instance ``index`` plays ``levels[index % len(levels)]``."""
        return tuple(self._levels)

    @property
    def num_instances(self) -> int:
        return self._plan.num_instances

    def item(self, index: int) -> DBItem:
        """The item instance ``index`` plays (a data-set item or a generated one)."""
        return pick("db", self._plan, index, self._items, self._split, self._seed, make_level)

    def describe(self, index: int) -> str:
        """One line naming instance ``index`` (shown beside its failures by the check)."""
        item = self.item(index)
        return f"[{item.kind}] {item.description[:80]!r}"

    def start(self, index: int) -> Start:
        item = self.item(index)
        expected = (item.answer_md5 or self._gold_hash(item, index)) if item.mutation else None
        db = self._open(item, index)
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=user_prompt(item)),
        ]
        limit = min(self._max_turns, LEVEL_TURNS.get(item.level, self._max_turns))
        return Start(session=_Session(item, db, expected, limit), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn("db", session)
        replies = [] if message.tool_calls else [no_tool_call(session, NO_TOOL_CALL)]
        for call in message.tool_calls:
            args = call_arguments(call)
            if call.name not in ("execute_sql", "commit_final_answer"):
                session.bad_calls += 1
                replies.append(tool_reply(call, INVALID_FUNCTION))
                continue
            value = _argument(args, "query" if call.name == "execute_sql" else "answers")
            if value is _MISSING:
                session.bad_calls += 1
                replies.append(tool_reply(call, BAD_ARGUMENTS))
            elif call.name == "execute_sql":
                try:
                    replies.append(tool_reply(call, self._execute(session, value)))
                except DatabaseFull as exc:
                    replies.append(tool_reply(call, f"error: {exc}"))
                    return self._end(session, Status.COMPLETED, "database full", replies)
            elif value and not isinstance(value, (str, list)):
                return self._end(session, Status.COMPLETED, "answers not text nor a list", replies)
            else:
                correct = self._judge(session, value)
                return self._end(session, Status.COMPLETED, "committed", replies, success=correct)
        return after_turn(session, replies, self._end)

    def _execute(self, session: _Session, sql: Any) -> str:
        if not isinstance(sql, str) or not sql.strip():
            session.errors += 1
            return "error: the SQL statement must be a non-empty string"
        session.statements += 1
        try:
            return _show(session.db.execute(sql, max_chars=SHOWN_CHARS))
        except DatabaseFull:
            session.errors += 1
            raise
        except StatementError as exc:
            session.errors += 1
            return f"error: {exc}"

    def _gold_hash(self, item: DBItem, index: int) -> str:
        """The hash of the table the gold SQL gives on a fresh copy."""
        reference = self._open(item, index)
        try:
            for sql in item.label:
                reference.execute(sql)
            return table_hash(reference.text_rows(item.table_name, column_names(item.columns)))
        except StatementError as exc:
            raise ItemError(f"item {index}: the gold SQL fails: {exc}") from exc
        finally:
            reference.close()

    def _open(self, item: DBItem, index: int) -> Database:
        try:
            return open_database(self._spec, item.table_name, item.columns, item.rows)
        except StatementError as exc:
            raise ItemError(f"item {index}: cannot build its table: {exc}") from exc

    def cancel(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            session.db.close()

    def _judge(self, session: _Session, answers: Any) -> bool:
        item = session.item
        if session.expected is not None:
            try:
                rows = session.db.text_rows(item.table_name, column_names(item.columns))
            except StatementError:
                return False  # the model dropped the table or one of its columns
            return same_table(table_hash(rows), session.expected)
        return same_answers(answers, list(item.label))

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        success: bool = False,
    ) -> Step:
        session.db.close()
        metrics = {
            "env/statements": float(session.statements),
            "env/sql_errors": float(session.errors),
            "env/mutation": float(session.item.mutation),
        }
        return end_episode(
            "db",
            session,
            status,
            why,
            replies,
            level=session.item.level,
            success=success,
            metrics=metrics,
        )


_MISSING = object()


def _argument(args: dict[str, Any] | None, name: str) -> Any:
    """The argument ``name``, else the first one (AgentBench reads ``values()[0]``);
    `_MISSING` when the arguments are unreadable or empty (a JSON null is a value)."""
    if not args:
        return _MISSING
    return args[name] if name in args else next(iter(args.values()))


def _show(rows: list[tuple]) -> str:
    """Rows as AgentBench shows them: Python's text of the list of row tuples (no more of
    it made than is shown, `tasks.db.shown`), ``[]`` for none. AgentBench's MySQL executor
    prints ``str(results)`` of a list that stays empty for an empty SELECT and for a
    statement without rows (``dbbench/interaction.py`` lines 84-105), so its ``No response
    from database.`` (``task.py`` lines 154-155, for an empty text) never shows there."""
    shown = render(rows, SHOWN_CHARS)
    return shown[:SHOWN_CHARS] + "[TRUNCATED]" if len(shown) > SHOWN_CHARS else shown
