"""Scripted agents of the ``os`` task for ``agentrl-env check`` (`tasks.os.task.CHECK_AGENTS`).

``oracle`` runs the item's example and answers with what it printed (or finishes);
``teacher`` does the same as a person would type it, for SFT and demos (the oracle's
marks and byte escapes, there to read the exact stdout, are nothing a model should
learn); ``random`` lists the directory and answers ``0`` (or finishes).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from agentrl.environments.tasks.os.items import Script
from agentrl.environments.tasks.os.sandbox import JUDGE_PATH
from agentrl.messages import ToolCall

__all__ = ["CHECK_AGENTS", "as_the_judge", "in_the_shell", "stdout_of", "stdout_only"]


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


_BEGIN, _END = "AGENTRL-STDOUT-BEGIN", "AGENTRL-STDOUT-END"
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,./:=_+-")


def ansi_c(text: str) -> str:
    """``text`` as one bash word on one line: ANSI-C quotes, every byte but letters, digits
    and a few signs written ``\\xHH`` (a terminal types no line of it apart, a tab
    completes nothing, a ``!`` expands no history)."""
    return "$'" + "".join(chr(b) if b in _PLAIN else f"\\x{b:02x}" for b in text.encode()) + "'"


def stdout_only(command: str) -> str:
    """``command`` (one line) with its stderr dropped and its stdout between two marks
    (`stdout_of`) that ``printf`` writes from octal escapes, so the terminal's echo of the
    line holds neither."""
    marks = [f"printf '\\n\\101{mark[1:]}\\n'" for mark in (_BEGIN, _END)]
    return f"{marks[0]}; {command} 2>/dev/null; {marks[1]}"


def stdout_of(output: str) -> str:
    """What a `stdout_only` command printed, from its shell's output (the whole output
    when the marks are not both there)."""
    begin, end = output.find(_BEGIN), output.rfind(_END)
    if begin < 0 or end < begin:
        return output
    return output[begin + len(_BEGIN) : end]


def in_the_shell(example: Script) -> str:
    """The example run in the agent's shell itself (``eval``: what it sets stays)."""
    return "eval " + ansi_c(example.as_bash())


def as_the_judge(example: Script) -> str:
    """The example run from the agent's shell as the judge runs it: its interpreter by
    absolute path in ``/root`` with the judge's clean environment (`JUDGE_PATH`), one
    process below the shell, as the judge's is one below ``docker exec``."""
    clean = ["env", "-i", "-C", "/root", f"PATH={JUDGE_PATH}", "HOME=/root", "LANG=C.UTF-8"]
    return " ".join([*clean, *(ansi_c(arg) for arg in example.judge_argv())])


def _oracle(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Run the example, then answer with its stdout (stripped, ``\\r\\n`` read as a line
    end) when the judge may read the answer (`OSItem.reads_answer`: a match, the example's
    output compared, or a check script that reads its arguments), else finish.

    Where the judge runs the example itself (a null check) and compares its output with
    the answer, the oracle runs it as the judge does (`as_the_judge`): the expected answer
    is what it prints there, not after the login shell's own start-up (a ``~/.bashrc``
    that adds to ``PATH`` runs twice in a terminal that sources it again). Elsewhere it
    runs in the shell (`in_the_shell`: a ``su`` or a variable of ``start`` holds). A match
    item without an example is answered with its expected string.
    """
    item = env.item(index)
    example = item.example
    if example is not None:
        judged = any(s is None for s in item.check)
        run = as_the_judge(example) if judged else in_the_shell(example)
        yield _call("bash_action", script=stdout_only(run))
    if not item.reads_answer:
        yield _call("finish_action")
    elif example is not None:
        answer = stdout_of(env.last_output(index)).replace("\r\n", "\n").strip()
        yield _call("answer_action", answer=answer)
    else:
        yield _call("answer_action", answer=item.match.answer if item.match else "")


def _teacher(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """The example typed into the shell as it is written, then an answer with what the
    shell showed (stripped, ``\r\n`` read as a line end), a finish, or a match item's
    expected string, as `_oracle` decides. Where the shell's output is not the answer (a
    warning on stderr, a script of several lines a terminal takes one at a time) the
    episode fails and SFT skips it (``failed``)."""
    item = env.item(index)
    if item.example is not None:
        yield _call("bash_action", script=item.example.as_bash())
    if not item.reads_answer:
        yield _call("finish_action")
    elif item.example is not None:
        answer = env.last_output(index).replace("\r\n", "\n").strip()
        yield _call("answer_action", answer=answer)
    else:
        yield _call("answer_action", answer=item.match.answer if item.match else "")


def _random(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    yield _call("bash_action", script="ls")
    if env.item(index).wants_answer:
        yield _call("answer_action", answer="0")
    else:
        yield _call("finish_action")


CHECK_AGENTS = {"oracle": _oracle, "teacher": _teacher, "random": _random}
