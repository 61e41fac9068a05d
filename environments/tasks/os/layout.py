"""What a bwrap session's machine holds: its ``/etc``, its tree, and the judge's tree.

`prepare_template` writes the files a session starts with (copied onto its tmpfs
by `agentrl.environments.tasks.os.launch`); `bwrap_argv` is the bubblewrap command
line that builds, inside the launcher's namespaces, two views of one machine:

- the agent's (``/``): the session's disk (its tmpfs: whatever the agent writes at
  ``/``, ``/testfile`` too, is there, within the quota) holding private writable
  ``/etc``, ``/root``, ``/home``, ``/tmp``, ``/var``, ``/run``, ``/opt``, ``/srv``,
  ``/mnt``; the session's overlay ``/usr`` (writable, its own) with ``/usr/local``
  on the disk; ``/bin``, ``/lib``... of a merged-usr host as folders bound to the
  overlay's (not links: a link on the disk is the agent's to replace, a mount point
  is not); the package database ``/var/lib/dpkg`` an overlay of the host's; its own
  ``/proc`` (``/proc/sys`` read-only, ``/proc/tty/driver`` empty) and ``/dev``;
- the judge's (`JUDGE_ROOT`, read-only at its top, which is the agent's ``/``): the
  same files, except that the program folders of ``/usr`` (`PRISTINE`), ``/bin``,
  ``/lib``..., ``/usr/local/lib``, the loader's ``/etc/ld.so.*`` and ``nsswitch.conf``
  and Python's ``/etc/python3*`` are the host's, read-only. A program run there (a
  check script, or the ``setpriv`` that lowers every command's capabilities) loads
  nothing the agent wrote. Once built, the judge's view is covered in the agent's
  (an empty ``/.judge``: ``find /`` does not walk it) and reached through a
  descriptor the session's first process holds (`JUDGE_FD`).
"""

from __future__ import annotations

import grp
import os
import shutil
from pathlib import Path

from agentrl.environments.tasks.os.launch import LOWER, MOUNT_POINT, NOTHING, OVERLAYS
from agentrl.environments.tasks.os.sandbox import JUDGE_PATH

__all__ = [
    "CAPS",
    "ETC_DIRS",
    "ETC_FILES",
    "JUDGE_FD",
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
    "inputrc", "shells", "adduser.conf", "deluser.conf", "os-release", "lsb-release",
    "debian_version", "issue", "issue.net",
)  # fmt: skip
"""Host ``/etc`` files copied into each session (those that exist), writable there.
``shadow`` and ``gshadow`` are generated (`_shadow`), never the host's; ``mtab`` is the
link to ``/proc/self/mounts`` every system has."""
ETC_DIRS = (
    "alternatives", "default", "skel", "profile.d", "pam.d", "security", "ld.so.conf.d",
    "apt", "dpkg",
)  # fmt: skip
"""Host ``/etc`` folders copied into each session (those that exist; apt's ``auth.conf*``
credentials left out), and Python's ``/etc/python3*``."""
_NOT_COPIED = shutil.ignore_patterns("auth.conf", "auth.conf.d")
VAR_LOGS = (
    "alternatives.log", "bootstrap.log", "dpkg.log", "faillog", "apt/history.log",
    "apt/term.log",
)  # fmt: skip
"""The logs of a fresh Ubuntu image's ``/var/log``, empty (``wtmp``, ``btmp`` and
``lastlog`` too, group ``utmp``): none of the host's."""
_UTMP_LOGS = {"wtmp": 0o664, "btmp": 0o660, "lastlog": 0o664}
WRITABLE = ("root", "home", "tmp", "var", "run", "opt", "srv", "mnt", "usr/local")
"""Folders of the disk the judge may write too."""
CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "audit_write", "setfcap",
)  # fmt: skip
"""What a session's root keeps: Docker's default set without ``mknod``. A command also
keeps ``sys_chroot`` (its way from the judge's view into the agent's), and so does a judge
(a judge holding less than a process cannot read that process's ``/proc`` entries, and
`find /` would fail beside the agent's shell); a judge's first program (`guard.GUARD`)
``sys_admin``, which it drops before the judge runs."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JUDGE_COVER = "/.judge"
"""Where the judge's view is built (a tmpfs of its own), covered once built."""
JUDGE_ROOT = JUDGE_COVER + "/view"
"""The judge's view, below the cover's tmpfs: covering the view's own mount would stack
the cover on the view's root, and a judge's ``..`` would step into it."""
JUDGE_FD = 9
"""The descriptor of the judge's view the session's first process holds."""
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
    for name in (".bashrc", ".profile"):  # root's, as an Ubuntu image has them (the prompt)
        if (Path("/etc/skel") / name).is_file():
            shutil.copy2(Path("/etc/skel") / name, root / "root" / name)
    for sub in ("tmp", "log/apt", "lib/dpkg", "lib/apt/lists", "mail", "spool", "cache/apt"):
        (root / "var" / sub).mkdir(parents=True, exist_ok=True)
    (root / "var" / "tmp").chmod(0o1777)
    for name in VAR_LOGS:
        (root / "var/log" / name).touch()
    utmp = _group_id("utmp")
    for name, mode in _UTMP_LOGS.items():
        (root / "var/log" / name).touch(mode)
        (root / "var/log" / name).chmod(mode)
        os.chown(root / "var/log" / name, 0, utmp)
    for sub in ("bin", "sbin", "lib", "share", "include", "src"):
        (root / "usr/local" / sub).mkdir(exist_ok=True)
    etc = root / "etc"
    etc.mkdir()
    for entry in ETC_FILES:
        source = Path("/etc") / entry
        if source.is_file():
            shutil.copy2(source, etc / entry)
    for source in [Path("/etc") / e for e in ETC_DIRS] + sorted(Path("/etc").glob("python3*")):
        if source.is_dir():
            shutil.copytree(source, etc / source.name, symlinks=True, ignore=_NOT_COPIED)
    (etc / "mtab").symlink_to("../proc/self/mounts")
    (etc / "shadow").write_text(_shadow(_names(etc / "passwd"), group=False))
    (etc / "gshadow").write_text(_shadow(_names(etc / "group"), group=True))
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o640)
    (etc / "hostname").write_text("sandbox\n")


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return 0


def _links(prefix: str, usr: str, *, writable: bool) -> list[str]:
    """The host's top-level ``/bin``, ``/lib``... under ``prefix``: a merged-usr host's
    links as folders bound to those of ``usr`` (the session's overlay, or the host's
    read-only), a host's real folder read-only."""
    argv: list[str] = []
    for link in _LINKS:
        host = Path("/") / link
        if host.is_symlink():
            target = os.readlink(host).lstrip("/")
            if target.startswith("usr/") and (Path("/") / target).is_dir():
                bind = "--bind" if writable else "--ro-bind"
                argv += [bind, f"{usr}/{target[4:]}", f"{prefix}/{link}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"{prefix}/{link}"]
    return argv


def _overlays(prefix: str) -> list[str]:
    """The session's overlays of host folders other than ``/usr`` (`OVERLAYS`)."""
    return [
        arg
        for name, host in OVERLAYS.items()
        if name != "usr" and Path(host).is_dir()
        for arg in ("--bind", f"{MOUNT_POINT}/{name}", f"{prefix}{host}")
    ]


def _judge_argv() -> list[str]:
    disk, judge = MOUNT_POINT + "/fs", JUDGE_ROOT
    argv = ["--tmpfs", JUDGE_COVER, "--ro-bind", disk, judge]
    argv += ["--bind", MOUNT_POINT + "/usr", f"{judge}/usr"]
    for sub in PRISTINE:
        if (Path("/usr") / sub).is_dir() and not (Path("/usr") / sub).is_symlink():
            argv += ["--ro-bind", f"{LOWER}/{sub}", f"{judge}/usr/{sub}"]
    argv += _links(judge, LOWER, writable=False)
    for sub in WRITABLE:
        argv += ["--bind", f"{disk}/{sub}", f"{judge}/{sub}"]
    argv += ["--ro-bind", MOUNT_POINT + "/empty", f"{judge}/usr/local/lib"]
    argv += ["--bind", f"{disk}/etc", f"{judge}/etc"]
    argv += ["--ro-bind", NOTHING, f"{judge}/etc/ld.so.preload"]
    for name in _HOST_ETC:
        if (Path("/etc") / name).is_file():
            argv += ["--ro-bind", f"/etc/{name}", f"{judge}/etc/{name}"]
    for entry in sorted(Path("/etc").glob("python3*")):
        if entry.is_dir():
            argv += ["--ro-bind", str(entry), f"{judge}/etc/{entry.name}"]
    argv += _overlays(judge)
    argv += ["--proc", f"{judge}/proc", "--dev", f"{judge}/dev", "--remount-ro", judge]
    return argv


_HOST_PROC = ("sys", "sysrq-trigger", "pressure", "irq", "bus", "fs", "driver", "acpi", "scsi")
"""What of ``/proc`` is the host's rather than the session's processes': read-only."""
_HIDDEN = "mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=0{mode} agentrl-{name} {path}"
_INIT = (
    # read-only in both views (the user namespace already keeps the host's settings out
    # of reach; the namespaced ones are frozen too); the host's serial drivers (owned by
    # the host's root: unreadable, and noise in a `find /`) empty; the judge's view held
    # open, then covered; then a wait without capabilities.
    "for p in "
    + " ".join(f"/proc/{p} {JUDGE_ROOT}/proc/{p}" for p in _HOST_PROC)
    + "; do [ -e $p ] || continue; "
    "mount --bind $p $p && mount -o remount,bind,ro,nosuid,nodev,noexec $p || exit 1; done; "
    + " && ".join(
        _HIDDEN.format(mode=555, name="masked", path=f"{root}/proc/tty/driver")
        for root in ("", JUDGE_ROOT)
    )
    + " || exit 1; "
    + f"exec {JUDGE_FD}<{JUDGE_ROOT} || exit 1; "
    + _HIDDEN.format(mode=755, name="judge", path=JUDGE_COVER)
    + " || exit 1; touch /run/.agentrl-ready; "
    "exec setpriv --inh-caps=-all --bounding-set=-all sleep infinity"
)
OUTPUT_MB = 8
"""Size of ``/run/agentrl`` (commands' output files, the agent's shell state): a tmpfs of
its own, so a full disk quota does not swallow the observation saying so."""


SHM_MB = 64
"""Size of ``/dev/shm``, Docker's and podman's default: a tmpfs whose pages count against the
session's memory, so unbounded a full one left the session's memory limit reached for good
(every later command killed)."""


def bwrap_argv(info_fd: int) -> list[str]:
    """The bubblewrap command line the launcher runs as the session's root (module doc)."""
    disk = MOUNT_POINT + "/fs"
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    argv += ["--hostname", "sandbox", "--bind", disk, "/"]
    argv += ["--bind", MOUNT_POINT + "/usr", "/usr", "--bind", f"{disk}/usr/local", "/usr/local"]
    argv += _links("", MOUNT_POINT + "/usr", writable=True)
    argv += _overlays("")
    argv += ["--size", str(OUTPUT_MB << 20), "--tmpfs", "/run/agentrl"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(SHM_MB << 20), "--tmpfs", "/dev/shm"]
    argv += _judge_argv()
    argv += ["--chdir", "/root", "--clearenv", "--setenv", "PATH", PATH]
    argv += ["--setenv", "HOME", "/root"]
    # CAP_SETPCAP: the first process's setpriv empties its bounding set (a wait without
    # capabilities: its /proc entries read as the agent's processes' do)
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    argv += ["--info-fd", str(info_fd), "bash", "-c", _INIT]
    return argv
