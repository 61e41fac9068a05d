"""Red team, os task on bwrap: the host's kernel, its secrets and its resources.

Attack classes, each played by the agent's own commands:

- host kernel and /proc writes: no file of ``/proc`` outside the agent's own processes,
  of ``/proc/sys`` or of ``/sys`` opens for writing; root inside is not root outside;
- host information: the session's host path is not in its mountinfo, ``/etc/shadow``
  holds no password of the host's;
- resources: the disk quota (bytes and inodes, in any writable folder), the CPU quota,
  the process limit, each answered with a clear observation while the worker goes on;
- the time limit: ``setsid``, ``nohup``, double-forked and daemonised children die at
  the command's time limit, and whatever a command left running dies with the episode.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._protocol import Status
from agentrl.environments.tasks.os.layout import SHM_MB
from agentrl.environments.tasks.os.sandbox import Limits, open_sandbox
from tests.security.hostile import data_file, host_pids, needs_bwrap, say

pytestmark = needs_bwrap

LIMITS = Limits(memory_mb=128, pids=64, disk_mb=32, cpus=0.25)


@pytest.fixture
def box():
    sandbox = open_sandbox("bwrap", limits=LIMITS, label="redteam")
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return make_task(
        "os",
        data=data_file(tmp_path_factory.mktemp("os")),
        split="all",
        sandbox="bwrap",
        timeout=2,
        shell="fresh",
        timeout_ends=False,  # the command is killed and the episode goes on
        memory_mb=128,
        pids=64,
        disk_mb=32,
    )


# --- the host's kernel ------------------------------------------------------------

_WRITABLE = r"""
import os, sys
found = []
for top in sys.argv[1:]:
    for path, dirs, files in os.walk(top):
        parts = path.split("/")
        if len(parts) > 2 and parts[1] == "proc" and (parts[2].isdigit() or "self" in parts[2]):
            dirs[:] = []  # the agent's own processes: theirs to change
            continue
        for name in files:
            full = os.path.join(path, name)
            if os.path.islink(full):  # mounts, net...: links to the process's own files
                continue
            if os.stat(full).st_rdev == os.makedev(1, 3):  # masked: /dev/null in its place
                continue
            try:
                os.close(os.open(full, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue
            found.append(full)
print("\n".join(found))
"""


def test_nothing_of_the_hosts_kernel_opens_for_writing(box):
    # open for writing only (nothing is written): every file of /proc but the processes'
    found = box.exec(["python3", "-c", _WRITABLE, "/proc", "/sys"], 60)
    assert found.exit_code == 0 and found.output.strip() == "", found.output[:2000]


def test_kernel_settings_written_from_inside_leave_the_host_alone(box):
    before = {p: Path(p).read_text() for p in _SETTINGS}
    script = " ; ".join(f"echo '|/nonexistent/agentrl-redteam %p' > {p}" for p in _SETTINGS)
    script += " ; echo 3 > /proc/sys/vm/drop_caches ; sysctl -w kernel.pid_max=99"
    script += " ; mount -t sysfs sysfs /mnt ; mount -t proc proc /mnt"
    try:
        box.run(script, 10)
        assert {p: Path(p).read_text() for p in _SETTINGS} == before
    finally:  # a sandbox that lets it through must not leave the host changed
        for path, value in before.items():
            if Path(path).read_text() != value:
                Path(path).write_text(value)


_SETTINGS = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/hostname",
    "/proc/sys/vm/swappiness",
)


def test_root_inside_is_an_unprivileged_id_outside(box):
    mapping = box.run("cat /proc/self/uid_map /proc/self/gid_map", 5).output.split()
    assert len(mapping) == 6 and mapping[0] == "0" and mapping[3] == "0", mapping
    assert mapping[1] != "0" and mapping[4] != "0", mapping  # root maps to a plain id
    # and the host agrees: the sandbox's processes are not root here
    tag = f"{MARK_PREFIX}-{uuid.uuid4().hex[:8]}"
    box.start_background(f"exec -a {tag} sleep 60")
    pids = _wait_for(tag)
    status = Path(f"/proc/{pids[0]}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert "0" not in uids, status


# --- the host's information -------------------------------------------------------


def test_the_sessions_host_path_and_the_hosts_passwords_stay_outside(box):
    info = box.run("cat /proc/self/mountinfo /proc/1/mountinfo", 5).output
    assert str(box._dir) not in info and "/tmp/" not in info, info
    shadow = box.run("cat /etc/shadow /etc/gshadow", 5).output
    assert shadow, "a generated /etc/shadow exists (useradd and passwd need it)"
    host = Path("/etc/shadow").read_text() if Path("/etc/shadow").exists() else ""
    assert shadow != host
    for line in shadow.splitlines():
        assert line.split(":")[1] in ("*", "!", "!*", ""), line  # no hash from anywhere
    environ = box.run("tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ", 5)
    names = {line.split("=", 1)[0] for line in environ.output.splitlines() if line}
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD"}, names


def test_the_judges_view_is_covered_and_read_only(box):
    """The judge's view is covered in the agent's tree (an empty, read-only /.judge, which
    a `find /` does not walk); through the first process's descriptor it can be reached,
    and nothing of it the judge trusts can be written."""
    seen = box.run(
        "ls -A /.judge; touch /.judge/x 2>/dev/null && echo WROTE; "
        "for p in /proc/[0-9]*; do [ -e $p/fd/9/usr/bin ] && v=$p/fd/9; done; "
        "echo view=${v:+found}; for f in usr/bin/python3 usr/lib/x lib64/x etc/ld.so.preload "
        "etc/ld.so.cache etc/nsswitch.conf usr/local/lib/x x; do "
        ": 2>/dev/null > $v/$f && echo WROTE $f; done; "
        "mount -o remount,rw $v 2>/dev/null && echo REMOUNTED; echo end",
        10,
    )
    assert seen.output == "view=found\nend\n", seen
    quiet = box.run("find / -name agentrl-nothing", 60)  # as in a container: no noise
    assert (quiet.exit_code, quiet.output) == (0, ""), quiet
    assert box.judge(["/usr/bin/test", "-x", "/usr/bin/python3"], 10).exit_code == 0


# --- resources ----------------------------------------------------------------------


def test_the_disk_quota_holds_in_every_writable_folder(box):
    for folder in ("/", "/root", "/tmp", "/usr", "/var/log", "/var/lib/dpkg", "/usr/local/bin"):
        result = box.run(f"dd if=/dev/zero of={folder}/fill bs=1M count=64 2>&1; sync", 20)
        assert "No space left on device" in result.output, (folder, result)
        assert box.run(f"rm -f {folder}/fill", 5).exit_code == 0
    files = box.run("i=0; while : > /tmp/f$i; do i=$((i+1)); done 2>&1; echo made $i", 30)
    assert "No space left on device" in files.output, files
    assert int(files.output.split()[-1]) <= LIMITS.inodes, files
    assert box.run("echo alive", 5).output == "alive\n"  # the session goes on


def test_memory_backed_folders_are_bounded_by_the_memory_limit(box):
    # /dev/shm is a tmpfs whose pages count against the session's memory: it is bounded
    # (64 MiB, as in Docker), so filling it is "no space left", never the memory limit
    # reached for good (unbounded, every later command of the session was killed)
    result = box.run(
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=1024 2>/dev/null; "
        "s=$(stat -c %s /dev/shm/fill 2>/dev/null || echo 0); echo size=$s",
        30,
    )
    found = re.search(r"size=(\d+)", result.output)
    assert found and int(found.group(1)) == SHM_MB << 20, result
    assert box.run("echo alive", 10).output.strip().endswith("alive")  # the session goes on
    box.run("rm -f /dev/shm/fill", 10)


BUSY = r"""
import os, subprocess, sys, time
loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
time.sleep(3)
ticks = 0
for loop in loops:
    fields = open(f"/proc/{loop.pid}/stat").read().rsplit(") ", 1)[1].split()
    ticks += int(fields[11]) + int(fields[12])  # utime + stime
    loop.kill()
print(ticks / os.sysconf("SC_CLK_TCK"))
"""
"""Four busy loops for 3 s of wall time; prints the CPU seconds they got together."""


def test_the_cpu_quota_holds(box):
    # without a quota the loops take every core they can (2 to 6 CPU seconds here)
    used = float(box.exec(["python3", "-c", BUSY], 10).output.split()[-1])
    assert 0 < used <= LIMITS.cpus * 3 * 1.5 + 0.3, used


def test_the_process_limit_holds_and_says_so(env):
    session = env.start(0).session
    try:
        began = time.monotonic()
        fill = "for i in $(seq 200); do sleep 30 & done"
        for _ in range(2):  # the second command finds every process taken by the first
            step = env.interact(session, say("bash_action", script=fill))
            observation = step.messages[-1].content
            assert "limit of 64 processes was reached" in observation, observation
            assert not step.finish
        assert time.monotonic() - began < 20
        count = session.sandbox.judge(["/usr/bin/bash", "-c", "ls /proc | grep -c '^[0-9]'"], 10)
        assert count.exit_code != 0 or int(count.output) <= 64, count
    finally:
        env.cancel(session)


def test_a_full_disk_is_an_observation(env):
    session = env.start(0).session
    try:
        step = env.interact(
            session, say("bash_action", script="head -c 100000000 /dev/zero > /root/big")
        )
        assert "disk quota of 32 MB is full" in step.messages[-1].content, step
        assert not step.finish
    finally:
        env.cancel(session)


# --- the time limit -----------------------------------------------------------------

MARK_PREFIX = "agentrl-escape"
_ESCAPES = (
    "setsid bash -c 'exec -a {tag}-setsid sleep 300' & "
    "nohup bash -c 'exec -a {tag}-nohup sleep 300' >/dev/null 2>&1 & "
    "( ( exec -a {tag}-double sleep 300 & ) & ) ; "
    "python3 -c 'import os, sys\n"
    "if os.fork(): sys.exit()\n"
    "os.setsid()\n"
    "if os.fork(): sys.exit()\n"
    'os.execvp("bash", ["bash", "-c", "exec -a {tag}-daemon sleep 300"])\' ; '
)


def test_children_die_at_the_commands_time_limit(env):
    tag = f"{MARK_PREFIX}-{uuid.uuid4().hex[:8]}"
    session = env.start(0).session
    try:
        step = env.interact(
            session, say("bash_action", script=_ESCAPES.format(tag=tag) + "sleep 30")
        )
        assert "killed" in step.messages[-1].content, step
        assert host_pids(tag) == []
        assert not step.finish  # the episode goes on
    finally:
        env.cancel(session)


def test_children_die_with_the_episode(env):
    tag = f"{MARK_PREFIX}-{uuid.uuid4().hex[:8]}"
    session = env.start(0).session
    step = env.interact(session, say("bash_action", script=_ESCAPES.format(tag=tag) + "true"))
    assert not step.finish
    assert len(_wait_for(tag, count=4)) == 4  # a command that ends in time keeps its jobs
    assert env.interact(session, say("finish_action")).finish
    deadline = time.monotonic() + 5
    while host_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids(tag) == []


def test_a_terminals_processes_die_with_the_episode(tmp_path):
    """The ``terminal`` shell: what its commands start (setsid, nohup, double-forked,
    daemonised) dies when a command's time limit ends the episode; the worker keeps no
    descriptor of the ended sessions."""
    env = make_task(
        "os", data=data_file(tmp_path), split="all", sandbox="bwrap", timeout=2, pids=64
    )
    fds = len(list(Path("/proc/self/fd").iterdir()))
    for _ in range(2):
        tag = f"{MARK_PREFIX}-{uuid.uuid4().hex[:8]}"
        session = env.start(0).session
        step = env.interact(session, say("bash_action", script=_ESCAPES.format(tag=tag) + "true"))
        assert not step.finish and len(_wait_for(tag, count=4)) >= 4
        step = env.interact(session, say("bash_action", script="sleep 30"))
        assert (step.status, step.finish) == (Status.TASK_LIMIT_REACHED, True)
        deadline = time.monotonic() + 5
        while host_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids(tag) == []
    assert len(list(Path("/proc/self/fd").iterdir())) <= fds


def _wait_for(tag: str, count: int = 1) -> list[int]:
    deadline = time.monotonic() + 5
    while len(pids := host_pids(tag)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids
