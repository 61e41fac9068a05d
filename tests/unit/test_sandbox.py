"""The bwrap sandbox of the os task: isolation, limits, cleanup (the docker backend's
twin is tests/integration/test_os_containers.py; both run tests/unit/sandbox_suite.py).

Needs bubblewrap (``apt-get install bubblewrap``) and root; skips without them.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from agentrl.environments.tasks.os.sandbox import (
    RunResult,
    SandboxError,
    choose_backend,
    docker_available,
    open_sandbox,
)
from tests.unit import sandbox_suite as suite

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="the bwrap sandbox needs bubblewrap installed (apt-get install bubblewrap) and root",
)


@pytest.fixture
def opener():
    opened = []

    def open_one():
        box = open_sandbox("bwrap", limits=suite.SMALL, label="test")
        opened.append(box)
        return box

    yield open_one
    for box in opened:
        box.close()


def test_writes_stay_inside_the_sandbox(opener):
    suite.writes_stay_inside(opener)
    box = opener()  # /usr is the session's overlay of the host's: writable, its own
    for path in ("/usr/bin/agentrl-x", "/usr/lib/agentrl-x"):
        assert box.run(f"echo x > {path} && rm -f /usr/bin/ls && cat {path}", 5).output == "x\n"
        assert not Path(path).exists() and Path("/usr/bin/ls").exists()
    other = opener()  # another session sees the host's /usr, not this one's
    assert other.run("ls /usr/bin/agentrl-x; ls /usr/bin/ls", 5).output.split("\n")[1:3] == [
        "/usr/bin/ls",
        "",
    ]
    # the session's /etc folders are copies: writing them leaves the host's alone
    assert box.run("echo x > /etc/alternatives/agentrl-x", 5).exit_code == 0
    assert not Path("/etc/alternatives/agentrl-x").exists()
    # no device nodes (a block device node would reach the host's disk) and no mounts
    assert box.run("mknod /root/disk b 8 0", 5).exit_code != 0
    assert box.run("mount -o remount,rw /usr", 5).exit_code != 0


def test_no_network_not_even_the_hosts_broker(opener):
    suite.no_network(opener)


def test_a_runaway_command_is_killed_at_the_time_limit(opener):
    suite.runaway_is_killed(opener)


def test_fork_bomb_and_memory_hog_are_contained(opener):
    suite.bombs_are_contained(opener)


def test_two_sessions_do_not_see_each_other(opener):
    suite.sessions_are_apart(opener)


def test_a_judge_s_output_is_its_stdout(opener):
    suite.judge_hands_over_stdout(opener)


def test_a_judge_over_its_time_limit_is_stopped(opener):
    suite.judge_is_stopped_at_its_limit(opener)


def test_find_walks_the_machine_quietly(opener):
    suite.find_walks_the_machine_quietly(opener)


def test_output_is_capped(opener):
    suite.output_is_capped(opener)


def test_close_kills_every_process_and_removes_the_files():
    box = open_sandbox("bwrap", limits=suite.SMALL, label="close")
    tag = uuid.uuid4().hex[:8]
    box.start_background(f"exec -a agentrl-bg-{tag} sleep 600")
    assert box.run("echo x > /root/f", 5).exit_code == 0
    init, files = box.init_pid, box._dir
    born = _start_time(init)
    assert born and files.exists()
    assert _host_pids(f"agentrl-bg-{tag}"), "the background process runs before close"
    box.close()
    box.close()  # idempotent
    deadline = time.monotonic() + 5
    while _host_pids(f"agentrl-bg-{tag}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _host_pids(f"agentrl-bg-{tag}") and _start_time(init) != born  # gone
    assert not files.exists()
    with pytest.raises(SandboxError):
        box.run("true", 1)


def test_exec_passes_arguments_verbatim(opener):
    box = opener()
    result = box.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME", ""], 5)
    assert result == RunResult(0, "['a b', '$HOME', '']\n", False)


def test_default_backend_is_bwrap_when_no_engine_answers(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/agentrl.sock")
    docker_available.cache_clear()
    try:
        assert choose_backend() == "bwrap"
    finally:
        docker_available.cache_clear()
    with pytest.raises(ValueError, match="sandbox must be one of"):
        open_sandbox("chroot")


def _start_time(pid: int) -> str:
    """The process's start time ("" when there is no such process): tells pid reuse apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def _host_pids(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_sandbox_that_cannot_start_leaves_no_descriptor(monkeypatch):
    from agentrl.environments.tasks.os.bwrap import BwrapSandbox

    def refuse(self, argv, groups, **kwargs):
        raise OSError("cannot run bwrap")

    monkeypatch.setattr(BwrapSandbox, "_popen", refuse)
    gc.collect()  # pipes of earlier tests' objects close now, not during the check
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="cannot run bwrap"):
        open_sandbox("bwrap", limits=suite.SMALL, label="nostart")
    assert sorted(os.listdir("/proc/self/fd")) == before
