"""Three nodes in three network namespaces train one run against one RabbitMQ.

Node a runs the controller and the learner, nodes b and c a sampler and a
rollout each; every node is `agentrl-supervisor start` in its own namespace
(so its roles are supervised child processes), reaching the broker only
through the bridge. Mid-run node c's rollout process is SIGKILLed: its node
restarts it, the episodes it held go back to the queue, and the run reaches
max_steps with full batches, nothing dead-lettered and no group dropped; then
the learner's shutdown broadcast drains every node and all exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.messages import connect
from agentrl.ops.report.status import controller_status
from agentrl.ops.run.queues import stop_run
from tests.integration.netns import namespaces

pytestmark = pytest.mark.integration

STEPS = 100_000
"""More updates than the test lasts: it stops the run itself once it has seen what it checks,
so the run's length does not depend on how fast the learner is."""
EPISODES_PER_BATCH = 4


def _config(tmp_path: Path, run: str) -> Path:
    cfg = {
        "run": run,
        "broker": "memory://unused",  # every node gets --broker
        "model": "tiny",
        "output_dir": str(tmp_path / "runs"),  # shared storage: same path on every node
        "max_steps": STEPS,
        "tasks": {"calculator": {"options": {"levels": [1]}}},
        "rollout": {
            "group_size": 2,
            "groups_per_batch": 2,
            "concurrency": 4,
            "max_turns": 2,
            "max_tokens": 1024,
            "max_new_tokens": 8,
        },
        "staleness": {"max": 1, "hard": 8},
        "pools": {"current": {"weight": 1.0}},
        "learner": {"lr": 1e-4, "micro_batch_tokens": 2048, "keep_checkpoints": 2},
        "torch_threads": 1,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _wait(predicate, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise AssertionError(f"waiting for {what}: a node exited early: {dead}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _node_state(run_dir: Path, node: str) -> dict:
    path = run_dir / "nodes" / f"{node}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_three_nodes_train_and_survive_a_killed_rollout(amqp_url, tmp_path):
    run = f"mn-{uuid.uuid4().hex[:6]}"
    config = _config(tmp_path, run)
    run_dir = tmp_path / "runs" / run
    roles = {"a": "controller,learner", "b": "sampler,rollout", "c": "sampler,rollout"}
    with namespaces(3, log_dir=tmp_path / "procs") as cluster:
        procs = {}
        for ns, (node, node_roles) in zip(cluster.namespaces, roles.items(), strict=True):
            argv = [
                sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor", "start",
                "--config", str(config), "--broker", cluster.broker_url,
                "--roles", node_roles, "--node", node, "--progress-every", "5",
            ]  # fmt: skip
            procs[node] = cluster.popen(ns, argv)
        live = list(procs.values())

        def updates() -> int:
            path = run_dir / "metrics.jsonl"
            return len(path.read_text().splitlines()) if path.exists() else 0

        _wait(lambda: updates() >= 2, 240, "two learner updates", live)
        # the controller's view, as `agentrl-supervisor status` shows it (heartbeats come
        # every 10 s; an actor that started before the controller shows up at its next one)
        expected = [
            f"actors/{node}/{role}/alive"
            for node, node_roles in roles.items()
            for role in node_roles.split(",")
            if role != "controller"  # the controller answers; it does not beat
        ]
        status: dict = {}

        def all_known() -> bool:
            status.clear()
            status.update(controller_status(amqp_url, run, timeout=10) or {})
            return all(status.get(key, 0) >= 1 for key in expected)

        _wait(all_known, 60, f"the controller to know {expected}", live)
        assert status["pool/current/samplers"] == 2
        assert status["controller/version"] >= 2
        victim = _node_state(run_dir, "c")["roles"]["rollout"]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            role = _node_state(run_dir, "c")["roles"]["rollout"]
            return role["restarts"] == 1 and role["alive"] and role["pid"] != victim

        _wait(restarted, 60, "node c to restart its rollout role", live)
        restarted_at = updates()
        _wait(lambda: updates() > restarted_at, 60, "an update after the restart", live)
        assert stop_run(amqp_url, run, "test done")
        for node, proc in procs.items():
            assert proc.wait(timeout=300) == 0, (node, cluster.log_paths(proc))

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [int(m["version"]) for m in metrics] == list(range(1, len(metrics) + 1))
    assert 2 <= len(metrics) < STEPS
    assert all(m["rollout/episodes"] == EPISODES_PER_BATCH for m in metrics)
    assert metrics[-1]["learner/dropped_groups_total"] == 0
    state = _node_state(run_dir, "c")["roles"]["rollout"]
    assert state["exit_codes"][0] == -signal.SIGKILL and len(state["exit_codes"]) == 2
    for node in roles:
        for role in _node_state(run_dir, node)["roles"].values():
            # 0, or the drain's SIGTERM for a role that was still starting up
            assert role["exit_codes"][-1] in (0, -signal.SIGTERM) and not role["alive"]
    node_log = (run_dir / "logs" / "c" / "node.jsonl").read_text()
    assert "role died; restarting" in node_log
    # every node's roles logged to their own files, with run and node on every line
    for node, node_roles in roles.items():
        for role in node_roles.split(","):
            first = json.loads(
                (run_dir / "logs" / node / f"{role}.jsonl").read_text().split("\n")[0]
            )
            assert (first["run"], first["node"], first["role"]) == (run, node, role)
    client = connect(amqp_url, name=f"{run}-check")
    try:
        assert client.queue_depth(f"{run}.dead") == 0
    finally:
        client.close()
