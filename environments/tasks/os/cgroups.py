"""A bwrap session's cgroups: its memory, process and CPU limits, and one group per command.

The session's group (v2) or groups (v1: one per controller) sit under this process's
own cgroup. Memory covers the session's processes and its tmpfs disk together
(``memory_mb + disk_mb``: tmpfs pages are charged to the cgroup that writes them);
the process count and the CPU quota (``cpus``) cover everything of the session.

Every command runs in a child group of its own (in the ``pids`` hierarchy on v1), so
whatever it starts, ``setsid``, double-forked or daemonised, stays in that group:
`SessionCgroups.kill` ends it all at the command's time limit, and `close` ends the
session's. A command that ends in time leaves its background jobs running in its group.

When the cgroup file system is read-only there are no groups (`available` is False):
the memory limit falls back to ``ulimit -v`` and nothing bounds CPU or processes, which
is logged once per session.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

import structlog

from agentrl.environments.tasks.os.sandbox import Limits

__all__ = ["SessionCgroups"]

log = structlog.get_logger(__name__)

_CGROOT = Path("/sys/fs/cgroup")
_CPU_PERIOD_US = 100_000


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path for ``controller`` (v1) or in the v2 hierarchy ("")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return ""


def _kill_all(group: Path) -> None:
    """SIGKILL every process of ``group`` and its children until none is left."""
    kill = group / "cgroup.kill"
    if kill.exists():  # v2, kernel 5.14+: atomic, forks included
        with contextlib.suppress(FileNotFoundError):
            kill.write_text("1")
    for _ in range(1000):
        pids = []
        for procs in group.rglob("cgroup.procs"):
            with contextlib.suppress(FileNotFoundError):
                pids += [int(p) for p in procs.read_text().split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    log.warning("processes survive in a sandbox cgroup", cgroup=str(group))


def _remove(group: Path) -> None:
    """Kill what is left in ``group`` and remove it with its children."""
    _kill_all(group)
    for child in sorted((p for p in group.rglob("*") if p.is_dir()), reverse=True):
        _rmdir(child)
    _rmdir(group)


def _rmdir(group: Path) -> None:
    for _ in range(100):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    log.warning("a sandbox cgroup could not be removed", cgroup=str(group))


class SessionCgroups:
    """The cgroups of one session (see the module doc)."""

    def __init__(self, name: str, limits: Limits) -> None:
        self._name = name
        self._limits = limits
        self._made: list[Path] = []
        self._tracker: Path | None = None  # the group commands get children in
        self._others: list[Path] = []  # v1: memory and cpu groups (session-wide)
        self._numbers = itertools.count()
        try:
            self._make()
        except OSError as exc:
            for group in self._made:
                _remove(group)
            self._made, self._tracker, self._others = [], None, []
            log.warning("no cgroup limits for the bwrap sandbox", reason=str(exc))

    @property
    def available(self) -> bool:
        return self._tracker is not None

    def _group(self, controller: str) -> Path:
        base = _CGROOT / controller if controller else _CGROOT
        group = Path(str(base) + _own_cgroup(controller)) / self._name
        group.mkdir()
        self._made.append(group)
        return group

    def _make(self) -> None:
        memory = (self._limits.memory_mb + self._limits.disk_mb) << 20
        quota = max(int(self._limits.cpus * _CPU_PERIOD_US), 1000)
        if (_CGROOT / "cgroup.controllers").exists():  # v2: one group, every limit
            group = self._group("")
            (group / "memory.max").write_text(str(memory))
            (group / "memory.swap.max").write_text("0")
            (group / "pids.max").write_text(str(self._limits.pids))
            self._cpu(group / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
            self._tracker = group
            return
        memory_group = self._group("memory")
        (memory_group / "memory.limit_in_bytes").write_text(str(memory))
        pids_group = self._group("pids")
        (pids_group / "pids.max").write_text(str(self._limits.pids))
        self._others = [memory_group]
        if (_CGROOT / "cpu").is_dir():
            cpu_group = self._group("cpu")
            (cpu_group / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            self._cpu(cpu_group / "cpu.cfs_quota_us", str(quota))
            self._others.append(cpu_group)
        else:
            log.warning("no cpu controller: the bwrap sandbox runs without a CPU limit")
        self._tracker = pids_group

    @staticmethod
    def _cpu(knob: Path, value: str) -> None:
        if knob.exists():
            knob.write_text(value)
        else:
            log.warning("no cpu controller: the bwrap sandbox runs without a CPU limit")

    def session(self) -> list[Path]:
        """The groups the session's first process joins."""
        return [*self._others, self._tracker] if self._tracker is not None else []

    def command(self) -> Path | None:
        """A new child group for one command (None without cgroups)."""
        if self._tracker is None:
            return None
        group = self._tracker / f"cmd-{next(self._numbers)}"
        group.mkdir()
        return group

    def joined(self, command: Path | None) -> list[Path]:
        """The groups a command's process joins: the session's, its own for tracking."""
        return [*self._others, command] if command is not None else []

    def kill(self, command: Path | None) -> None:
        """End every process the command started (at its time limit)."""
        if command is not None:
            _kill_all(command)

    def release(self, command: Path | None) -> None:
        """Remove the command's group if nothing of it runs any more."""
        if command is not None:
            with contextlib.suppress(OSError):  # busy: background jobs live on in it
                command.rmdir()

    def close(self) -> None:
        for group in self._made:
            _remove(group)
        self._made = []
