"""The bwrap sandbox's launcher: its disk, its ``/usr`` and its user namespace, then bwrap.

Run as a program by `agentrl.environments.tasks.os.bwrap` (``python3 launch.py
CONFIG_JSON``), as host root, inside the session's cgroups; standard library only
(it runs before anything else of the session). In order:

1. a private mount namespace (the host's mounts untouched);
2. the session's disk: a tmpfs at `MOUNT_POINT` of ``disk_mb`` MiB and ``inodes``
   inodes (the disk quota: everything the session writes lives there, and it is
   gone with the namespace), holding the ``fs`` tree copied from ``template`` and
   owned by the session's root (host uid ``uid``);
3. ``/usr`` and ``/var/lib/dpkg`` (`OVERLAYS`): the host's, each through an id-mapped
   read-only mount (host root shows as the session's root; ``/usr``'s is `LOWER`), under
   an overlay whose upper layer is on the tmpfs;
4. a user namespace mapping ids 0..``count`` inside to ``uid``.. outside (written by a
   forked helper that stays host root), then ``exec`` of the bwrap command line as its
   root. Root in the sandbox is thus an unprivileged id on the host: the host's
   ``/proc/sys``, ``/sys`` and files are out of its reach whatever is mounted.

Paths inside the tmpfs only (``/mnt/...``) appear in the sandbox's mountinfo, not the
session's directory on the host. Failures print one line on stderr and exit 126.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys

MOUNT_POINT = "/mnt"
"""Where the session's tmpfs is mounted in the launcher's private mount namespace."""
LOWER = MOUNT_POINT + "/usr-lower"
"""The host's ``/usr``, id-mapped and read-only: the overlay's lower layer and the judge's."""
OVERLAYS = {"usr": "/usr", "dpkg": "/var/lib/dpkg"}
"""Host folders a session writes through an overlay of its own, by name: the merged view
is ``MOUNT_POINT/<name>`` (``/usr``: the programs; the package database that describes
them, so ``dpkg`` and ``apt`` see what is installed). Those the host lacks are left out."""
NOTHING = MOUNT_POINT + "/nothing"
"""An empty read-only file (the judge's ``/etc/ld.so.preload``)."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 1, 2, 4, 0x4000, 1 << 18
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # same on every arch
_OPEN_TREE_CLONE, _O_CLOEXEC, _AT_RECURSIVE, _AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or ''} {target}",
    )


def _idmapped_copy(source: str, target: str, userns_fd: int) -> None:
    """Mount ``source`` at ``target`` read-only, its ids seen through ``userns_fd``'s map."""
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE,
            -100,  # AT_FDCWD
            source.encode(),
            _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE,
        ),
        f"open_tree {source}",
    )
    try:
        attr = _MountAttr(
            _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV,
            0,
            0,
            userns_fd,
        )
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH | _AT_RECURSIVE,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            f"id-mapping {source} (kernel 5.12+ and a file system that allows it)",
        )
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", -100, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount {target}",
        )
    finally:
        os.close(tree)


def _chown_tree(root: str, uid: int) -> None:
    """Shift the owners under ``root`` from host ids to the session's (0 -> uid)."""
    for path, dirs, files in os.walk(root):
        for name in (os.path.join(path, n) for n in dirs + files):
            st = os.lstat(name)
            if st.st_uid < uid:  # each entry once
                os.lchown(name, uid + st.st_uid, uid + st.st_gid)


def _disk(config: dict) -> None:
    size = f"size={config['disk_mb']}m,nr_inodes={config['inodes']},mode=755"
    ids = f"uid={config['uid']},gid={config['uid']}"
    _mount("agentrl-disk", MOUNT_POINT, "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},{ids}")
    shutil.copytree(config["template"], MOUNT_POINT + "/fs", symlinks=True)
    for name in OVERLAYS:
        for sub in ("", "-upper", "-work", "-lower"):
            os.mkdir(f"{MOUNT_POINT}/{name}{sub}")
    os.mkdir(MOUNT_POINT + "/empty")
    with open(NOTHING, "x"):
        pass
    os.chmod(NOTHING, 0o444)
    _chown_tree(MOUNT_POINT, config["uid"])
    _mount("agentrl-empty", MOUNT_POINT + "/empty", "tmpfs", _MS_RDONLY, "size=4k,nr_inodes=8")


def _map_ids(pid: int, uid: int, count: int) -> None:
    """Write ``pid``'s uid and gid maps (0..count inside -> uid.. outside), then its
    overlays (`OVERLAYS`): this process is still host root in the launcher's mount
    namespace."""
    for kind in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{kind}", "w") as f:
            f.write(f"0 {uid} {count}\n")
    userns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for name, host in OVERLAYS.items():
            if os.path.isdir(host):
                _idmapped_copy(host, f"{MOUNT_POINT}/{name}-lower", userns)
    finally:
        os.close(userns)
    for name, host in OVERLAYS.items():
        if os.path.isdir(host):
            base = f"{MOUNT_POINT}/{name}"
            options = f"lowerdir={base}-lower,upperdir={base}-upper,workdir={base}-work"
            _mount(f"agentrl-{name}", base, "overlay", _MS_NOSUID, options)


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    try:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare mount namespace")
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
        _disk(config)
    except OSError as exc:
        print(f"agentrl-launch: {exc}", file=sys.stderr)
        return 126
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    parent = os.getpid()
    helper = os.fork()
    if helper == 0:  # stays host root: maps the parent's new namespace, mounts /usr
        os.close(go_write)
        os.close(done_read)
        status = 0
        try:
            if os.read(go_read, 1) == b"1":
                _map_ids(parent, config["uid"], config["count"])
                os.write(done_write, b"1")
        except OSError as exc:
            print(f"agentrl-launch: {exc}", file=sys.stderr)
            status = 126
        os._exit(status)
    os.close(go_read)
    os.close(done_write)
    try:
        _check(_libc.unshare(_CLONE_NEWUSER), "unshare user namespace")
    except OSError as exc:
        print(f"agentrl-launch: {exc}", file=sys.stderr)
        os.write(go_write, b"0")
        os.waitpid(helper, 0)
        return 126
    os.write(go_write, b"1")
    mapped = os.read(done_read, 1) == b"1"
    os.waitpid(helper, 0)
    if not mapped:
        return 126
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    command = config["command"]
    os.execvpe(command[0], command, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    return 126  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
