"""What a bwrap session's machine holds: its ``/etc``, its tree, and the judge's tree.

`prepare_template` writes the files a session starts with (copied onto its tmpfs
by `agentrl.environments.tasks.os.launch`); `bwrap_argv` is the bubblewrap command
line that builds, inside the launcher's namespaces, two views of one machine:

- the agent's (``/``): the session's overlay ``/usr`` (writable, its own), the
  ``/bin``, ``/lib``... links of a merged-usr host, private writable ``/etc``,
  ``/root``, ``/home``, ``/tmp``, ``/var``, ``/run``, ``/opt``, ``/srv``, ``/mnt``
  and ``/usr/local``; its own ``/proc`` (``/proc/sys`` read-only) and ``/dev``;
- the judge's (`JUDGE_ROOT`, read-only at its top): the same files, except that the
  program folders of ``/usr`` (`PRISTINE`), ``/usr/local/lib``, the loader's
  ``/etc/ld.so.*`` and ``nsswitch.conf`` and Python's ``/etc/python3*`` are the
  host's, read-only. A program run there (a check script, or the ``setpriv`` that
  lowers every command's capabilities) loads nothing the agent wrote.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agentrl.environments.tasks.os.launch import LOWER, MOUNT_POINT
from agentrl.environments.tasks.os.sandbox import JUDGE_PATH

__all__ = [
    "CAPS",
    "ETC_DIRS",
    "ETC_FILES",
    "JUDGE_PATH",
    "JUDGE_ROOT",
    "PATH",
    "PRISTINE",
    "bwrap_argv",
    "prepare_template",
]

ETC_FILES = (
    "passwd", "group", "login.defs", "nsswitch.conf", "profile", "bash.bashrc",
    "ld.so.cache", "ld.so.conf", "localtime", "timezone", "environment", "hosts",
    "inputrc", "shells", "adduser.conf", "deluser.conf",
)  # fmt: skip
"""Host ``/etc`` files copied into each session (those that exist), writable there.
``shadow`` and ``gshadow`` are generated (`_shadow`), never the host's."""
ETC_DIRS = (
    "alternatives", "default", "skel", "profile.d", "pam.d", "security", "ld.so.conf.d",
)  # fmt: skip
"""Host ``/etc`` folders copied into each session (those that exist)."""
WRITABLE = ("root", "home", "tmp", "var", "run", "opt", "srv", "mnt", "usr/local")
CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "audit_write", "setfcap",
)  # fmt: skip
"""What a session's root keeps: Docker's default set without ``mknod``. A command also
keeps ``sys_chroot`` (its way from the judge's view into the agent's), a judge
``sys_ptrace`` instead (no agent process can then trace it)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JUDGE_ROOT = "/.judge"
PRISTINE = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec", "share")
"""The folders of ``/usr`` the judge sees as the host has them."""
_LINKS = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")
_HOST_ETC = ("ld.so.cache", "nsswitch.conf")


def _shadow(names: list[str], group: bool) -> str:
    """Locked entries for every user (or group): no password of the host's leaks in."""
    if group:
        return "".join(f"{name}:*::\n" for name in names)
    return "".join(f"{name}:*:19000:0:99999:7:::\n" for name in names)


def _names(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line.split(":", 1)[0] for line in path.read_text().splitlines() if ":" in line]


def prepare_template(root: Path) -> None:
    """Write the session's starting files under ``root`` (the launcher copies them)."""
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
    for entry in ETC_DIRS:
        source = Path("/etc") / entry
        if source.is_dir():
            shutil.copytree(source, etc / entry, symlinks=True)
    (etc / "shadow").write_text(_shadow(_names(etc / "passwd"), group=False))
    (etc / "gshadow").write_text(_shadow(_names(etc / "group"), group=True))
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o640)
    (etc / "hostname").write_text("sandbox\n")


def _links(prefix: str, usr: str) -> list[str]:
    """The host's top-level ``/bin``, ``/lib``... under ``prefix`` (links to ``usr``)."""
    argv: list[str] = []
    for link in _LINKS:
        host = Path("/") / link
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"{prefix}/{link}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"{prefix}/{link}"]
    return argv


def _judge_argv() -> list[str]:
    disk, judge = MOUNT_POINT + "/fs", JUDGE_ROOT
    argv = ["--tmpfs", judge, "--bind", MOUNT_POINT + "/usr", f"{judge}/usr"]
    for sub in PRISTINE:
        if (Path("/usr") / sub).is_dir() and not (Path("/usr") / sub).is_symlink():
            argv += ["--ro-bind", f"{LOWER}/{sub}", f"{judge}/usr/{sub}"]
    argv += _links(judge, "usr")
    for sub in WRITABLE:
        argv += ["--bind", f"{disk}/{sub}", f"{judge}/{sub}"]
    argv += ["--ro-bind", MOUNT_POINT + "/empty", f"{judge}/usr/local/lib"]
    argv += ["--bind", f"{disk}/etc", f"{judge}/etc"]
    argv += ["--ro-bind", "/dev/null", f"{judge}/etc/ld.so.preload"]
    for name in _HOST_ETC:
        if (Path("/etc") / name).is_file():
            argv += ["--ro-bind", f"/etc/{name}", f"{judge}/etc/{name}"]
    for entry in sorted(Path("/etc").glob("python3*")):
        if entry.is_dir():
            argv += ["--ro-bind", str(entry), f"{judge}/etc/{entry.name}"]
    argv += ["--proc", f"{judge}/proc", "--dev", f"{judge}/dev", "--remount-ro", judge]
    return argv


_HOST_PROC = ("sys", "sysrq-trigger", "pressure", "irq", "bus", "fs", "driver", "acpi", "scsi")
"""What of ``/proc`` is the host's rather than the session's processes': read-only."""
_INIT = (
    # read-only in both views (the user namespace already keeps the host's settings out
    # of reach; the namespaced ones are frozen too), then a wait without capabilities.
    "for p in "
    + " ".join(f"/proc/{p} {JUDGE_ROOT}/proc/{p}" for p in _HOST_PROC)
    + "; do [ -e $p ] || continue; "
    "mount --bind $p $p && mount -o remount,bind,ro,nosuid,nodev,noexec $p || exit 1; done; "
    "touch /run/.agentrl-ready; "
    "exec setpriv --inh-caps=-all --bounding-set=-all sleep infinity"
)
OUTPUT_MB = 8
"""Size of ``/run/agentrl`` (commands' output files, the agent's shell state): a tmpfs of
its own, so a full disk quota does not swallow the observation saying so."""


def bwrap_argv(info_fd: int) -> list[str]:
    """The bubblewrap command line the launcher runs as the session's root (module doc)."""
    disk = MOUNT_POINT + "/fs"
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    argv += ["--hostname", "sandbox", "--bind", MOUNT_POINT + "/usr", "/usr"]
    argv += _links("", "usr")
    argv += ["--bind", f"{disk}/etc", "/etc"]
    for sub in WRITABLE:
        argv += ["--bind", f"{disk}/{sub}", f"/{sub}"]
    argv += ["--size", str(OUTPUT_MB << 20), "--tmpfs", "/run/agentrl"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += _judge_argv()
    argv += ["--chdir", "/root", "--clearenv", "--setenv", "PATH", PATH]
    argv += ["--setenv", "HOME", "/root"]
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN"]
    argv += ["--info-fd", str(info_fd), "bash", "-c", _INIT]
    return argv
