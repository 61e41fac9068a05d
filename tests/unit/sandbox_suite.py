"""Isolation checks every sandbox backend must pass (bwrap in unit, docker in integration).

Each check takes ``opener``: a function opening a fresh sandbox with small
limits (128 MiB, 64 processes); the caller's fixture closes what it opened.
"""

from __future__ import annotations

import hashlib
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from agentrl.environments.tasks.os.sandbox import Limits, Sandbox

SMALL = Limits(memory_mb=128, pids=64, disk_mb=64)
Opener = Callable[[], Sandbox]

_CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
    "except OSError as exc:\n"
    "    print('refused:', exc); sys.exit(1)\n"
    "print('connected')\n"
)


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def writes_stay_inside(opener: Opener) -> None:
    marker = f"agentrl-escape-{uuid.uuid4().hex[:8]}"
    passwd = _digest("/etc/passwd")
    box = opener()
    script = (
        f"echo x > /tmp/{marker} && echo x > /root/{marker} && "
        f"echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && useradd {marker[-8:]}u && "
        f"cat /tmp/{marker} /root/{marker} && grep -c evil /etc/passwd"
    )
    result = box.run(script, 10)
    assert result.exit_code == 0, result
    assert result.output.split() == ["x", "x", "1"]
    # the session's /usr is writable, as in a container (init scripts write it), its own
    inside = box.run(f"echo x > /usr/bin/{marker} && cat /usr/bin/{marker}", 5)
    assert (inside.exit_code, inside.output) == (0, "x\n"), inside
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/root/{marker}").exists()
    assert not Path(f"/usr/bin/{marker}").exists()
    assert _digest("/etc/passwd") == passwd  # the host's users are untouched


def no_network(opener: Opener) -> None:
    box = opener()
    for host, port in (("127.0.0.1", 5672), ("1.1.1.1", 53), ("10.0.2.2", 80)):
        result = box.exec(["python3", "-c", _CONNECT, host, str(port)], 10)
        assert result.exit_code == 1 and "refused:" in result.output, (host, result)


def host_broker_answers() -> bool:
    """True when the host's RabbitMQ listens (so the sandbox's refusal means isolation)."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


def runaway_is_killed(opener: Opener) -> None:
    box = opener()
    began = time.monotonic()
    result = box.run("echo started; sleep 61; echo never", 1.0)
    assert result.timed_out and result.output == "started\n", result
    assert time.monotonic() - began < 5
    # its children died with it, and the sandbox still answers
    after = box.run("pgrep -f 'sleep 6[1]' || echo none", 5)
    assert after.output.strip() == "none", after
    # a job left in the background neither holds the call nor dies with it
    began = time.monotonic()
    assert box.run("sleep 300 & echo bg", 5).output == "bg\n"
    assert time.monotonic() - began < 3
    assert box.run("pgrep -cf 'sleep 30[0]'", 5).output.strip() == "1"


def bombs_are_contained(opener: Opener) -> None:
    box = opener()
    hog = box.exec(["python3", "-c", "x = bytearray(400 * 2**20); print('allocated')"], 10)
    assert hog.exit_code != 0 and "allocated" not in hog.output, hog
    began = time.monotonic()
    bomb = box.run("bomb() { bomb | bomb; }; bomb", 3)
    assert bomb.timed_out or bomb.exit_code != 0, bomb
    assert time.monotonic() - began < 10
    # the limit held (the host and this test still run) and the sandbox recovers
    assert box.run("echo alive", 10).output == "alive\n"
    count = box.run("ls /proc | grep -c '^[0-9]'", 10)
    assert int(count.output) <= SMALL.pids


def sessions_are_apart(opener: Opener) -> None:
    first, second = opener(), opener()
    assert first.run("echo one > /root/mine; sleep 300 &", 5).exit_code == 0
    seen = second.run("cat /root/mine 2>&1; pgrep -cf 'sleep 30[0]'", 5).output
    assert "No such file" in seen and seen.split()[-1] == "0", seen
    assert first.run("cat /root/mine; pgrep -cf 'sleep 30[0]'", 5).output == "one\n1\n"


def output_is_capped(opener: Opener) -> None:
    box = opener()
    result = box.run("head -c 1000000 /dev/zero | tr '\\0' a", 10)
    assert result.exit_code == 0 and len(result.output) == SMALL.output_bytes


def judge_hands_over_stdout(opener: Opener) -> None:
    """A judge's output is its stdout, its stderr apart: AgentBench's
    ``execute_independent`` returns them apart and passes stdout to the next check
    (``os_interaction/task.py``, ``_evaluate_by_check_scripts``)."""
    box = opener()
    script = "echo out; echo err >&2; echo more; exit 3"
    seen = box.judge(["/usr/bin/bash", "-c", script], 10)
    assert (seen.exit_code, seen.output, seen.errors) == (3, "out\nmore\n", "err\n")
    assert box.run(script, 10).output == "out\nerr\nmore\n"  # a command's: both, in order


def judge_is_stopped_at_its_limit(opener: Opener) -> None:
    """A judge over its time limit is stopped, with what it started, and says so."""
    box = opener()
    began = time.monotonic()
    seen = box.judge(["/usr/bin/bash", "-c", "sleep 30 & sleep 30"], 1)
    assert seen.timed_out and time.monotonic() - began < 10, seen
    assert "sleep 30" not in box.run("ps -eo args", 10).output


def find_walks_the_machine_quietly(opener: Opener) -> None:
    """`find /` reads everything as AgentBench's root does in its container: no error, exit
    0, for the agent and for a judge (an item's example `find / -name X` is judged), also
    while the agent's terminal shell is open (its /proc entries included)."""
    box = opener()
    seen = box.run("find / -name agentrl-nothing", 60)
    assert (seen.exit_code, seen.output) == (0, ""), seen
    judged = box.judge(["/usr/bin/bash", "-c", "find / -name agentrl-nothing"], 60)
    assert (judged.exit_code, judged.output, judged.errors) == (0, "", ""), judged
    terminal = box.open_terminal()  # the agent's shell, alive beside the judge
    try:
        judged = box.judge(["/usr/bin/bash", "-c", "find / -name agentrl-nothing"], 60)
        assert (judged.exit_code, judged.output, judged.errors) == (0, "", ""), judged
    finally:
        terminal.close()
