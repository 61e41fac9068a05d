"""Environment workers in real containers (podman or Docker through the docker SDK).

Needs RabbitMQ at 127.0.0.1:5672, a container engine at $DOCKER_HOST and the
agentrl/env-worker image (ops/containers/setup-podman.sh, build-images.sh). Without an
engine or the image the tests skip, unless AGENTRL_REQUIRE_CONTAINERS=1 (CI), which
makes that a failure.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.environments._containers import (
    ENV_WORKER_IMAGE,
    ContainerError,
    EnvWorkerContainers,
    docker_client,
    start_env_worker_container,
    stop_containers,
    wait_ready,
)
from agentrl.environments._protocol import InfraError
from agentrl.environments._worker import RemoteEnvironment
from agentrl.messages import ChatMessage, ToolCall, Topology, connect

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    """The docker SDK client; skips (or fails with AGENTRL_REQUIRE_CONTAINERS=1)."""
    import docker

    try:
        client = docker_client()
        client.images.get(ENV_WORKER_IMAGE)
    except (ContainerError, docker.errors.ImageNotFound) as exc:
        reason = f"containers unavailable: {exc}"
        if os.environ.get("AGENTRL_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"{reason} (AGENTRL_REQUIRE_CONTAINERS=1)")
        pytest.skip(f"{reason} (set AGENTRL_REQUIRE_CONTAINERS=1 to make this a failure)")
    yield client
    client.close()


def _say(name: str, **args) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c1", name, json.dumps(args))])


COUNT = _say("execute_sql", query="SELECT COUNT(*) FROM planets")
ANSWER = _say("commit_final_answer", answers=["3"])  # the built-in db instance 0's answer


def _labelled(engine, run: str) -> list:
    return engine.containers.list(all=True, filters={"label": f"agentrl.run={run}"})


@pytest.fixture
def db_workers(engine, amqp_url):
    """Two db worker containers of a fresh run, and a client transport.

    Capacity 4: after a kill, the survivor takes the dead worker's unacked starts
    (orphan sessions, up to 2 here) and still has a slot for the retried episode."""
    run = f"ctr-{uuid.uuid4().hex[:6]}"
    client = connect(amqp_url, name=f"{run}-client")
    client.declare_queue(f"{run}.env.db")
    containers = [
        start_env_worker_container(
            "db", amqp_url, run, 4, {"max_turns": 4}, worker_id=wid, client=engine
        )
        for wid in ("a", "b")
    ]
    try:
        for container in containers:
            wait_ready(container, timeout=60)
        yield run, client, {c.labels["agentrl.worker"]: c for c in containers}
    finally:
        assert stop_containers(run, client=engine, timeout=5) == 2
        assert _labelled(engine, run) == []
        client.delete_queue(f"{run}.env.db")
        client.close()


def _episode(env: RemoteEnvironment) -> tuple[str, float]:
    start = env.start(0)
    assert env.interact(start.session, COUNT).messages[0].content == "[(8,)]"
    step = env.interact(start.session, ANSWER)
    assert step.finish
    return start.session[1], step.reward


def test_two_worker_containers_serve_a_task(db_workers):
    run, client, _ = db_workers
    env = RemoteEnvironment(client, run, "db", timeout=30)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: _episode(env), range(4)))
    assert [reward for _, reward in results] == [1.0] * 4
    assert {worker for worker, _ in results} == {"a", "b"}  # both served sessions


def test_a_killed_container_is_an_infra_error_and_the_other_worker_takes_over(db_workers):
    run, client, containers = db_workers
    env = RemoteEnvironment(client, run, "db", timeout=30)
    doomed = env.start(0)
    other = env.start(0)
    if other.session[1] == doomed.session[1]:  # both on one worker: open one more
        other = env.start(0)
    assert other.session[1] != doomed.session[1]
    assert env.interact(doomed.session, COUNT).messages[0].content == "[(8,)]"
    containers[doomed.session[1]].kill()  # mid-episode
    env_fast = RemoteEnvironment(client, run, "db", timeout=10)
    began = time.monotonic()
    with pytest.raises(InfraError):
        env_fast.interact(doomed.session, ANSWER)
    assert time.monotonic() - began < 15
    # the retried episode runs on the survivor; the survivor's own episode is intact
    worker, reward = _episode(env)
    assert (worker, reward) == (other.session[1], 1.0)
    assert env.interact(other.session, ANSWER).reward == 1.0


def test_a_crashed_runs_leftover_container_is_removed_at_start(engine, amqp_url):
    run = f"ctr-{uuid.uuid4().hex[:6]}"
    labels = {"agentrl.role": "env", "agentrl.node": "test-node"}
    start_env_worker_container("db", amqp_url, run, 1, labels=labels, client=engine)
    assert len(_labelled(engine, run)) == 1
    workers = EnvWorkerContainers(run, amqp_url, node="test-node")
    try:
        assert _labelled(engine, run) == []
    finally:
        workers.close()
        transport = connect(amqp_url, name=f"{run}-cleanup")
        transport.delete_queue(f"{run}.env.db")
        transport.close()


def test_a_worker_that_cannot_start_is_reported_with_its_output(engine, amqp_url):
    run = f"ctr-{uuid.uuid4().hex[:6]}"
    workers = EnvWorkerContainers(run, amqp_url, node="test-node")
    try:
        with pytest.raises(ContainerError, match="no_such_option"):
            workers.start("db", workers=1, capacity=1, options={"no_such_option": 1})
    finally:
        workers.close()
    assert _labelled(engine, run) == []


@pytest.mark.slow
def test_a_supervisor_run_with_container_workers_leaves_nothing_behind(engine, amqp_url, tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    run = f"ctr-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, amqp_url, run, steps=1)
    raw["tasks"] = {
        "db": {
            "remote": True,
            "container": True,
            "workers": 2,
            "capacity": 2,
            "options": {"max_turns": 2},
        }
    }
    cfg = parse_config(raw)
    try:
        assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
        lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
        (metrics,) = [json.loads(line) for line in lines]
        assert metrics["env/db/episodes"] == 4
        assert "rollout/status/task_error" not in metrics  # every episode reached a worker
        assert _labelled(engine, run) == []
        logs = sorted(p.name for p in (cfg.run_dir / "logs").glob("agentrl-*.log"))
        assert len(logs) == 2, logs  # each container's output, kept after removal
    finally:
        stop_containers(run, client=engine)
        names = Topology(run)
        transport = connect(amqp_url, name=f"{run}-cleanup")
        for queue in (names.episodes, names.trajectories, names.dead, names.control_rpc,
                      names.generate_queue("current"), names.generate_queue("stale"),
                      f"{run}.env.db"):  # fmt: skip
            transport.delete_queue(queue)
        for exchange in (names.generate, names.checkpoints, names.control, names.dlx):
            transport.delete_exchange(exchange)
        transport.close()
