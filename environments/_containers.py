"""Environment workers in containers, through the docker SDK (Docker or podman).

- :func:`docker_client` connects to the engine named by ``$DOCKER_HOST`` (else
  agentrl's podman socket when it exists, else Docker's default) and fails with
  :class:`ContainerError` naming the socket and the setup script when nothing answers.
- :func:`start_env_worker_container` runs ``agentrl-env-worker`` for one task in the
  ``agentrl/env-worker`` image (built by ``ops/containers/build-images.sh``). It uses
  the host's network, so a broker at 127.0.0.1 is reached as on the host, and labels
  the container ``agentrl.run``, ``agentrl.task``, ``agentrl.role=env``.
- :func:`stop_containers` stops and removes a run's containers (all roles, or those
  matching extra labels), keeping their logs in a folder when asked.
- :class:`EnvWorkerContainers` is what the supervisor's ``env`` role holds: it removes
  a crashed run's leftovers at start, waits for each worker to come up, and removes
  every container it started at close.

A worker whose container dies mid-episode is seen by its clients exactly as a dead
worker process: `RemoteEnvironment` raises `InfraError`, the episode is retried.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from agentrl.environments._protocol import EnvError

__all__ = [
    "ENV_WORKER_IMAGE",
    "ContainerError",
    "EnvWorkerContainers",
    "docker_client",
    "start_env_worker_container",
    "stop_containers",
    "wait_ready",
]

log = structlog.get_logger(__name__)

ENV_WORKER_IMAGE = "agentrl/env-worker"
"""The image of ``environments/containers/env-worker.Dockerfile``."""
PODMAN_SOCKET = "unix:///run/agentrl-podman.sock"
"""Where ``ops/containers/setup-podman.sh`` serves podman's Docker-compatible API."""
SETUP_HINT = 'start one with: eval "$(ops/containers/setup-podman.sh)" (see docs/containers.md)'
READY_LINE = "env worker started"
"""What ``agentrl-env-worker`` logs once it consumes from its task queue."""


class ContainerError(EnvError):
    """Raised when the container engine does not answer or refuses a request, or a
    worker container exits before it is ready."""


def engine_url() -> str:
    """``$DOCKER_HOST``, else agentrl's podman socket if present, else Docker's default."""
    url = os.environ.get("DOCKER_HOST")
    if url:
        return url
    if Path(PODMAN_SOCKET.removeprefix("unix://")).exists():
        return PODMAN_SOCKET
    return "unix:///var/run/docker.sock"


def docker_client(url: str | None = None, *, timeout: float = 60.0):
    """A connected ``docker.DockerClient``; ContainerError when no engine answers."""
    import docker  # the SDK is only needed where containers are started

    url = url or engine_url()
    try:
        client = docker.DockerClient(base_url=url, timeout=int(timeout))
        client.ping()
    except docker.errors.DockerException as exc:
        raise ContainerError(
            f"no container engine answers at {url} ($DOCKER_HOST): {exc}; {SETUP_HINT}"
        ) from exc
    return client


def _labels(run: str, **more: str) -> dict[str, str]:
    return {"agentrl.run": run, **{f"agentrl.{k}": v for k, v in more.items()}}


def start_env_worker_container(
    task: str,
    broker_url: str,
    run: str,
    capacity: int,
    options: Mapping[str, Any] | None = None,
    *,
    image: str = ENV_WORKER_IMAGE,
    labels: Mapping[str, str] | None = None,
    worker_id: str | None = None,
    client=None,
):
    """Start one ``agentrl-env-worker`` container for ``task``; returns the Container.

    ``options`` are the task's options (each passed as ``--option KEY=<json>``; paths in
    them are paths inside the container). The container is named
    ``agentrl-<run>-<worker_id>`` and is not started again when it exits.
    """
    import docker

    client = client or docker_client()
    worker_id = worker_id or f"{task}-{os.urandom(3).hex()}"
    argv = ["--task", task, "--run", run,
            "--capacity", str(capacity), "--worker-id", worker_id]  # fmt: skip
    for key, value in (options or {}).items():
        argv += ["--option", f"{key}={json.dumps(value)}"]  # JSON is YAML
    try:
        return client.containers.run(
            image,
            argv,
            name=f"agentrl-{run}-{worker_id}",
            detach=True,
            network_mode="host",
            labels={**_labels(run, task=task, role="env", worker=worker_id), **(labels or {})},
            # the URL (with its password) goes in the environment, not on the command
            # line, where `ps` on the host would show it to every user
            environment={"PYTHONUNBUFFERED": "1", "AGENTRL_BROKER_URL": broker_url},
        )
    except docker.errors.ImageNotFound as exc:
        raise ContainerError(
            f"image {image} not found; build it with ops/containers/build-images.sh"
        ) from exc
    except docker.errors.APIError as exc:
        raise ContainerError(f"cannot start a {task} worker from {image}: {exc}") from exc


def wait_ready(container, timeout: float = 60.0) -> None:
    """Return once the worker logs that it serves; ContainerError if it exits or stalls."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        logs = container.logs().decode(errors="replace")
        if READY_LINE in logs:
            return
        if container.status in ("exited", "dead") or time.monotonic() > deadline:
            tail = "\n".join(logs.strip().splitlines()[-10:])
            state = container.status if container.status != "running" else "not ready"
            raise ContainerError(
                f"env worker container {container.name} is {state} after "
                f"{timeout:.0f} s; its last output:\n{tail}"
            )
        time.sleep(0.2)


def stop_containers(
    run: str,
    *,
    labels: Mapping[str, str] | None = None,
    client=None,
    log_dir: Path | None = None,
    timeout: int = 10,
) -> int:
    """Stop (SIGTERM, then SIGKILL after ``timeout`` s) and remove every container of
    ``run`` that also carries ``labels``; their output is saved to
    ``log_dir/<name>.log`` when given. Returns how many were removed."""
    import docker

    client = client or docker_client()
    wanted = {**_labels(run), **(labels or {})}
    found = client.containers.list(
        all=True, filters={"label": [f"{k}={v}" for k, v in wanted.items()]}
    )
    for container in found:
        try:
            if container.status == "running":
                container.stop(timeout=timeout)
            if log_dir is not None:
                log_dir.mkdir(parents=True, exist_ok=True)
                (log_dir / f"{container.name}.log").write_bytes(container.logs())
            container.remove(force=True)
        except docker.errors.NotFound:
            continue  # removed meanwhile (by its engine or another node): nothing left
        log.info("container removed", name=container.name, run=run)
    return len(found)


class EnvWorkerContainers:
    """The env-worker containers one node runs for a run (the supervisor's ``env`` role)."""

    def __init__(
        self, run: str, broker_url: str, *, node: str, log_dir: Path | None = None
    ) -> None:
        self.run, self.node, self._broker, self._log_dir = run, node, broker_url, log_dir
        self._client = docker_client()
        left = stop_containers(run, labels=self._mine(), client=self._client)
        if left:
            log.warning("removed containers left over by an earlier run", run=run, count=left)
        self.containers: list = []

    def _mine(self) -> dict[str, str]:
        return {"agentrl.role": "env", "agentrl.node": self.node}

    def start(
        self,
        task: str,
        *,
        workers: int,
        capacity: int,
        options: Mapping[str, Any],
        image: str = ENV_WORKER_IMAGE,
        ready_timeout: float = 60.0,
    ) -> None:
        """Start ``workers`` containers for ``task`` and wait until each one serves."""
        started = [
            start_env_worker_container(
                task,
                self._broker,
                self.run,
                capacity,
                options,
                image=image,
                labels=self._mine(),
                worker_id=f"{self.node}-{task}-{i}",
                client=self._client,
            )
            for i in range(workers)
        ]
        self.containers += started
        for container in started:
            wait_ready(container, ready_timeout)

    def close(self) -> None:
        """Stop and remove every container of this node's env role (logs kept in log_dir)."""
        stop_containers(self.run, labels=self._mine(), client=self._client, log_dir=self._log_dir)
        self.containers.clear()
        self._client.close()
