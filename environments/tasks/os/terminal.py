"""The agent's terminal: one interactive ``bash --login`` on a pty, as AgentBench runs it.

AgentBench's shell (agentrl-worker 0.4.0, ``environment/docker.py``): ``create_shell``
execs ``/bin/bash --login`` with a tty in the container and reads up to its first
prompt; ``execute_shell`` writes the command and a newline, drops the stream's first
message (the terminal's echo of the command), reads until a message holds a prompt
(`PROMPT`, ``SHELL_PROMPT_RE`` in ``environment/_const.py``), and gives up after 30 s
(``TimeoutError``: the sample ends). ``os_interaction/task.py`` (``Container.execute``)
then strips the prompt and the terminal's control sequences (`clean`).

`Terminal` does the same over a `TerminalIO` (a pty under bwrap, an exec socket in a
container), deterministically: what is dropped is the echo up to its first line end,
and what follows the prompt (the rest of a script of several lines, which the shell
runs line by line, each line then echoed and answered with a prompt of its own) is
kept for the next command, as AgentBench's stream keeps it. Lines end ``\\r\\n``, ``ls``
writes columns, aliases and ``~/.bashrc`` apply, a ``su - jack`` leaves jack's shell
answering: the terminal is the agent's for the whole session.
"""

from __future__ import annotations

import os
import re
import select
import time
from collections.abc import Callable
from typing import Protocol

from agentrl.environments.tasks.os.sandbox import Sandbox, SandboxError
from agentrl.environments.tasks.os.shell import ShellOutput

__all__ = [
    "FIRST_PROMPT_S",
    "PROMPT",
    "UNDECODABLE",
    "FdIO",
    "Terminal",
    "TerminalIO",
    "clean",
    "find_prompt",
    "open_terminal",
]

PROMPT = re.compile(rb"\x1b.+@.+[#|$] ")
"""A prompt as AgentBench finds one: a title or colour sequence, ``user@host``, then
``# `` or ``$ `` (Ubuntu's and Debian's ``~/.bashrc`` under ``TERM=xterm``). Searched by
`find_prompt`, which finds its match in linear time (the regex itself backtracks for
a time that grows with the cube of a line's length on a line of escapes and ``@``)."""
_COLOURS = re.compile(rb"\x1b\[[0-9;]*[a-zA-Z]")
_TITLES = re.compile(rb"\x1b][0-9]*;[^\x07]*\x07")
_PASTE = re.compile(rb"\x1b\[\?2004[hl]")
UNDECODABLE = "OS Environment output cannot be decoded as UTF-8"
"""AgentBench's observation text for output that is not UTF-8 (``_execute_bash_command``)."""
FIRST_PROMPT_S = 5.0
"""How long the shell has to show its first prompt (``create_shell``'s ``wait_for``)."""
_KEEP = 1 << 20
"""Bytes of one command's output kept (its beginning; the prompt is looked for in all)."""
_LINE = 4096
"""Bytes of an unfinished line kept to find a prompt in (its end): a prompt is one line's
end, a few dozen bytes; a line without an end (``cat /dev/zero | tr '\\0' a``) is not
held whole."""


def _prompt_in_line(line: bytes) -> tuple[int, int] | None:
    """`PROMPT`'s match in ``line`` (no ``\\n``) as ``re.search`` finds it: from the first
    escape, through an ``@`` at least two bytes on, to the last ``# ``, ``| `` or ``$ `` at
    least two bytes past the first such ``@`` (both ``.+`` greedy); None without one."""
    start = line.find(b"\x1b")
    if start < 0:
        return None
    at = line.find(b"@", start + 2)
    if at < 0:
        return None
    end = max(line.rfind(b"# "), line.rfind(b"| "), line.rfind(b"$ "))
    return (start, end + 2) if end >= at + 2 else None


def find_prompt(data: bytes) -> tuple[int, int] | None:
    """(start, end) of `PROMPT`'s first match in ``data`` (it lies within one line), in
    time linear in ``len(data)``; None when there is none."""
    if b"\x1b" not in data:
        return None
    pos = 0
    while True:
        stop = data.find(b"\n", pos)
        found = _prompt_in_line(data[pos : stop if stop >= 0 else len(data)])
        if found is not None:
            return pos + found[0], pos + found[1]
        if stop < 0:
            return None
        pos = stop + 1


def _without_prompts(raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    for number, line in enumerate(lines):
        if (found := _prompt_in_line(line)) is not None:
            lines[number] = line[: found[0]] + line[found[1] :]
    return b"\n".join(lines)


def _without_titles(raw: bytes) -> bytes:
    """`_TITLES` removed; past the last bell no title can end, so the regex only sees the
    part before it (each title then ends at the next bell: linear time)."""
    last = raw.rfind(b"\x07")
    return _TITLES.sub(b"", raw[: last + 1]) + raw[last + 1 :]


def clean(raw: bytes) -> str:
    """The model's view of terminal output: ``Container.execute``'s substitutions
    (``os_interaction/task.py``) in its order (the prompt, colours and cursor moves,
    window titles, bracketed paste on and off, bells) with the same results, each in
    linear time; then UTF-8."""
    raw = _without_prompts(raw)
    raw = _COLOURS.sub(b"", raw)
    raw = _without_titles(raw)
    raw = _PASTE.sub(b"", raw)
    raw = raw.replace(b"\x07", b"")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UNDECODABLE


class TerminalIO(Protocol):
    """A byte stream to and from the terminal of a shell in the sandbox."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the shell's input (written as it reads; never blocks)."""
        ...

    def read(self, timeout: float) -> bytes | None:
        """What the terminal wrote within ``timeout`` s (b"" when nothing did), None once
        the shell and every process holding the terminal are gone."""
        ...

    def close(self) -> None:
        """End the shell and everything it started in its session."""
        ...


class Terminal:
    """One interactive ``bash --login`` over ``io``; see the module doc."""

    def __init__(self, io: TerminalIO) -> None:
        self._io = io
        self._left = b""
        self._ended = False

    @property
    def ended(self) -> bool:
        """True once the shell has ended; it takes no more commands."""
        return self._ended

    def open(self) -> None:
        """Wait for the first prompt; SandboxError when none comes in `FIRST_PROMPT_S`."""
        _, found = self._until_prompt(b"", time.monotonic() + FIRST_PROMPT_S)
        if not found:
            raise SandboxError(f"the shell showed no prompt in {FIRST_PROMPT_S:g} s")

    def run(self, command: str, timeout: float) -> ShellOutput:
        """Type ``command`` and a newline; the output up to the next prompt."""
        if self._ended:
            raise SandboxError("the terminal's shell has ended")
        self._io.write(command.encode("utf-8", errors="surrogateescape") + b"\n")
        deadline = time.monotonic() + timeout
        data, self._left = self._left, b""
        while b"\n" not in data:  # the echo, as far as its first line end
            chunk = self._read(deadline)
            if not chunk:
                return self._unfinished(data, chunk)
            data = (data + chunk)[: _KEEP + 1]  # an echo without an end is not held whole
        output, found = self._until_prompt(data[data.index(b"\n") + 1 :], deadline)
        if not found:
            return self._unfinished(output, None if self._ended else b"")
        return ShellOutput(clean(output))

    def _unfinished(self, output: bytes, last: bytes | None) -> ShellOutput:
        """The output of a command that met the deadline (``last`` b"") or the end of the
        shell (``last`` None)."""
        self._ended = last is None
        return ShellOutput(clean(output), timed_out=not self._ended, ended=self._ended)

    def _read(self, deadline: float) -> bytes | None:
        """The next bytes; b"" once the deadline has passed (however fast the terminal
        writes), None at the shell's end."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b""
            chunk = self._io.read(left)
            if chunk is None or chunk:
                return chunk

    def _until_prompt(self, data: bytes, deadline: float) -> tuple[bytes, bool]:
        """``data`` and what follows, up to and with the first prompt (what comes after
        it is kept for the next command), and whether a prompt came before the deadline
        or the shell's end. At most `_KEEP` bytes of it are kept, and of an unfinished
        line its last `_LINE` bytes."""
        kept, line, new = bytearray(), b"", data
        while True:
            scan = line + new  # a prompt lies within one line: the unfinished one and more
            found = find_prompt(scan)
            upto = found[1] - len(line) if found is not None else len(new)
            kept += new[:upto][: max(_KEEP - len(kept), 0)]
            if found is not None:
                self._left = new[upto:]
                return bytes(kept), True
            line = scan[scan.rfind(b"\n") + 1 :][-_LINE:]
            new = self._read(deadline)
            if not new:
                self._ended = new is None
                return bytes(kept), False

    def close(self) -> None:
        """End the shell and everything it started."""
        self._io.close()


def open_terminal(sandbox: Sandbox) -> Terminal:
    """A `Terminal` on ``sandbox`` with its login shell up to its first prompt (the
    ``terminal`` shell of the ``os`` task); closed again when it does not come up."""
    terminal = Terminal(sandbox.open_terminal())
    try:
        terminal.open()
    except BaseException:
        terminal.close()
        raise
    return terminal


class FdIO:
    """A `TerminalIO` over a descriptor: a pty's master (bwrap) or an exec's socket
    (containers). Writes wait in a buffer until the shell reads them, so a long script
    never blocks the reading of what the shell writes meanwhile."""

    def __init__(self, fd: int, close: Callable[[], None]) -> None:
        os.set_blocking(fd, False)
        self._fd, self._release, self._out = fd, close, bytearray()
        self._poll = select.poll()
        self._closed = False

    def write(self, data: bytes) -> None:
        self._out += data
        self._flush()

    def _flush(self) -> None:
        while self._out:
            try:
                written = os.write(self._fd, self._out)
            except BlockingIOError:
                return
            except OSError:  # the shell is gone: `read` says so
                self._out.clear()
                return
            del self._out[:written]

    def read(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            events = select.POLLIN | (select.POLLOUT if self._out else 0)
            self._poll.register(self._fd, events)
            left = max(deadline - time.monotonic(), 0.0)
            ready = dict(self._poll.poll(left * 1000))
            if ready.get(self._fd, 0) & select.POLLOUT:
                self._flush()
            if ready.get(self._fd, 0) & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: no process holds the pty's other side any more
                    return None
                return chunk or None
            if time.monotonic() >= deadline:
                return b""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()
