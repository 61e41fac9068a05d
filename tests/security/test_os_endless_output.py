"""Red team, os task on bwrap: a command's output of any shape is bounded in time.

Attack class: output the terminal shell cannot frame. A command that writes forever
(one endless line, endless lines, binary, escapes and ``@`` that the prompt's pattern
backtracks on) must come back at its time limit: the episode ends
``task_limit_reached`` (AgentBench's ``TimeoutError``) and the command's processes
die with the session.
"""

from __future__ import annotations

import time

import pytest

from agentrl.environments import make_task
from tests.security.hostile import MARK, host_pids, needs_bwrap, say

pytestmark = needs_bwrap

SHAPES = {
    "one-endless-line": "cat /dev/zero | tr '\\0' a",
    "endless-lines": "yes",
    "binary": "cat /dev/urandom | tr -d '\\033'",  # no escape: no prompt by chance
    "escapes-and-ats": "yes $'\\x1b@' | tr -d '\\n'",
}
LIMIT = 3.0


@pytest.fixture(scope="module")
def env():
    return make_task("os", split="all", sandbox="bwrap", timeout=LIMIT)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_endless_output_ends_the_command_at_its_limit(env, shape):
    session = env.start(0).session
    tag = f"{MARK}-{shape}"
    began = time.monotonic()
    step = env.interact(session, say("bash_action", script=f": {tag}; {SHAPES[shape]}"))
    took = time.monotonic() - began
    assert step.finish and step.status.value == "task_limit_reached", step
    assert took < LIMIT + 5, took
    assert host_pids(tag) == []  # the shell that ran it is gone, and what it started
