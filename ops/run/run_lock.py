"""The run lock: a file in the run directory held by the run's live learner, on any broker.

``runs/<run>/LOCK`` is held with ``flock`` for as long as the learner's process lives, so
a killed process (SIGKILL included) releases it with its file descriptors; it records the
holder's pid, host and start time for the refusal a second learner gets. The broker's
lock (`take_learner_lock`: an exclusive queue) also covers learners on different hosts
without a shared run directory; this one covers the in-process broker (``memory://``),
where each process has a broker of its own and the queue cannot see the other process.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import structlog

from agentrl.messages import BrokerRefused, Transport, connect
from agentrl.messages._support import RESOURCE_LOCKED

log = structlog.get_logger(__name__)

__all__ = [
    "LOCK_FILE",
    "LOCK_WAIT",
    "RunLock",
    "RunLocked",
    "hold_run_lock",
    "learner_lock_queue",
    "take_learner_lock",
]

LOCK_FILE = "LOCK"
"""In the run directory: the live learner's pid, host and start time (JSON), flock-held."""


class RunLocked(RuntimeError):
    """Raised when another learner already holds the run (its lock file or broker lock)."""


class RunLock:
    """A held run lock; `close` releases it (so does the process's death)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.close(fd)  # releases the flock; the file stays (its content is the last holder)


def _holder(path: Path) -> str:
    """The holder recorded in the lock file, in words."""
    try:
        record = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return "a process whose record is unreadable"
    since = record.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')} since {when}"


def hold_run_lock(run_dir: Path, run: str) -> RunLock:
    """Take ``run_dir``'s lock for this process, or raise `RunLocked` naming its holder.

    Never blocks: a live holder is a second start of the run, not something to wait for.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunLocked(
            f"run {run!r} is live ({_holder(path)}, lock {path}): stop that process first, "
            "or choose another --run"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return RunLock(path, fd)


def learner_lock_queue(run: str) -> str:
    return f"{run}.learner-lock"


def take_learner_lock(broker: str, run: str, node: str, wait: float = 0.0) -> Transport:
    """Hold ``run``'s learner lock: an exclusive queue on the broker, owned by the returned
    connection (close it to release). The broker drops the queue with the connection, so a
    learner that dies (even SIGKILL) frees the lock; a second learner of the same run, on
    any host, is refused with `RunLocked` instead of training into the same checkpoints.
    A lock still held is tried again for up to ``wait`` seconds (a restarted learner whose
    predecessor's connection the broker has not dropped yet)."""
    deadline = time.monotonic() + wait
    while True:
        transport = connect(broker, name=f"{run}-{node}-learner-lock")
        try:
            transport.declare_queue(learner_lock_queue(run), exclusive=True, dead_letter=False)
            return transport
        except BrokerRefused as exc:
            transport.close()
            if exc.reply_code != RESOURCE_LOCKED:
                raise
            if time.monotonic() >= deadline:
                raise RunLocked(
                    f"run {run!r} already has a learner (its lock queue "
                    f"{learner_lock_queue(run)!r} is held): stop that run first, "
                    "or choose another --run"
                ) from exc
            log.info("the run's learner lock is held; waiting", run=run)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        except BaseException:
            transport.close()
            raise


LOCK_WAIT = 30.0
"""Seconds a starting learner waits for a held lock before `RunLocked`."""
