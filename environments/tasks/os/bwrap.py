"""`BwrapSandbox`: a session's private machine made with bubblewrap on the host.

Layout inside (everything else of the host is absent):

- ``/usr`` (and the ``/bin``, ``/lib``... links of a merged-usr system): the
  host's, under an overlay whose writable layer is the session's own (init
  scripts and the model may write ``/usr`` as in a container; the host's stays
  untouched): mounted in a private mount namespace (``unshare``) before bwrap
  starts, so it needs overlayfs and dies with the session;
- ``/etc``: a private copy of the host files a shell, ``python3``, ``useradd``
  and ``getent`` need (`ETC_FILES`) and a few host folders read-only
  (`ETC_DIRS`: alternatives, skel, pam.d...), nothing else of the host's ``/etc``;
- ``/root``, ``/home``, ``/tmp``, ``/var``, ``/run``, ``/opt``, ``/srv``,
  ``/mnt``, ``/usr/local``: private writable directories under a per-session
  directory on the host, deleted at close;
- its own ``/proc`` and ``/dev``; new pid, network (loopback only), ipc, uts
  and cgroup namespaces (``--unshare-all``), ``--die-with-parent``.

The session's first process (bwrap's init, a ``sleep``) holds the namespaces;
every command enters them with ``nsenter`` and runs as root with `CAPS` only
(no ``CAP_SYS_ADMIN``: it cannot mount or remount anything; no ``CAP_MKNOD``),
so background processes and files persist for the session as on a real machine.
Memory and process count are limited by a cgroup per session (v1 or v2, under
this process's own cgroup) when the cgroup filesystem is writable; otherwise by
``ulimit -v`` only (and no process limit: root is exempt from ``RLIMIT_NPROC``),
which is logged. Closing kills the init (the kernel then kills every process of
the pid namespace), every process left in the cgroup, and removes the session's
files.

Requires root on the host (the namespaces are entered with ``nsenter``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from agentrl.environments.tasks.os.sandbox import (
    Limits,
    RunResult,
    SandboxError,
    background_command,
    call_deadline,
    result_of,
    wrapped_command,
)

__all__ = ["ETC_FILES", "BwrapSandbox"]

log = structlog.get_logger(__name__)

ETC_FILES = (
    "passwd", "group", "shadow", "gshadow", "login.defs", "nsswitch.conf", "profile",
    "bash.bashrc", "ld.so.cache", "ld.so.conf", "localtime", "timezone", "environment",
    "hosts", "subuid", "subgid", "inputrc", "shells", "adduser.conf", "deluser.conf",
)  # fmt: skip
"""Host ``/etc`` files copied into each session (those that exist), writable there."""
ETC_DIRS = (
    "alternatives", "default", "skel", "profile.d", "pam.d", "security", "ld.so.conf.d",
)  # fmt: skip
"""Host ``/etc`` folders shown read-only in each session (those that exist)."""
WRITABLE = ("root", "home", "tmp", "var", "run", "opt", "srv", "mnt", "usr/local")
CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "audit_write", "setfcap",
)  # fmt: skip
"""What a session's root keeps: Docker's default set without ``mknod`` and
``sys_chroot`` (no devices cgroup guards the host's disks here)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_JOIN_CGROUPS = 'for g in $AGENTRL_CGROUPS; do echo $$ > "$g/cgroup.procs" || exit 125; done\n'


class BwrapSandbox:
    """One session's machine under bubblewrap; see the module doc."""

    def __init__(self, *, limits: Limits, label: str = "") -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._closed = False
        name = f"agentrl-{label or 'sbx'}-{uuid.uuid4().hex[:8]}"
        self._dir = Path(tempfile.mkdtemp(prefix=name + "-"))
        self._cgroups = _make_cgroups(name, limits)
        self._init: subprocess.Popen | None = None
        self._pid = 0
        try:
            self._prepare()
            self._start_init()
        except BaseException:
            self.close()
            raise

    @property
    def init_pid(self) -> int:
        """Host pid of the process holding the session's namespaces."""
        return self._pid

    def _prepare(self) -> None:
        root = self._dir / "fs"
        for sub in WRITABLE:
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        (root / "root").chmod(0o700)
        for sub in ("tmp", "log", "lib", "mail", "spool", "cache"):
            (root / "var" / sub).mkdir(exist_ok=True)
        (root / "var" / "tmp").chmod(0o1777)
        for sub in ("bin", "sbin", "lib", "share", "include", "src"):
            (root / "usr/local" / sub).mkdir(exist_ok=True)
        etc = root / "etc"
        etc.mkdir()
        for entry in ETC_FILES:
            source = Path("/etc") / entry
            if source.is_file():
                shutil.copy2(source, etc / entry)
        (etc / "hostname").write_text("sandbox\n")

    def _bwrap_argv(self, info_fd: int) -> list[str]:
        root = self._dir / "fs"
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        argv += ["--hostname", "sandbox", "--bind", str(self._dir / "usr"), "/usr"]
        for link in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
            host = Path("/") / link
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{link}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{link}"]
        argv += ["--bind", str(root / "etc"), "/etc"]
        for entry in ETC_DIRS:
            if (Path("/etc") / entry).is_dir():
                argv += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
        for sub in WRITABLE:
            argv += ["--bind", str(root / sub), f"/{sub}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--chdir", "/root"]
        argv += ["--clearenv", "--setenv", "PATH", PATH, "--setenv", "HOME", "/root"]
        argv += ["--cap-drop", "ALL"] + [a for c in CAPS for a in ("--cap-add", f"CAP_{c.upper()}")]
        argv += [
            "--info-fd",
            str(info_fd),
            "bash",
            "-c",
            "touch /run/.agentrl-ready; exec sleep infinity",
        ]
        return argv

    def _start_init(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            try:
                argv = self._overlay_usr() + self._bwrap_argv(write_fd)
                self._init = self._popen(argv, pass_fds=(write_fd,))
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
        ready = self._dir / "fs" / "run" / ".agentrl-ready"
        deadline = time.monotonic() + 15
        while not ready.exists():
            if self._init.poll() is not None or time.monotonic() > deadline:
                raise SandboxError("bwrap sandbox: its init process did not start")
            time.sleep(0.005)

    def _overlay_usr(self) -> list[str]:
        """The command prefix that makes the session's writable ``/usr`` before bwrap runs.

        An overlay of the host's ``/usr`` (read-only lower layer) with the session's
        own upper layer, mounted in a private mount namespace that only the
        sandbox's processes see: writes land in the session's directory, and the
        mount goes away with the namespace.
        """
        for sub in ("usr", "usr-upper", "usr-work"):
            (self._dir / sub).mkdir()
        mount = (
            'mount -t overlay agentrl-usr -o "lowerdir=/usr,upperdir=$1-upper,workdir=$1-work" '
            '"$1" || exit 126\nshift\nexec "$@"'
        )
        return [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", mount, "agentrl-usr", str(self._dir / "usr"),
        ]  # fmt: skip

    def _popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        env = {"PATH": PATH, "AGENTRL_CGROUPS": " ".join(str(c) for c in self._cgroups)}
        script = _JOIN_CGROUPS
        if not self._cgroups:
            script += f"ulimit -v {self._limits.memory_mb * 1024} 2>/dev/null\n"
        return subprocess.Popen(
            ["sh", "-c", script + 'exec "$@"', "agentrl-sandbox", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **kwargs,
        )

    def _enter(self, argv: Sequence[str]) -> list[str]:
        caps = ",".join(f"+{c}" for c in CAPS)
        return [
            "nsenter", "-t", str(self._pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w",
            "setpriv", "--inh-caps=-all", f"--bounding-set=-all,{caps}", "--",
            "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8", *argv,
        ]  # fmt: skip

    def exec(self, argv: Sequence[str], timeout: float) -> RunResult:
        self._check_open()
        command = self._enter(wrapped_command(argv, timeout, self._limits))
        began = time.monotonic()
        proc = self._popen(command)
        try:
            out, err = proc.communicate(timeout=call_deadline(timeout))
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            proc.communicate()
            raise SandboxError(f"bwrap sandbox: a command hung past {timeout:g} s") from exc
        if proc.returncode == 125 and not out:
            raise SandboxError(f"bwrap sandbox: cannot join its cgroup: {err.decode()[:200]}")
        if self._closed:
            raise SandboxError("bwrap sandbox closed during a command")
        return result_of(proc.returncode, out, time.monotonic() - began, timeout)

    def run(self, script: str, timeout: float) -> RunResult:
        return self.exec(["bash", "-c", script], timeout)

    def start_background(self, script: str) -> None:
        self._check_open()
        proc = self._popen(self._enter(background_command(script)))
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            proc.communicate()
            raise SandboxError("bwrap sandbox: a background start hung") from exc

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
        for cgroup in self._cgroups:
            _empty_and_remove(cgroup)
        shutil.rmtree(self._dir, ignore_errors=True)


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


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone is what we want
        os.kill(pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


# --- cgroups --------------------------------------------------------------------------

_CGROOT = Path("/sys/fs/cgroup")


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path for ``controller`` (v1) or in the v2 hierarchy ("")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return ""


def _make_cgroups(name: str, limits: Limits) -> list[Path]:
    """Per-session cgroups with the memory and pids limits; [] when cgroups are read-only."""
    made: list[Path] = []
    try:
        if (_CGROOT / "cgroup.controllers").exists():  # v2: one group, both limits
            own = Path(str(_CGROOT) + _own_cgroup(""))
            group = own / name
            group.mkdir()
            made.append(group)
            (group / "memory.max").write_text(str(limits.memory_mb << 20))
            (group / "memory.swap.max").write_text("0")
            (group / "pids.max").write_text(str(limits.pids))
        else:  # v1: one group per controller
            for controller, knob, value in (
                ("memory", "memory.limit_in_bytes", limits.memory_mb << 20),
                ("pids", "pids.max", limits.pids),
            ):
                group = Path(str(_CGROOT / controller) + _own_cgroup(controller)) / name
                group.mkdir()
                made.append(group)
                (group / knob).write_text(str(value))
    except OSError as exc:
        for group in made:
            _empty_and_remove(group)
        log.warning("no cgroup limits for the bwrap sandbox", reason=str(exc))
        return []
    return made


def _empty_and_remove(group: Path) -> None:
    """Kill what is left in ``group`` and remove it (retried while processes exit)."""
    for _ in range(100):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        for pid in pids:
            _kill(pid)
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.02)
    log.warning("a sandbox cgroup could not be removed", cgroup=str(group))
