"""Wire records of the environment side: the chat messages and tool calls of a
conversation, what a rollout and an environment worker say to each other about a session,
and the session reports the controller keeps its registry from.

Same rules as every record (`_records`): frozen, slotted, the type hints are the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

__all__ = [
    "ChatMessage",
    "EnvCancel",
    "EnvInteract",
    "EnvReply",
    "EnvStart",
    "SessionReport",
    "SessionsLost",
    "ToolCall",
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call made by the assistant (nested record, not a payload kind)."""

    id: str
    """Call id, echoed by the tool's reply message."""
    name: str
    """Tool name."""
    arguments: str
    """Arguments as a JSON text."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message (nested record, not a payload kind)."""

    role: str
    """``system``, ``user``, ``assistant`` or ``tool``."""
    content: str
    """Message text."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Tool calls made by an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the id of the call it answers."""
    name: str | None = None
    """For a tool message: the tool name."""


@dataclass(frozen=True, slots=True)
class EnvStart:
    """Rollout worker -> environment worker: start a session on one task instance."""

    KIND: ClassVar[str] = "env_start"

    session_id: str
    """Id chosen by the rollout worker for the new session."""
    task: str
    """Task name."""
    index: int
    """Task instance index."""


@dataclass(frozen=True, slots=True)
class EnvInteract:
    """Rollout worker -> environment worker: the assistant's next message."""

    KIND: ClassVar[str] = "env_interact"

    session_id: str
    """Session to act in."""
    message: ChatMessage
    """The assistant message (with parsed tool calls)."""


@dataclass(frozen=True, slots=True)
class EnvCancel:
    """Rollout worker -> environment worker: abandon a session."""

    KIND: ClassVar[str] = "env_cancel"

    session_id: str
    """Session to cancel."""


@dataclass(frozen=True, slots=True)
class EnvReply:
    """Environment worker -> rollout worker: the answer to EnvStart or EnvInteract."""

    KIND: ClassVar[str] = "env_reply"

    session_id: str
    """Session the reply belongs to."""
    worker_id: str
    """Id of the environment worker holding the session."""
    messages: list[ChatMessage]
    """New messages to append to the conversation."""
    tools: list[dict]
    """OpenAI-style tool schemas available in the session."""
    status: str
    """Environment status (see ``agentrl.environments`` Status values)."""
    reward: float
    """Reward so far."""
    finish: bool
    """True when the episode is over."""
    metrics: dict[str, float]
    """Environment metrics."""


@dataclass(frozen=True, slots=True)
class SessionReport:
    """Env worker or rollout actor -> controller: the environment sessions it holds now.

    Parallel lists, one entry per session, so 500 sessions stay a few kilobytes.
    """

    KIND: ClassVar[str] = "session_report"

    reporter: str
    """Id of the env worker or rollout actor."""
    role: Literal["env", "rollout"]
    """``env``: the sessions a worker serves; ``rollout``: the sessions its episodes use."""
    at: float
    """Wall clock of the report, seconds since the epoch."""
    task: str
    """For ``env``: the task the worker serves; empty for ``rollout``."""
    capacity: int
    """For ``env``: sessions it can hold; for ``rollout``: episode concurrency."""
    session_ids: list[str]
    """The live sessions."""
    idle: list[float]
    """Per session: seconds since its last start or interact."""
    workers: list[str] = field(default_factory=list)
    """For ``rollout``: per session, the worker holding it; empty for ``env``."""
    episodes: list[str] = field(default_factory=list)
    """For ``rollout``: per session, its episode id; empty for ``env``."""
    tasks: list[str] = field(default_factory=list)
    """For ``rollout``: per session, its task; empty for ``env``."""


@dataclass(frozen=True, slots=True)
class SessionsLost:
    """Controller -> one rollout actor: sessions it holds that are gone; end those episodes."""

    KIND: ClassVar[str] = "sessions_lost"

    rollout_id: str
    """The rollout actor holding the sessions."""
    session_ids: list[str]
    """Sessions to give up (their episodes end as infra failures and are retried)."""
    reasons: list[str]
    """Per session: why (``worker dead``, ``not on its worker``, ``idle``)."""
