"""Scripted agents of the ``os`` task for ``agentrl-env check`` (`tasks.os.task.CHECK_AGENTS`).

``oracle`` runs the item's example and answers with its output (or finishes);
``random`` lists the directory and answers ``0`` (or finishes).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from agentrl.environments.tasks.os.items import Script
from agentrl.messages import ToolCall

__all__ = ["CHECK_AGENTS"]


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _oracle(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Run the example, then answer with its output (stripped) or finish.

    A match item without an example is answered with its expected string.
    """
    item = env.item(index)
    example: Script | None = item.example
    if example is not None:
        yield _call("bash_action", script=example.as_bash())
    if not item.wants_answer:
        yield _call("finish_action")
    elif example is not None:
        yield _call("answer_action", answer=env.last_output(index).strip())
    else:
        yield _call("answer_action", answer=item.match.answer if item.match else "")


def _random(env: Any, index: int, rng: random.Random) -> Iterator[ToolCall]:
    yield _call("bash_action", script="ls")
    if env.item(index).wants_answer:
        yield _call("answer_action", answer="0")
    else:
        yield _call("finish_action")


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
