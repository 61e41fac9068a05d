"""Integration fixtures: the real RabbitMQ broker, and the MySQL/MariaDB ``server``.

Tests that need it skip with a clear reason when nothing answers at
127.0.0.1:5672, unless AGENTRL_REQUIRE_BROKER=1, in which case they fail.
"""

from __future__ import annotations

import os
import socket

import pytest

BROKER_HOST = "127.0.0.1"
BROKER_PORT = 5672
AMQP_URL = f"amqp://guest:guest@{BROKER_HOST}:{BROKER_PORT}/"


def broker_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The broker URL; skips (or fails with AGENTRL_REQUIRE_BROKER=1) when none answers."""
    if broker_answers(BROKER_HOST, BROKER_PORT):
        return AMQP_URL
    reason = f"no RabbitMQ broker answers at {BROKER_HOST}:{BROKER_PORT}"
    if os.environ.get("AGENTRL_REQUIRE_BROKER") == "1":
        pytest.fail(f"{reason} and AGENTRL_REQUIRE_BROKER=1")
    pytest.skip(f"{reason} (set AGENTRL_REQUIRE_BROKER=1 to make this a failure)")


@pytest.fixture(scope="module")
def server():
    """The MySQL/MariaDB server at 127.0.0.1:3306 as a root connection: skipped with a reason
    where none answers, a failure with AGENTRL_REQUIRE_MYSQL=1 (CI)."""
    import pymysql

    if not broker_answers("127.0.0.1", 3306):
        reason = "no MySQL/MariaDB server answers at 127.0.0.1:3306"
        if os.environ.get("AGENTRL_REQUIRE_MYSQL") == "1":
            pytest.fail(f"{reason} and AGENTRL_REQUIRE_MYSQL=1")
        pytest.skip(f"{reason} (set AGENTRL_REQUIRE_MYSQL=1 to make this a failure)")
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    yield conn
    conn.close()
