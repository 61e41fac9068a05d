"""The os task's terminal framing (`tasks.os.terminal`) against a scripted terminal.

Expected values follow agentrl-worker 0.4.0 (``environment/docker.py``: ``execute_shell``
drops the stream's first message and reads until ``SHELL_PROMPT_RE``,
``environment/_const.py``) and AgentBench's ``os_interaction/task.py`` lines 64-78
(``Container.execute``'s substitutions). The bytes are what bash 5.2 writes on a terminal
under ``TERM=xterm`` with Debian's or Ubuntu's ``~/.bashrc``.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from agentrl.environments.tasks.os import terminal as terminal_module
from agentrl.environments.tasks.os.sandbox import SandboxError
from agentrl.environments.tasks.os.terminal import (
    PROMPT as PROMPT_PATTERN,
)
from agentrl.environments.tasks.os.terminal import (
    UNDECODABLE,
    Terminal,
    clean,
    find_prompt,
)

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


_AGENTBENCH_CLEANING = (
    re.compile(rb"\x1b.+@.+[#|$] "),
    re.compile(rb"\x1b\[[0-9;]*[a-zA-Z]"),
    re.compile(rb"\x1b][0-9]*;[^\x07]*\x07"),
    re.compile(rb"\x1b\[\?2004[hl]"),
    re.compile(rb"\x07"),
)
"""``Container.execute``'s substitutions, AgentBench's ``os_interaction/task.py`` lines
64-78, as it writes them."""


def _agentbench_clean(raw: bytes) -> bytes:
    for pattern in _AGENTBENCH_CLEANING:
        raw = pattern.sub(b"", raw)
    return raw


def test_prompt_search_and_cleaning_give_agentbench_s_results():
    """On short random lines of the bytes that matter, `find_prompt` finds what the
    regex finds and `clean` removes what AgentBench's substitutions remove."""
    rng = random.Random(7)
    alphabet = [b"\x1b", b"@", b"#", b"$", b"|", b" ", b"\n", b"\x07", b"]", b"[", b"0", b";"]
    alphabet += [b"?2004h", b"a", b"m", b"\r"]
    for _ in range(20000):
        raw = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 24)))
        match = PROMPT_PATTERN.search(raw)
        assert find_prompt(raw) == (match.span() if match else None), raw
        assert clean(raw) == _agentbench_clean(raw).decode("utf-8"), raw


@pytest.mark.parametrize(
    "line",
    [b"\x1b@" * 200_000, b"\x1b]0;@" * 100_000, b"\x1b[" * 300_000, b"a" * 1_000_000],
    ids=["escapes-and-ats", "unended-titles", "unended-colours", "no-line-end"],
)
def test_cleaning_a_hostile_line_takes_linear_time(line):
    began = time.monotonic()
    clean(line + PROMPT)
    find_prompt(line)
    assert time.monotonic() - began < 2.0  # the regexes alone: hours


class EndlessIO:
    """A terminal whose command never ends: ``chunk`` again on every read, at once."""

    def __init__(self, chunk: bytes, echo: bytes = b"cmd\r\n") -> None:
        self.pending = [PROMPT, echo]
        self.chunk = chunk

    def write(self, data: bytes) -> None:
        pass

    def read(self, timeout: float) -> bytes | None:
        return self.pending.pop(0) if self.pending else self.chunk

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "chunk, echo",
    [
        (b"a" * 65536, b"cmd\r\n"),  # one endless line: cat /dev/zero | tr '\0' a
        (b"y\r\n" * 20000, b"cmd\r\n"),  # endless lines: yes
        (bytes(range(256)) * 256, b"cmd\r\n"),  # binary
        (b"\x1b@" * 32768, b"cmd\r\n"),  # escapes and ats: the prompt's regex at its worst
        (b"a" * 65536, b""),  # no echo line end either (stty -echo)
    ],
    ids=["one-line", "many-lines", "binary", "escapes", "no-echo"],
)
def test_every_shape_of_endless_output_returns_at_the_time_limit(chunk, echo):
    terminal = Terminal(EndlessIO(chunk, echo))
    terminal.open()
    began = time.monotonic()
    out = terminal.run("cmd", 0.5)
    assert out.timed_out and not out.ended
    assert time.monotonic() - began < 1.5
    assert len(out.text) <= (1 << 20) + 1
