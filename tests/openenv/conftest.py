"""The example OpenEnv environment of examples/openenv importable, and a real OpenEnv
server of it started for a test."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "openenv"
APP = "guess_env.server.app:app"


@pytest.fixture(autouse=True)
def _example_envs(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.fixture
def guess_server(_example_envs):
    """guess_env's server (uvicorn on a free loopback port, `server.Server`), stopped after
    the test: tests then give the task its ``url``, as for a server started elsewhere."""
    from agentrl.environments.tasks.openenv.server import Server

    server = Server(url=None, app=APP, start_timeout=60.0, task="test")
    yield server
    server.close()
