"""Container helpers against a fake docker client; the config keys that enable them.

The real engine is exercised in tests/integration/test_containers.py.
"""

from __future__ import annotations

import json

import docker
import pytest

from agentrl.environments import _containers
from agentrl.environments._containers import (
    ContainerError,
    EnvWorkerContainers,
    docker_client,
    start_env_worker_container,
    stop_containers,
    wait_ready,
)
from agentrl.ops import ConfigError, parse_config


class FakeContainer:
    def __init__(self, engine: FakeEngine, name: str, command: list[str], labels: dict) -> None:
        self.engine, self.name, self.command, self.labels = engine, name, command, labels
        self.status = "running"
        self.output = b""
        self.calls: list[str] = []

    def reload(self) -> None:
        pass

    def logs(self) -> bytes:
        return self.output

    def stop(self, timeout: int) -> None:
        self.calls.append(f"stop {timeout}")
        self.status = "exited"

    def remove(self, force: bool = False) -> None:
        self.calls.append("remove")
        self.engine.removed.append(self)
        self.engine.all.remove(self)


class FakeContainers:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def run(self, image, command, *, name, detach, network_mode, labels, environment):
        assert detach and network_mode == "host"
        if image not in self.engine.images:
            raise docker.errors.ImageNotFound(f"no such image: {image}")
        container = FakeContainer(self.engine, name, command, labels)
        container.environment = environment
        container.output = self.engine.output
        self.engine.all.append(container)
        return container

    def list(self, *, all: bool, filters: dict) -> list[FakeContainer]:
        wanted = dict(item.split("=", 1) for item in filters["label"])
        return [c for c in self.engine.all if wanted.items() <= c.labels.items()]


class FakeEngine:
    """The part of docker.DockerClient the helpers use."""

    def __init__(self, images=("agentrl/env-worker",), output=b"env worker started\n") -> None:
        self.images, self.output = set(images), output
        self.all: list[FakeContainer] = []
        self.removed: list[FakeContainer] = []
        self.containers = FakeContainers(self)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_worker_container_gets_the_worker_command_host_network_and_labels():
    engine = FakeEngine()
    c = start_env_worker_container(
        "db", "amqp://u:p@127.0.0.1:5672/", "r1", 3, {"max_turns": 2, "data": "/d/x.jsonl"},
        labels={"agentrl.node": "n1"}, worker_id="w0", client=engine,
    )  # fmt: skip
    assert c.name == "agentrl-r1-w0"
    assert c.command == [
        "--task", "db", "--run", "r1", "--capacity", "3", "--worker-id", "w0",
        "--option", "max_turns=2", "--option", 'data="/d/x.jsonl"',
    ]  # fmt: skip
    assert c.labels == {
        "agentrl.run": "r1",
        "agentrl.task": "db",
        "agentrl.role": "env",
        "agentrl.worker": "w0",
        "agentrl.node": "n1",
    }
    assert json.loads(c.command[-1].split("=", 1)[1]) == "/d/x.jsonl"
    # the broker URL and its password stay off the command line (`ps` shows that)
    assert c.environment["AGENTRL_BROKER_URL"] == "amqp://u:p@127.0.0.1:5672/"


def test_a_missing_image_names_the_build_script():
    with pytest.raises(ContainerError, match=r"build-images\.sh"):
        start_env_worker_container("db", "amqp://h/", "r1", 1, image="nope", client=FakeEngine())


def test_no_engine_at_the_socket_names_the_socket_and_the_setup_script(tmp_path):
    url = f"unix://{tmp_path}/missing.sock"
    with pytest.raises(ContainerError) as info:
        docker_client(url, timeout=2)
    assert url in str(info.value) and "setup-podman.sh" in str(info.value)


def test_the_engine_url_comes_from_docker_host(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert _containers.engine_url() == "tcp://10.0.0.1:2375"


def test_stop_containers_removes_only_the_runs_matching_containers_and_keeps_logs(tmp_path):
    engine = FakeEngine(output=b"env worker started\nbye\n")
    mine = start_env_worker_container("db", "amqp://h/", "r1", 1, worker_id="a", client=engine)
    start_env_worker_container("db", "amqp://h/", "r2", 1, worker_id="a", client=engine)
    other_node = start_env_worker_container(
        "db", "amqp://h/", "r1", 1, worker_id="b", labels={"agentrl.node": "n2"}, client=engine
    )
    assert (
        stop_containers("r1", labels={"agentrl.worker": "a"}, client=engine, log_dir=tmp_path) == 1
    )
    assert engine.removed == [mine] and mine.calls == ["stop 10", "remove"]
    assert (tmp_path / "agentrl-r1-a.log").read_bytes() == b"env worker started\nbye\n"
    assert stop_containers("r1", client=engine) == 1
    assert engine.removed == [mine, other_node]
    assert [c.labels["agentrl.run"] for c in engine.all] == ["r2"]


def test_a_worker_that_exits_before_it_serves_is_reported_with_its_output():
    engine = FakeEngine(output=b"agentrl-env: task 'db': bad options ['x']\n")
    c = start_env_worker_container("db", "amqp://h/", "r1", 1, client=engine)
    c.status = "exited"
    with pytest.raises(ContainerError, match=r"exited .*\n.*bad options \['x'\]"):
        wait_ready(c, timeout=5)


def test_a_worker_that_never_serves_times_out():
    engine = FakeEngine(output=b"connecting\n")
    c = start_env_worker_container("db", "amqp://h/", "r1", 1, client=engine)
    with pytest.raises(ContainerError, match="not ready after 0 s"):
        wait_ready(c, timeout=0.3)


def test_the_env_role_clears_leftovers_starts_workers_and_removes_them(monkeypatch, tmp_path):
    engine = FakeEngine()
    monkeypatch.setattr(_containers, "docker_client", lambda: engine)
    labels = {"agentrl.role": "env", "agentrl.node": "n1"}
    leftover = start_env_worker_container(
        "db", "amqp://h/", "r1", 1, worker_id="old", labels=labels, client=engine
    )
    workers = EnvWorkerContainers("r1", "amqp://h/", node="n1", log_dir=tmp_path)
    assert engine.removed == [leftover]
    workers.start("db", workers=2, capacity=4, options={})
    assert sorted(c.name for c in engine.all) == ["agentrl-r1-n1-db-0", "agentrl-r1-n1-db-1"]
    workers.close()
    assert engine.all == [] and engine.closed
    assert len(list(tmp_path.glob("agentrl-r1-n1-db-*.log"))) == 2


def _cfg(**task) -> dict:
    return {"run": "r", "broker": "amqp://h/", "tasks": {"db": task}}


def test_container_tasks_parse():
    cfg = parse_config(_cfg(remote=True, container=True, image="me/worker:1"))
    assert cfg.tasks["db"].container and cfg.tasks["db"].image == "me/worker:1"
    assert parse_config(_cfg()).tasks["db"].container is False


def test_container_config_problems_are_all_listed():
    raw = _cfg(container=True)
    raw["broker"] = "memory://x"
    raw["tasks"]["calculator"] = {"image": "me/worker:1"}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.problems == [
        "tasks.db.container: needs remote: true (workers over the broker)",
        "tasks.db.container: a container cannot reach a memory:// broker",
        "tasks.calculator.image: only used with container: true",
    ]
