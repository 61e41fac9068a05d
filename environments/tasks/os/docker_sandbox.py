"""`DockerSandbox`: a session's private machine as a container (Docker or podman).

One container per session, from image ``agentrl/os-sandbox`` by default (built
from ``environments/containers/os-sandbox.Dockerfile`` by
``ops/containers/build-images.sh``), started with ``network_mode="none"``, a
memory limit (swap included), a process limit, the working directory ``/root``,
and the labels ``agentrl.sandbox=os`` and ``agentrl.session=<label>``. Its main
process only waits; commands run with ``exec`` inside `WRAPPER` (time limit,
output cap), so background processes live on between commands. ``close``
removes the container by force; a container whose setup fails is removed
before the error is raised, so no session leaves a container behind.

The engine is ``docker.from_env()``: ``DOCKER_HOST`` selects the socket (podman's
``podman system service`` answers the same API).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import docker
import docker.errors
import structlog

from agentrl.environments.tasks.os.sandbox import (
    DEFAULT_IMAGE,
    Limits,
    RunResult,
    SandboxError,
    background_command,
    call_deadline,
    result_of,
    wrapped_command,
)

__all__ = ["SESSION_LABEL", "DockerSandbox"]

log = structlog.get_logger(__name__)

SESSION_LABEL = "agentrl.session"
_WAIT = ["bash", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]


class DockerSandbox:
    """One session's container; see the module doc."""

    def __init__(self, *, image: str = DEFAULT_IMAGE, limits: Limits, label: str = "") -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._closed = False
        self._container = None
        try:
            self._client = docker.from_env(timeout=60)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker sandbox: no engine answers: {exc}") from exc
        memory = f"{limits.memory_mb}m"
        try:
            # create, then start: `run` would pull a missing image, and a container whose
            # start fails would be left behind with no handle to remove it by.
            self._container = self._client.containers.create(
                image,
                command=_WAIT,
                detach=True,
                network_mode="none",
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=limits.pids,
                hostname="sandbox",
                working_dir="/root",
                labels={"agentrl.sandbox": "os", SESSION_LABEL: label},
            )
            self._container.start()
        except docker.errors.ImageNotFound as exc:
            self.close()
            raise SandboxError(
                f"docker sandbox: no image {image!r} (build it: ops/containers/build-images.sh)"
            ) from exc
        except (docker.errors.DockerException, OSError) as exc:
            self.close()
            raise SandboxError(f"docker sandbox: cannot start {image!r}: {exc}") from exc

    @property
    def container_id(self) -> str:
        return self._container.id if self._container is not None else ""

    def exec(self, argv: Sequence[str], timeout: float) -> RunResult:
        command = wrapped_command(argv, timeout, self._limits)
        began = time.monotonic()
        code, out = self._exec(command, call_deadline(timeout))
        return result_of(code, out, time.monotonic() - began, timeout)

    def run(self, script: str, timeout: float) -> RunResult:
        return self.exec(["bash", "-c", script], timeout)

    def start_background(self, script: str) -> None:
        self._exec(background_command(script), 30.0)

    def _exec(self, command: list[str], deadline: float) -> tuple[int, bytes]:
        """Run ``command`` in the container from a helper thread, waiting ``deadline`` s."""
        if self._closed or self._container is None:
            raise SandboxError("docker sandbox is closed")
        outcome: list = []

        def call() -> None:
            try:
                outcome.append(self._container.exec_run(command, stdout=True, stderr=True))
            except (docker.errors.DockerException, OSError) as exc:
                outcome.append(exc)

        worker = threading.Thread(target=call, name="docker-exec", daemon=True)
        worker.start()
        worker.join(deadline)
        if not outcome:
            raise SandboxError(f"docker sandbox: a command did not return in {deadline:g} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise SandboxError(f"docker sandbox: exec failed: {result}") from result
        if result.exit_code is None:
            raise SandboxError("docker sandbox: exec ended without an exit code")
        return int(result.exit_code), result.output or b""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._container is not None:
                self._container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxError(f"docker sandbox: cannot remove its container: {exc}") from exc
        finally:
            self._client.close()
