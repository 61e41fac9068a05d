"""Fixtures of the security suites."""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import broker_answers


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
