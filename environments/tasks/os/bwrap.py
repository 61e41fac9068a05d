"""`BwrapSandbox`: a session's private machine made with bubblewrap on the host.

The session starts with `agentrl.environments.tasks.os.launch` (as host root, in the
session's cgroups): a private mount namespace holding the session's tmpfs disk (its
quota) and overlay ``/usr``, then a user namespace whose root is host uid `UID_BASE`
(ids 0..65535 inside are `UID_BASE`.. outside: root in the sandbox is nobody on the
host), then bwrap as that root (`layout.bwrap_argv`: what the machine holds, and the
judge's read-only view of it). New pid, network (loopback only), ipc, uts and cgroup
namespaces, ``--die-with-parent``; ``/proc/sys`` read-only.

The session's first process (a ``sleep`` under bwrap's init) holds the namespaces and,
on a descriptor (`JUDGE_FD`), the judge's view; every command enters them with
``nsenter``, lowers its capabilities to
`CAPS` with the judge view's ``setpriv`` (so the agent cannot hand a program of its own
the full set), ``chroot``s into the agent's view and runs under `WRAPPER`, in a cgroup
of its own (`SessionCgroups`): at its time limit every process it started, ``setsid``
ones included, is killed. A judge (`judge`) runs in the judge's view through
`guard.GUARD` (no process it starts can trace it or write its memory), with its output
read straight from its pipe, and every process it started is killed when it ends.
Closing kills the init (the kernel then kills every process of the pid namespace),
every process left in the cgroups; the tmpfs goes with
the last of them, and the template directory on the host is removed.

Requires root on the host, user namespaces and id-mapped mounts (Linux 5.12+; overlayfs
over an id-mapped layer: 5.19+); raises `SandboxError` saying which part failed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from agentrl.environments.tasks.os import launch
from agentrl.environments.tasks.os.cgroups import SessionCgroups
from agentrl.environments.tasks.os.guard import caps_mask, guarded
from agentrl.environments.tasks.os.layout import (
    CAPS,
    JUDGE_FD,
    PATH,
    bwrap_argv,
    prepare_template,
)
from agentrl.environments.tasks.os.sandbox import (
    JUDGE_PATH,
    TIMEOUT_CODES,
    Limits,
    RunResult,
    SandboxError,
    background_command,
    call_deadline,
    result_of,
    wrapped_command,
)
from agentrl.environments.tasks.os.terminal import FdIO

__all__ = ["UID_BASE", "BwrapSandbox"]

log = structlog.get_logger(__name__)

UID_BASE = 1_000_000_000
"""Host uid (and gid) of a session's root; its other ids follow (65536 of them)."""
_ID_COUNT = 65536
_JOIN_CGROUPS = 'for g in $AGENTRL_CGROUPS; do echo $$ > "$g/cgroup.procs" || exit 125; done\n'
_NR_OPEN = Path("/proc/sys/fs/nr_open")
_CAP_SYS_RESOURCE = 24
_SETPRIV, _CHROOT, _ENV = "/usr/bin/setpriv", "/usr/sbin/chroot", "/usr/bin/env"
_LOGIN_SHELL = ("setsid", "--ctty", "bash", "--login")
"""The terminal's shell: a session of its own with the pty as its controlling terminal."""
_BASE_ENV = ("HOME=/root", "LANG=C.UTF-8")


class BwrapSandbox:
    """One session's machine under bubblewrap; see the module doc."""

    def __init__(self, *, limits: Limits, label: str = "") -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._closed = False
        name = f"agentrl-{label or 'sbx'}-{uuid.uuid4().hex[:8]}"
        self._dir = Path(tempfile.mkdtemp(prefix=name + "-"))
        self._cgroups = SessionCgroups(name, limits)
        self._init: subprocess.Popen | None = None
        self._pid = 0
        self._holder = 0
        try:
            prepare_template(self._dir / "fs")
            self._start_init()
        except BaseException:
            self.close()
            raise

    @property
    def init_pid(self) -> int:
        """Host pid of the process holding the session's namespaces (bwrap's init)."""
        return self._pid

    def _start_init(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            config = {
                "disk_mb": self._limits.disk_mb,
                "inodes": self._limits.inodes,
                "uid": UID_BASE,
                "count": _ID_COUNT,
                "template": str(self._dir / "fs"),
                "command": bwrap_argv(write_fd),
            }
            argv = [sys.executable, "-I", launch.__file__, json.dumps(config)]
            try:
                self._init = self._popen(argv, self._cgroups.session(), pass_fds=(write_fd,))
            finally:
                os.close(write_fd)
            info = _read_info(read_fd, deadline=time.monotonic() + 15)
        finally:
            os.close(read_fd)
        if info is None:
            err = b""
            if self._init.poll() is not None and self._init.stderr is not None:
                err = self._init.stderr.read()
            raise SandboxError(f"bwrap did not start: {err.decode(errors='replace')[:300]}")
        self._pid = int(info["child-pid"])
        # The pid is known before bwrap has built the root; commands may enter once the
        # init process runs inside it (it then marks its private /run).
        ready = Path(f"/proc/{self._pid}/root/run/.agentrl-ready")
        deadline = time.monotonic() + 15
        while not _exists(ready):
            if self._init.poll() is not None or time.monotonic() > deadline:
                err = self._init.stderr.read() if self._init.poll() is not None else b""
                raise SandboxError(
                    f"bwrap sandbox: its init process did not start: {err.decode()[:300]}"
                )
            time.sleep(0.005)
        self._holder = _child_of(self._pid)

    def _popen(self, argv: list[str], groups: list[Path], **kwargs) -> subprocess.Popen:
        env = {"PATH": PATH, "AGENTRL_CGROUPS": " ".join(str(g) for g in groups)}
        script = _JOIN_CGROUPS + f"ulimit -n {self._open_files()} 2>/dev/null\n"
        if not self._cgroups.available:
            script += f"ulimit -v {self._limits.memory_mb * 1024} 2>/dev/null\n"
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(
            ["sh", "-c", script + 'exec "$@"', "agentrl-sandbox", *argv],
            env=env,
            start_new_session=True,
            **kwargs,
        )

    def _open_files(self) -> int:
        return open_files_limit(self._limits.open_files)

    def _enter(
        self, argv: Sequence[str], *, judge: bool = False, env: Sequence[str] = ()
    ) -> list[str]:
        """``argv`` run in the session: entered through the judge's view, whose ``setpriv``
        lowers the capabilities, then (for the agent's view) ``chroot`` to pid 1's root."""
        view = f"/proc/{self._holder}/fd/{JUDGE_FD}"
        caps = ",".join(f"+{c}" for c in CAPS)
        enter = ["nsenter", "-t", str(self._pid), "-U", "-m", "-u", "-i", "-n", "-p"]
        enter += [f"--root={view}", f"--wd={view}/root"]
        if judge:  # sys_admin for `guard.GUARD` alone, which drops it before the judge runs;
            # sys_chroot as the agent's commands hold it: a judge whose capabilities are not
            # a superset of a process's cannot read its /proc entries (`find /` exits 1)
            bounding = f"--bounding-set=-all,{caps},+sys_chroot,+sys_admin"
            drop = [_SETPRIV, "--inh-caps=-all", bounding]
            clean = [_ENV, "-i", f"PATH={JUDGE_PATH}", *_BASE_ENV]
            keep = caps_mask((*CAPS, "sys_chroot"))
            return [*enter, *drop, "--", *clean, *guarded(list(argv), keep)]
        drop = [_SETPRIV, "--inh-caps=-all", f"--bounding-set=-all,{caps},+sys_chroot"]
        into = [_CHROOT, "/proc/1/root", _ENV, "-i", "-C", "/root", f"PATH={PATH}", *_BASE_ENV]
        into += env
        return [*enter, *drop, "--", *into, *argv]

    def exec(self, argv: Sequence[str], timeout: float) -> RunResult:
        command = wrapped_command(argv, timeout, self._limits)
        code, out, err, elapsed = self._call(self._enter(command), timeout)
        if code != 0 and not out:  # it did not start: say why (a process limit...)
            out = err[-2000:]
        return result_of(code, out, elapsed, timeout)

    def judge(self, argv: Sequence[str], timeout: float) -> RunResult:
        """``argv`` itself in the session (no ``timeout`` process above it: the session's
        processes are those of AgentBench's ``docker exec``), stopped from here at
        ``timeout`` by killing its cgroup."""
        command = self._enter(argv, judge=True)
        code, out, err, elapsed = self._call(command, timeout, judge=True)
        return result_of(code, out, elapsed, timeout, errors=err)

    def _call(
        self, command: list[str], timeout: float, *, judge: bool = False
    ) -> tuple[int, bytes, bytes, float]:
        """Run an entered command in a cgroup of its own; kill what is left of it when
        it ran over ``timeout`` (a judge's, always). Its stdout and stderr are read here,
        at most `Limits.output_bytes` of each kept (a command's output comes through
        `WRAPPER`'s file, on its stdout; a judge's straight from its pipes)."""
        self._check_open()
        group = self._cgroups.command()
        began = time.monotonic()
        try:
            proc = self._popen(command, self._cgroups.joined(group))
            reader = _CappedReader(proc.stdout, self._limits.output_bytes)
            errors = _CappedReader(proc.stderr, self._limits.output_bytes)
            try:
                code = proc.wait(timeout=timeout if judge else call_deadline(timeout))
            except subprocess.TimeoutExpired as exc:
                _kill_group(proc)
                self._cgroups.kill(group)
                proc.wait()
                if not judge:
                    raise SandboxError(f"bwrap sandbox: a command hung past {timeout:g} s") from exc
                code = TIMEOUT_CODES[0]  # stopped at its limit: what `timeout` would say
            elapsed = time.monotonic() - began
            timed_out = code in TIMEOUT_CODES and elapsed >= timeout * 0.9
            if judge or timed_out:  # a judge leaves nothing behind
                self._cgroups.kill(group)
            out, err = reader.result(), errors.result()
            _close_pipes(proc)
        finally:
            self._cgroups.release(group)
        if code == 125 and not out:
            raise SandboxError(f"bwrap sandbox: cannot join its cgroup: {err.decode()[:200]}")
        if self._closed:
            raise SandboxError("bwrap sandbox closed during a command")
        return code, out, err, elapsed

    def run(self, script: str, timeout: float) -> RunResult:
        return self.exec(["bash", "-c", script], timeout)

    def open_terminal(self) -> FdIO:
        """``bash --login`` on a pty of its own, ``TERM=xterm`` (as a ``docker exec``
        with a tty), in a cgroup of its own; the pty's master side stays here."""
        self._check_open()
        master, slave = os.openpty()
        group = self._cgroups.command()
        try:
            command = self._enter(_LOGIN_SHELL, env=("TERM=xterm",))
            pty = {"stdin": slave, "stdout": slave, "stderr": slave}
            proc = self._popen(command, self._cgroups.joined(group), **pty)
        except BaseException:
            os.close(master)
            self._cgroups.release(group)
            raise
        finally:
            os.close(slave)

        def close() -> None:
            _kill_group(proc)
            self._cgroups.kill(group)
            proc.wait()
            os.close(master)
            self._cgroups.release(group)

        return FdIO(master, close)

    def start_background(self, script: str) -> None:
        self._check_open()
        group = self._cgroups.command()
        proc = self._popen(self._enter(background_command(script)), self._cgroups.joined(group))
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            self._cgroups.kill(group)
            proc.communicate()
            raise SandboxError("bwrap sandbox: a background start hung") from exc
        finally:
            _close_pipes(proc)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("bwrap sandbox is closed")
        if self._init is not None and self._init.poll() is not None:
            raise SandboxError(f"bwrap sandbox died (exit {self._init.returncode})")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._init is not None:
            if self._pid:  # the outer bwrap reaps its init, then exits
                _kill(self._pid)
            try:
                self._init.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(self._init)
                self._init.communicate()
        self._cgroups.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _CappedReader:
    """Reads a pipe to its end in a thread, keeping the first ``cap`` bytes."""

    def __init__(self, pipe, cap: int) -> None:
        self._pipe, self._cap, self._data = pipe, cap, bytearray()
        self._thread = threading.Thread(target=self._read, name="bwrap-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while chunk := self._pipe.read1(65536):
            if len(self._data) < self._cap:
                self._data += chunk[: self._cap - len(self._data)]

    def result(self) -> bytes:
        self._thread.join(timeout=10)  # the writers are gone: EOF is near
        return bytes(self._data)


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # the process is not there (yet or any more)
        return False


def _read_info(fd: int, deadline: float) -> dict | None:
    """bwrap's ``--info-fd`` JSON (it holds ``child-pid``), or None if bwrap exited first."""
    data = b""
    decoder = json.JSONDecoder()
    os.set_blocking(fd, False)
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        if not chunk:
            return None
        data += chunk
        try:
            info, _ = decoder.raw_decode(data.decode().strip())
        except ValueError:
            continue
        return info
    return None


@functools.cache
def open_files_limit(wanted: int) -> int:
    """The open-file limit sessions get: ``wanted``, at most the kernel's ``fs.nr_open``,
    and at most this process's own hard limit when it cannot raise it (no
    ``CAP_SYS_RESOURCE``: a container), which is logged once."""
    with contextlib.suppress(OSError, ValueError):  # no /proc/sys: no kernel cap to apply
        wanted = min(wanted, int(_NR_OPEN.read_text()))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= wanted or _has_capability(_CAP_SYS_RESOURCE):
        return wanted
    log.warning(
        "the os sandbox's open-file limit stays at this worker's hard limit: raising it "
        "needs CAP_SYS_RESOURCE (an item that opens a descriptor above it fails)",
        limit=hard,
        wanted=wanted,
    )
    return hard


def _has_capability(number: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> number & 1)
    return False


def _child_of(pid: int) -> int:
    """The host pid of ``pid``'s only child (bwrap's init has one: the session's first
    process)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError as exc:
        raise SandboxError(f"bwrap sandbox: cannot find its first process: {exc}") from exc
    if len(children) != 1:
        raise SandboxError(f"bwrap sandbox: its init has {len(children)} children, not 1")
    return int(children[0])


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone is what we want
        os.kill(pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
