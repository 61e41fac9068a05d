"""The container judge's precondition: the agent left the image's programs as they were.

In a container the agent is root over its whole file system, the programs a judge runs
included. Before and after a judge runs, `changed_programs` asks the engine (not a
program in the container) what the container changed under `PROTECTED` (``diff``),
and compares each changed file's content with the image's (``get_archive`` of the
container and of a created, never started, container of the image). A new or rewritten
program, library or loader file makes the judging fail; a ``chmod`` or ``chown`` (an
item may ask for one), a deleted file (the check then fails by itself) and new folders
do not.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

import docker
import docker.errors

__all__ = ["PROTECTED", "changed_programs"]

PROTECTED = (
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
    "/usr/libexec", "/usr/share", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/ld.so.preload", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/usr/local/lib", "/etc/python3*",
)  # fmt: skip
"""Where a judge's programs, libraries, loader settings and Python's site hooks come from
(``*``: any path beginning so)."""
_DELETED = 2


def _protected(path: str) -> bool:
    for top in PROTECTED:
        if top.endswith("*") and path.startswith(top[:-1]):
            return True
        if path == top or path.startswith(top + "/"):
            return True
    return False


def _entry(fetch, path: str) -> tuple | None:
    """(type, link target, content digest) of ``path``; ("dir",) for a folder, None when
    absent. ``fetch`` is a ``get_archive``."""
    try:
        stream, stat = fetch(path)
    except docker.errors.NotFound:
        return None
    if stat.get("isDir"):
        stream.close()
        return ("dir",)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        if member is None:
            return None
        data = tar.extractfile(member).read() if member.isfile() else b""
        return (member.type, member.linkname, hashlib.sha256(data).hexdigest())


def changed_programs(client: docker.DockerClient, container, image: str) -> list[str]:
    """The paths under `PROTECTED` whose content the container changed (module doc)."""
    suspects = [
        change["Path"]
        for change in container.diff() or []
        if _protected(change["Path"]) and change["Kind"] != _DELETED
    ]
    if not suspects:
        return []
    reference = client.api.create_container(image, command=["true"], network_disabled=True)
    try:
        changed = []
        for path in suspects:
            mine = _entry(container.get_archive, path)
            if mine == ("dir",):
                continue
            if mine != _entry(lambda p: client.api.get_archive(reference["Id"], p), path):
                changed.append(path)
        return changed
    finally:
        client.api.remove_container(reference["Id"], force=True)
