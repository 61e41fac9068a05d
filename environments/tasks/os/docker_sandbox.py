"""`DockerSandbox`: a session's private machine as a container (Docker or podman).

One container per session, from image ``agentrl/os-sandbox`` by default (built
from ``environments/containers/os-sandbox.Dockerfile`` by
``ops/containers/build-images.sh``), started with ``network_mode="none"``, a
memory limit (swap included), a process limit, a CPU quota (``cpus``), a disk quota
(``disk_mb``, the engine's ``storage_opt size``: only where the engine supports it,
e.g. overlay over xfs with pquota; otherwise a warning is logged and writes are bounded
per file only), the working directory ``/root``, and the labels
``agentrl.sandbox=os`` and ``agentrl.session=<label>``. On podman the container has
its own user namespace (``auto``: root inside is an unprivileged id outside) and an
empty ``/proc/tty/driver``;
``/proc/sys`` is read-only in a container by default.

A judge (`judge`) runs its interpreter by absolute path through `guard.GUARD` (nothing
it starts can ``ptrace`` it) with a clean environment and `JUDGE_PATH`, its output
(stdout; stderr apart) read from the exec: shadowing through ``PATH``,
``BASH_ENV``/``ENV``, shell start-up files or Python's user site does not reach it.
The container's programs are the agent's to rewrite, though: before and after a judge
runs, `container_judge.changed_programs` compares what the container changed under the
program, library, loader and Python site folders with the image, and any such change
fails the judging (the bwrap backend instead judges in a view of the host's programs).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence

import docker
import docker.errors
import structlog

from agentrl.environments.tasks.os.container_judge import changed_programs
from agentrl.environments.tasks.os.guard import guarded
from agentrl.environments.tasks.os.sandbox import (
    DEFAULT_IMAGE,
    JUDGE_PATH,
    Limits,
    RunResult,
    SandboxError,
    background_command,
    call_deadline,
    result_of,
    wrapped_command,
)
from agentrl.environments.tasks.os.terminal import FdIO

__all__ = ["SESSION_LABEL", "DockerSandbox"]

log = structlog.get_logger(__name__)

SESSION_LABEL = "agentrl.session"
_USERNS_SIZE = 65536
"""Ids of a container's user namespace (podman's ``auto``: from the ``containers`` entry
of /etc/subuid and /etc/subgid, which ops/containers/setup-podman.sh writes)."""
_WAIT = ["bash", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]


class DockerSandbox:
    """One session's container; see the module doc."""

    def __init__(self, *, image: str = DEFAULT_IMAGE, limits: Limits, label: str = "") -> None:
        self._limits = limits
        self._image = image
        self._lock = threading.Lock()
        self._closed = False
        self._container = None
        try:
            self._client = docker.from_env(timeout=60)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker sandbox: no engine answers: {exc}") from exc
        try:
            # create, then start: `run` would pull a missing image, and a container whose
            # start fails would be left behind with no handle to remove it by.
            self._container = self._create(image, label)
            self._container.start()
        except docker.errors.ImageNotFound as exc:
            self.close()
            raise SandboxError(
                f"docker sandbox: no image {image!r} (build it: ops/containers/build-images.sh)"
            ) from exc
        except (docker.errors.DockerException, OSError) as exc:
            self.close()
            hint = ""
            if "available IDs" in str(exc):
                hint = " (/etc/subuid and /etc/subgid need a 'containers' range: setup-podman.sh)"
            raise SandboxError(f"docker sandbox: cannot start {image!r}: {exc}{hint}") from exc

    def _create(self, image: str, label: str):
        """The session's container, with every limit this engine can apply."""
        memory = f"{self._limits.memory_mb}m"
        quota = {"size": f"{self._limits.disk_mb}m"} if _quota_works(self._client) else None
        host_config = self._client.api.create_host_config(
            network_mode="none",
            mem_limit=memory,
            memswap_limit=memory,
            pids_limit=self._limits.pids,
            nano_cpus=int(self._limits.cpus * 1e9),
            storage_opt=quota,
        )
        if _is_podman(self._client):  # root inside is an unprivileged id outside
            host_config["UsernsMode"] = f"auto:size={_USERNS_SIZE}"
            # whose /proc/tty/driver (the host root's) it cannot read: a `find /` would
            # exit 1 where AgentBench's root reads it; masked empty, as Docker masks others
            host_config["SecurityOpt"] = ["mask=/proc/tty/driver"]
        created = self._client.api.create_container(
            image,
            command=_WAIT,
            detach=True,
            hostname="sandbox",
            working_dir="/root",
            labels={"agentrl.sandbox": "os", SESSION_LABEL: label},
            host_config=host_config,
        )
        return self._client.containers.get(created["Id"])

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

    def open_terminal(self) -> FdIO:
        """``bash --login`` through an exec with a tty and stdin, as AgentBench's
        ``create_shell`` opens it; the exec's socket is the stream."""
        if self._closed or self._container is None:
            raise SandboxError("docker sandbox is closed")
        api = self._client.api
        try:
            created = api.exec_create(
                self._container.id,
                ["bash", "--login"],
                stdin=True,
                tty=True,
                environment={"TERM": "xterm"},
                workdir="/root",
            )
            stream = api.exec_start(created["Id"], tty=True, socket=True)
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxError(f"docker sandbox: cannot open a terminal: {exc}") from exc
        sock = getattr(stream, "_sock", stream)  # docker's SocketIO wraps the socket
        return FdIO(sock.fileno(), sock.close)

    def judge(self, argv: Sequence[str], timeout: float) -> RunResult:
        """``argv`` with nothing of the agent's environment and `JUDGE_PATH`, its output
        straight from the exec (not `WRAPPER`'s file, which the agent's processes could
        rewrite), refused when the agent changed the image's programs (`_tampered`).
        The container's ``/usr`` is the agent's to write: see the module doc."""
        clean = ["/usr/bin/env", "-i", f"PATH={JUDGE_PATH}", "HOME=/root", "LANG=C.UTF-8"]
        limit = ["timeout", "-k", "1", f"{max(timeout, 0.1):g}"]
        # an exec holds no CAP_SYS_ADMIN: the guard keeps the exec's capabilities as they are
        command = [*clean, *limit, *guarded(list(argv), 0)]
        if refused := self._tampered():
            return refused
        began = time.monotonic()
        code, out, err = self._exec_apart(command, call_deadline(timeout))
        elapsed = time.monotonic() - began
        if refused := self._tampered():  # changed while it ran: by a process left running
            return refused
        cap = self._limits.output_bytes
        return result_of(code, out[:cap], elapsed, timeout, errors=err[:cap])

    def _tampered(self) -> RunResult | None:
        """A failed judging when the agent changed the image's programs (`container_judge`)."""
        try:
            changed = changed_programs(self._client, self._container, self._image)
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxError(f"docker sandbox: cannot compare with the image: {exc}") from exc
        if not changed:
            return None
        log.info("os judge refused: the agent changed programs", paths=changed[:5])
        return RunResult(126, f"judge refused: the agent changed {', '.join(changed[:5])}")

    def _exec(self, command: list[str], deadline: float) -> tuple[int, bytes]:
        """Run ``command`` in the container from a helper thread, waiting ``deadline`` s;
        its stdout and stderr together."""
        code, output = self._exec_run(command, deadline, demux=False)
        return code, output or b""

    def _exec_apart(self, command: list[str], deadline: float) -> tuple[int, bytes, bytes]:
        """`_exec`, with stdout and stderr apart."""
        code, (out, err) = self._exec_run(command, deadline, demux=True)
        return code, out or b"", err or b""

    def _exec_run(self, command: list[str], deadline: float, *, demux: bool):
        if self._closed or self._container is None:
            raise SandboxError("docker sandbox is closed")
        outcome: list = []

        def call() -> None:
            try:
                outcome.append(
                    self._container.exec_run(command, stdout=True, stderr=True, demux=demux)
                )
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
        if demux:  # (stdout, stderr), either None when the command wrote nothing there
            return int(result.exit_code), result.output or (None, None)
        return int(result.exit_code), result.output

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._container is not None:
                self._remove()
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, OSError) as exc:
            raise SandboxError(f"docker sandbox: cannot remove its container: {exc}") from exc
        finally:
            self._client.close()

    def _remove(self) -> None:
        """Remove the container; podman's removal of a user-namespaced container's shm
        mount can report it busy while its processes exit: tried again, a few times."""
        for attempt in range(5):
            try:
                self._container.remove(force=True, v=True)
                return
            except docker.errors.APIError as exc:
                if "resource busy" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))


@functools.cache
def _engine(client_url: str) -> tuple[bool, bool]:
    """(podman?, per-container disk quota?) of the engine at ``client_url``, asked once."""
    client = docker.from_env(timeout=30)
    try:
        version = client.version()
        podman = any("podman" in c.get("Name", "").lower() for c in version.get("Components", []))
        info = client.info()
    finally:
        client.close()
    driver = info.get("Driver", "")
    backing = dict(info.get("DriverStatus") or [])
    quota = driver != "overlay" or "xfs" in backing.get("Backing Filesystem", "").lower()
    if not quota:
        log.warning(
            "the docker sandbox has no disk quota on this engine (overlay over xfs with pquota "
            "needed): a session's writes are bounded per file only",
            backing=backing.get("Backing Filesystem", "?"),
        )
    return podman, quota


def _is_podman(client) -> bool:
    return _engine(client.api.base_url)[0]


def _quota_works(client) -> bool:
    return _engine(client.api.base_url)[1]
