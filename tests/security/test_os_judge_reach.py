"""Red team, os task on bwrap: a program the judge runs cannot reach the judge.

Attack class: an agent-written program that a check script runs (as a child of the
check's own shell) attacks that shell: it attaches with ``ptrace``, opens
``/proc/PPID/mem`` for writing, writes with ``process_vm_writev``, kills it, or leaves a
process behind. Every attempt must fail (the verdict stays: the program prints the wrong
text, the check fails), and nothing it started outlives the judge.
"""

from __future__ import annotations

import pytest

from agentrl.environments.tasks.os.sandbox import Limits, open_sandbox
from tests.security.hostile import needs_bwrap

pytestmark = needs_bwrap

PROGRAM = r"""#!/usr/bin/python3
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
judge = os.getppid()
log = open("/root/attempts", "a")
def note(what, ok):
    log.write("%s %s\n" % (what, "succeeded" if ok else "refused")); log.flush()
note("ptrace", libc.ptrace(16, judge, 0, 0) == 0)  # PTRACE_ATTACH
try:
    with open("/proc/%d/mem" % judge, "r+b"):
        note("mem", True)
except OSError:
    note("mem", False)
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
iov = Iov(ctypes.addressof(buf), 8)
libc.process_vm_writev.restype = ctypes.c_ssize_t
written = libc.process_vm_writev(judge, ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0)
note("process_vm_writev", written > 0 or ctypes.get_errno() == 14)  # EFAULT: let in
if os.fork() == 0:  # a process left behind, to attack what the judge runs next
    os.setsid()
    open("/root/left-behind", "w").write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
print("wrong")
"""


@pytest.fixture
def box():
    sandbox = open_sandbox("bwrap", limits=Limits(), label="redteam-reach")
    yield sandbox
    sandbox.close()


def test_a_program_the_judge_runs_cannot_trace_or_write_the_judge(box):
    written = box.run(f"cat > /root/prog <<'EOF'\n{PROGRAM}EOF\nchmod +x /root/prog", 10)
    assert written.exit_code == 0, written
    check = '[ "$(/root/prog)" = hello ]'
    verdict = box.judge(["/usr/bin/bash", "-c", check], 20)
    assert verdict.exit_code != 0, verdict
    attempts = box.run("cat /root/attempts", 10).output.split("\n")
    assert sorted(a for a in attempts if a) == [
        "mem refused",
        "process_vm_writev refused",
        "ptrace refused",
    ], (attempts, verdict)
    left = box.run('kill -0 "$(cat /root/left-behind)" && echo alive', 10).output
    assert "alive" not in left


def test_killing_the_judge_fails_the_check(box):
    box.run("printf '#!/bin/sh\\nkill -KILL $PPID\\necho hello\\n' > /root/k; chmod +x /root/k", 10)
    verdict = box.judge(["/usr/bin/bash", "-c", '[ "$(/root/k)" = hello ]; exit 0'], 20)
    assert verdict.exit_code != 0, verdict


def test_the_judge_still_runs_the_agents_programs(box):
    box.run("printf '#!/bin/sh\\necho hello\\n' > /root/ok; chmod +x /root/ok", 10)
    verdict = box.judge(["/usr/bin/bash", "-c", '[ "$(/root/ok)" = hello ]'], 20)
    assert verdict.exit_code == 0, verdict
    python = box.judge(
        ["/usr/bin/env", "A=1", "/usr/bin/python3", "-c", "import os; print(os.environ['A'])"], 20
    )
    assert (python.exit_code, python.output) == (0, "1\n"), python
