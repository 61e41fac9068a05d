"""The os task's terminal framing (`tasks.os.terminal`) against a scripted terminal.

Expected values follow agentrl-worker 0.4.0 (``environment/docker.py``: ``execute_shell``
drops the stream's first message and reads until ``SHELL_PROMPT_RE``,
``environment/_const.py``) and AgentBench's ``os_interaction/task.py`` lines 64-78
(``Container.execute``'s substitutions). The bytes are what bash 5.2 writes on a terminal
under ``TERM=xterm`` with Debian's or Ubuntu's ``~/.bashrc``.
"""

from __future__ import annotations

import time

import pytest

from agentrl.environments.tasks.os import terminal as terminal_module
from agentrl.environments.tasks.os.sandbox import SandboxError
from agentrl.environments.tasks.os.terminal import UNDECODABLE, Terminal, clean

PROMPT = b"\x1b[?2004h\x1b]0;root@sandbox: ~\x07root@sandbox:~# "
OFF = b"\x1b[?2004l\r"


class ScriptedIO:
    """A terminal that answers each written command with the chunks given for it."""

    def __init__(self, first: list[bytes], replies: dict[bytes, list[bytes | None]]) -> None:
        self.pending = list(first)
        self.replies = replies
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self.pending += self.replies.get(data, [])

    def read(self, timeout: float) -> bytes | None:
        if self.pending:
            return self.pending.pop(0)
        time.sleep(min(timeout, 0.01))  # a terminal that writes nothing: its wait, bounded
        return b""

    def close(self) -> None:
        self.closed = True


def _terminal(replies: dict[bytes, list[bytes | None]]) -> Terminal:
    terminal = Terminal(ScriptedIO([PROMPT[:20], PROMPT[20:]], replies))
    terminal.open()  # the first prompt, split across two reads
    return terminal


def test_the_echo_is_dropped_and_the_output_read_up_to_the_prompt():
    terminal = _terminal({b"ls\n": [b"ls\r\n", OFF + b"a  \x1b[01;34mb\x1b[0m\r\n" + PROMPT]})
    out = terminal.run("ls", 5)
    # colours and the bracketed-paste sequences go, its "\r" stays; lines end "\r\n"
    assert (out.text, out.timed_out, out.ended) == ("\ra  b\r\n", False, False)


def test_a_prompt_split_across_reads_is_found():
    reply = b"echo hi\r\n" + OFF + b"hi\r\n" + PROMPT
    terminal = _terminal({b"echo hi\n": [reply[:5], reply[5:30], reply[30:50], reply[50:]]})
    assert terminal.run("echo hi", 5).text == "\rhi\r\n"


def test_what_follows_the_prompt_is_the_next_commands():
    """A script of two lines: the shell runs them one by one, a prompt after each; the
    first is the observation, the second comes with the next command, as AgentBench's
    stream keeps it (its first line then taken for that command's echo)."""
    two = b"echo one\r\n" + OFF + b"one\r\n" + PROMPT + b"echo two\r\n" + OFF + b"two\r\n"
    terminal = _terminal({b"echo one\necho two\n": [two + PROMPT], b"true\n": [b"true\r\n"]})
    assert terminal.run("echo one\necho two", 5).text == "\rone\r\n"
    assert terminal.run("true", 5).text == "\rtwo\r\n"


def test_no_prompt_in_time_is_a_timeout_and_an_end_is_an_end():
    terminal = _terminal({b"sleep 99\n": [b"sleep 99\r\n", OFF]})
    out = terminal.run("sleep 99", 0.05)
    assert (out.text, out.timed_out, out.ended) == ("\r", True, False)
    terminal = _terminal({b"exit\n": [b"exit\r\n", OFF + b"logout\r\n", None]})
    out = terminal.run("exit", 5)
    assert (out.text, out.timed_out, out.ended) == ("\rlogout\r\n", False, True)
    assert terminal.ended
    with pytest.raises(SandboxError, match="ended"):
        terminal.run("ls", 5)


def test_a_shell_without_a_prompt_does_not_open(monkeypatch):
    monkeypatch.setattr(terminal_module, "FIRST_PROMPT_S", 0.05)
    terminal = Terminal(ScriptedIO([b"root@sandbox:~# "], {}))  # no escape: not a prompt
    with pytest.raises(SandboxError, match="no prompt"):
        terminal.open()


def test_cleaning_is_agentbench_s():
    # the prompt's pattern runs from the first escape to the last "# " of its line: a last
    # line without a newline goes with the prompt, as in AgentBench
    assert clean(OFF + b"abc" + PROMPT) == ""
    assert clean(b"\x1b]0;title\x07x\x07y") == "xy"
    assert clean(b"\xff\xfe") == UNDECODABLE
