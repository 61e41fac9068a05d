"""The per-episode plumbing every built-in task shares: turns, bad calls, limits, endings.

AgentBench's task loops (``src/server/tasks/*/task.py``) all take an episode the same
way, and so do ours:

- an ``interact`` on a session that has ended raises `SessionClosed`
  (:func:`begin_turn`), else the assistant message counts as one turn;
- a message without a tool call is not the end: it counts as a bad call and gets
  the task's own reply as a user message (:func:`no_tool_call`);
- after the message's calls, the turn limit ends the episode ``task_limit_reached``
  with reward 0, else the episode goes on (:func:`after_turn`);
- every ending (:func:`end_episode`) marks the session done and reports the metrics
  all tasks share (``env/turns``, ``env/bad_calls``, ``env/level``, ``env/success``)
  beside the task's own, with one debug log line.

A session is any object with the attributes of :class:`Counters` (the tasks' session
dataclasses carry them as plain fields).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import structlog

from agentrl.environments._protocol import SessionClosed, Status, Step
from agentrl.messages import ChatMessage

__all__ = ["Counters", "after_turn", "begin_turn", "end_episode", "no_tool_call"]

log = structlog.get_logger(__name__)


class Counters(Protocol):
    """What the toolkit reads and writes on a task's session."""

    turns: int
    """Assistant messages taken so far."""
    max_turns: int
    """The episode's turn limit (the task's, its level's, or the ``max_turns`` option)."""
    bad_calls: int
    """Messages without a call, unknown functions, unreadable arguments."""
    done: bool
    """Set by the ending; a later ``interact`` raises SessionClosed."""


def begin_turn(task: str, session: Counters) -> None:
    """Count one assistant message; SessionClosed when the episode has ended."""
    if session.done:
        raise SessionClosed(f"{task}: interact on a session that has ended")
    session.turns += 1


def no_tool_call(session: Counters, reply: str) -> ChatMessage:
    """A message without a tool call: one bad call, answered by ``reply`` as the user."""
    session.bad_calls += 1
    return ChatMessage(role="user", content=reply)


def after_turn(session: Counters, replies: list[ChatMessage], end: Callable[..., Step]) -> Step:
    """The step after a turn that did not end the episode: ``end(session,
    TASK_LIMIT_REACHED, "max turns", replies)`` at the turn limit, else ``replies``."""
    if session.turns >= session.max_turns:
        return end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
    return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False, metrics={})


def end_episode(
    task: str,
    session: Counters,
    status: Status,
    why: str,
    replies: list[ChatMessage] | None,
    *,
    level: int,
    success: bool,
    reward: float | None = None,
    metrics: dict[str, float] | None = None,
) -> Step:
    """The finishing step: the session marked done, the shared metrics with the task's own
    (``metrics``), reward ``reward`` (default 1.0 on success, else 0.0)."""
    session.done = True
    shown = {
        "env/turns": float(session.turns),
        "env/bad_calls": float(session.bad_calls),
        "env/level": float(level),
        "env/success": float(success),
        **(metrics or {}),
    }
    value = (1.0 if success else 0.0) if reward is None else reward
    log.debug(f"{task} episode ended", status=status.value, why=why, reward=value, **shown)
    return Step.end(status, value, shown, replies)
