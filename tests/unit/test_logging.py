"""configure_logging: one JSON-lines file per role, run/node bound to every line."""

from __future__ import annotations

import json

import pytest
import structlog

from agentrl.ops import configure_logging


@pytest.fixture
def restore_structlog():
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_role_gets_its_own_file_with_run_and_node(tmp_path, capsys, restore_structlog):
    configure_logging("info", tmp_path, run="r1", node="n1")
    log = structlog.get_logger("test")
    log.bind(role="sampler", actor="s0", pool="current").info("loaded", version=3)
    log.bind(role="rollout", actor="r0").warning("infra failure", episode="e1", task="t")
    log.bind(role="rollout").debug("too detailed")  # below the configured level: nowhere
    log.info("supervisor line")
    sampler = _lines(tmp_path / "sampler.jsonl")
    assert [(e["event"], e["version"], e["pool"]) for e in sampler] == [("loaded", 3, "current")]
    assert sampler[0]["run"] == "r1" and sampler[0]["node"] == "n1"
    assert sampler[0]["level"] == "info" and "timestamp" in sampler[0]
    (rollout,) = _lines(tmp_path / "rollout.jsonl")
    assert (rollout["episode"], rollout["task"], rollout["level"]) == ("e1", "t", "warning")
    assert [e["event"] for e in _lines(tmp_path / "supervisor.jsonl")] == ["supervisor line"]
    err = capsys.readouterr().err
    assert "loaded" in err and "supervisor line" in err and "infra failure" in err
    assert "too detailed" not in err
