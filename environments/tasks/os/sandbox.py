"""Sandboxes for the ``os`` task: a private Linux system per session.

A `Sandbox` is one session's machine. Its processes see their own root
filesystem (writes never reach the host), no network (a loopback of their
own at most), a memory and process-count limit, and they all die at
`Sandbox.close`. Backends:

- `agentrl.environments.tasks.os.bwrap.BwrapSandbox`: bubblewrap on the host
  (``bwrap`` must be installed): the host's ``/usr`` read-only, a private
  copy of a few ``/etc`` files and private writable ``/root``, ``/home``,
  ``/tmp``, ``/var``, ``/usr/local``...; limits by cgroup.
- `agentrl.environments.tasks.os.docker_sandbox.DockerSandbox`: one container per
  session through the ``docker`` SDK (Docker or podman's socket), image
  ``agentrl/os-sandbox`` (built from ``environments/containers/os-sandbox.Dockerfile``).

Both run every command through the same wrapper (`WRAPPER`, bash and
coreutils inside the sandbox): the command runs under ``timeout`` in its own
process group, killed with every process of the group at the time limit, its output
(stdout and stderr together) goes to a file and at most `Limits.output_bytes`
of it come back; background jobs the command leaves behind keep running
without holding the call open.

`open_sandbox(kind, ...)` picks and opens a backend; `choose_backend()` is the
default choice: ``docker`` when a Docker-compatible socket answers and has the
image, else ``bwrap``.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import structlog

from agentrl.environments._protocol import InfraError

if TYPE_CHECKING:
    from agentrl.environments.tasks.os.terminal import TerminalIO

__all__ = [
    "BACKENDS",
    "DEFAULT_IMAGE",
    "JUDGE_PATH",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "choose_backend",
    "docker_available",
    "open_sandbox",
    "wrapped_command",
]

log = structlog.get_logger(__name__)

BACKENDS = ("bwrap", "docker")
DEFAULT_IMAGE = "agentrl/os-sandbox"
TIMEOUT_CODES = (124, 137)
"""Exit codes of ``timeout`` when it had to stop the command (TERM, then KILL)."""
JUDGE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
"""A judge's ``PATH``: the system's programs first; the agent's ``/usr/local`` only for
names nothing else has (a command the task asked it to write)."""
_GRACE = 30.0
"""Seconds past a command's own limit before the backend call itself is abandoned."""


class SandboxError(InfraError):
    """Raised when a sandbox cannot be opened or stops answering (not the model's fault)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one sandbox."""

    memory_mb: int = 512
    """Memory of every process of the session together, in MiB."""
    pids: int = 256
    """Processes and threads alive at once."""
    output_bytes: int = 65536
    """At most this much of a command's output is returned."""
    file_mb: int = 256
    """Largest file a command may write (also bounds its captured output)."""
    disk_mb: int = 256
    """Everything the session writes together (files, the changes to ``/usr``), in MiB.
    On bwrap the files live in memory (a tmpfs): the session's cgroup then allows
    ``memory_mb + disk_mb`` for its processes and files together."""
    cpus: float = 1.0
    """CPU time of the whole session, in cores."""
    open_files: int = 1 << 20
    """Open files per process (``ulimit -n``) under bwrap: 1048576, what Docker's
    containers inherit from containerd's ``LimitNOFILE`` and had where AgentBench's items
    were written (one init redirects descriptor 123321); at most the kernel's
    ``fs.nr_open`` and, without ``CAP_SYS_RESOURCE``, the worker's own hard limit
    (`bwrap.open_files_limit`). Containers get the engine's default, as AgentBench's."""

    @property
    def inodes(self) -> int:
        """Files the session may hold: one per 8 KiB of its disk quota."""
        return self.disk_mb * 128


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a command did."""

    exit_code: int
    output: str
    """stdout and stderr interleaved, decoded as UTF-8 (bad bytes replaced), capped; a
    judge's (`Sandbox.judge`): its stdout alone, as AgentBench hands it to the next check."""
    timed_out: bool = False
    """True when the command was killed at its time limit."""
    errors: str = ""
    """A judge's stderr (for the logs); empty for other commands."""


@runtime_checkable
class Sandbox(Protocol):
    """One session's private machine."""

    def run(self, script: str, timeout: float) -> RunResult:
        """Run a bash script and wait (at most ``timeout`` seconds, then it is killed)."""
        ...

    def exec(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run a program with arguments, same rules as `run`."""
        ...

    def start_background(self, script: str) -> None:
        """Start a bash script detached; it runs until it ends or the sandbox closes."""
        ...

    def open_terminal(self) -> TerminalIO:
        """Start ``bash --login`` on a terminal of its own (``TERM=xterm``, working
        directory ``/root``) and return the stream to and from that terminal."""
        ...

    def judge(self, argv: Sequence[str], timeout: float) -> RunResult:
        """Run a judge's program on the session's files: ``argv[0]`` an absolute path,
        found with every program it runs where the agent cannot have changed them
        (`JUDGE_PATH`), with nothing of the agent's environment; same limits as `exec`.
        Its output is its stdout (its stderr in `RunResult.errors`), as AgentBench's
        ``execute_independent`` hands a check script's stdout to the next."""
        ...

    def close(self) -> None:
        """Kill every process of the session and free its files; idempotent."""
        ...


# $1 timeout seconds, $2 output bytes, $3 file size limit in KiB, then the command.
# `timeout` leads a new process group; after a timeout the group is SIGKILLed until
# empty, then every process that started after the wrapper did (setsid, double-forked
# and daemonised children leave the group, not the pid namespace); builtins only: a fork
# bomb may have used every pid. Jobs a command that ends in time leaves in the
# background live on. (bwrap also kills the command's cgroup.)
WRAPPER = r"""
t=$1 cap=$2 fsize=$3; shift 3
start_of() { set -- $1; s=${20:-0}; }  # a /proc/PID/stat's start time, past "(comm) "
read -r me < /proc/self/stat; start_of "${me##*) }"; began=$s
mkdir -p /run/agentrl 2>/dev/null
out=$(mktemp /run/agentrl/out.XXXXXX 2>/dev/null || mktemp)
(ulimit -f "$fsize" 2>/dev/null; exec timeout -k 1 "$t" "$@") >"$out" 2>&1 </dev/null &
group=$!
wait $group
rc=$?
if [ $rc = 124 ] || [ $rc = 137 ]; then
    n=0
    while [ $n -lt 100000 ] && kill -KILL -- -$group 2>/dev/null; do n=$((n + 1)); done
    for round in 1 2 3; do
        for d in /proc/[0-9]*; do
            [ "${d#/proc/}" = "$$" ] && continue
            read -r st < "$d/stat" 2>/dev/null || continue
            start_of "${st##*) }"
            [ "$s" -ge "$began" ] 2>/dev/null && kill -KILL "${d#/proc/}" 2>/dev/null
        done
    done
fi
head -c "$cap" "$out"
rm -f "$out"
exit $rc
"""


def wrapped_command(argv: Sequence[str], timeout: float, limits: Limits) -> list[str]:
    """``argv`` inside `WRAPPER`: what a backend actually executes in the sandbox."""
    seconds = f"{max(timeout, 0.1):g}"
    return [
        "bash",
        "-c",
        WRAPPER,
        "agentrl-run",
        seconds,
        str(limits.output_bytes),
        str(limits.file_mb * 1024),
        *argv,
    ]


def background_command(script: str) -> list[str]:
    """A bash script started in a new session, detached from the caller's output."""
    return ["bash", "-c", 'setsid bash -c "$1" >/dev/null 2>&1 </dev/null &', "agentrl-bg", script]


def result_of(
    exit_code: int, raw: bytes, elapsed: float, timeout: float, errors: bytes = b""
) -> RunResult:
    """Decode a command's outcome; a timeout code after the limit means killed."""
    timed_out = exit_code in TIMEOUT_CODES and elapsed >= timeout * 0.9
    decoded = errors.decode("utf-8", errors="replace")
    return RunResult(exit_code, raw.decode("utf-8", errors="replace"), timed_out, decoded)


def call_deadline(timeout: float) -> float:
    """How long a backend waits for a wrapped command before giving the sandbox up."""
    return timeout + _GRACE


@functools.cache
def docker_available(image: str = DEFAULT_IMAGE) -> bool:
    """True when a Docker-compatible engine answers (``DOCKER_HOST`` honoured) and has ``image``.

    Cached per process: the answer decides the default backend once.
    """
    try:
        import docker
        import docker.errors
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            client.ping()
            client.images.get(image)
        finally:
            client.close()
    except (docker.errors.DockerException, OSError) as exc:
        log.info("no docker sandbox", image=image, reason=str(exc)[:200])
        return False
    return True


def choose_backend(image: str = DEFAULT_IMAGE) -> str:
    """The default backend: ``docker`` when it answers and has ``image``, else ``bwrap``."""
    return "docker" if docker_available(image) else "bwrap"


def open_sandbox(
    kind: str, *, image: str = DEFAULT_IMAGE, limits: Limits | None = None, label: str = ""
) -> Sandbox:
    """Open a fresh sandbox of backend ``kind`` (``bwrap`` or ``docker``).

    ``image`` is the container image (docker only); ``label`` tags the session
    (the container's ``agentrl.session`` label, the bwrap cgroup's name).
    Raises SandboxError when the backend is missing or the sandbox cannot start.
    """
    limits = limits or Limits()
    if kind == "bwrap":
        from agentrl.environments.tasks.os.bwrap import BwrapSandbox

        if shutil.which("bwrap") is None:
            raise SandboxError("the bwrap sandbox needs bubblewrap: apt-get install bubblewrap")
        return BwrapSandbox(limits=limits, label=label)
    if kind == "docker":
        from agentrl.environments.tasks.os.docker_sandbox import DockerSandbox

        return DockerSandbox(image=image, limits=limits, label=label)
    raise ValueError(f"sandbox must be one of {', '.join(BACKENDS)}, got {kind!r}")
