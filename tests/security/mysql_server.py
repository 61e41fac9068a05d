"""What the MariaDB attack suites share beside the ``server`` fixture (conftest.py): the
server's URL, a model turn that runs one statement, and a query's rows."""

from __future__ import annotations

import json

from agentrl.messages import ChatMessage, ToolCall

MYSQL = "mysql://root@127.0.0.1:3306"


def say(sql: str) -> ChatMessage:
    """The model's turn that runs ``sql``."""
    call = ToolCall(id="c", name="execute_sql", arguments=json.dumps({"query": sql}))
    return ChatMessage("assistant", "", [call])


def rows(conn, sql: str, *args) -> list[tuple]:
    """The rows ``sql`` returns on ``conn``."""
    with conn.cursor() as cursor:
        cursor.execute(sql, args or None)
        return list(cursor.fetchall())
