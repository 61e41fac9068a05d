"""Scripted agents of the ``os`` task for ``agentrl-env check`` (`tasks.os.task.CHECK_AGENTS`).

``oracle`` runs the item's example and answers with what it printed (or finishes);
``random`` lists the directory and answers ``0`` (or finishes).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from agentrl.messages import ToolCall

__all__ = ["CHECK_AGENTS", "stdout_only"]


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def stdout_only(script: str) -> str:
    """``script`` run in the agent's shell itself with its stderr dropped: what it prints
    is the answer, as a check passes a script's stdout on (its warnings are not)."""
    return "{ " + script + "\n} 2>/dev/null"


def _oracle(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Run the example, then answer with its stdout (stripped, ``\\r\\n`` read as a line
    end) when the judge may read the answer (`OSItem.reads_answer`: a match, the example's
    output compared, or a check script that reads its arguments), else finish.

    A match item without an example is answered with its expected string.
    """
    item = env.item(index)
    if item.example is not None:
        yield _call("bash_action", script=stdout_only(item.example.as_bash()))
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


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
