"""The Environment protocol, its records, episode statuses and the error taxonomy.

An environment plays task instances as multi-turn chats. The model's
failures (a bad tool call, a limit reached) are *not* exceptions: they end
the episode with a :class:`Status`. Exceptions are reserved for the
environment itself breaking (:class:`InfraError`, retried by the rollout on
a fresh environment) and for caller mistakes.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.messages import ChatMessage

__all__ = [
    "EnvError",
    "Environment",
    "InfraError",
    "MalformedToolCall",
    "SampleError",
    "SessionClosed",
    "Start",
    "Status",
    "Step",
    "TaskOptionsError",
    "UnknownTask",
    "reward_range",
    "session_tools",
    "tool_schema_problems",
]

DEFAULT_REWARD_RANGE = (0.0, 1.0)
"""The rewards a task's finishing step may give unless the task declares ``reward_range``."""


class Status(enum.StrEnum):
    """How an episode stands after a step; every value but ``running`` ends it."""

    RUNNING = "running"
    """The episode goes on: the model answers the new messages."""
    COMPLETED = "completed"
    """The task ended normally (the reward says how well)."""
    AGENT_CONTEXT_LIMIT = "agent_context_limit"
    """The conversation outgrew the token budget (set by the rollout, not by envs)."""
    AGENT_VALIDATION_FAILED = "agent_validation_failed"
    """The assistant text held a malformed tool call and the task ends episodes on that (the
    rollout passes such text to the task as a message without calls; AgentBench tasks reply
    and go on, a task may end the episode with this status instead)."""
    AGENT_INVALID_ACTION = "agent_invalid_action"
    """Well-formed but unusable action: no tool call, unknown tool, wrong arguments."""
    TASK_LIMIT_REACHED = "task_limit_reached"
    """The task's own limit (e.g. max turns) was reached before the end."""
    TASK_ERROR = "task_error"
    """The task could not judge the episode (a bug or bad data in the task)."""
    CANCELLED = "cancelled"
    """The episode was cancelled from outside."""


@dataclass(frozen=True, slots=True)
class Start:
    """What :meth:`Environment.start` returns: a new session and its opening messages."""

    session: Any
    """Opaque session handle, passed back to ``interact`` and ``cancel``."""
    messages: list[ChatMessage]
    """Opening messages (system, user) the model answers first."""
    tools: list[dict] | None = None
    """This session's tool schemas when they are the instance's own (BFCL: every entry has
    its functions); None means the environment's ``tools``. See `session_tools`."""


def session_tools(env: Environment, start: Start) -> list[dict]:
    """The tool schemas of a started session: its own, else the environment's."""
    return list(env.tools) if start.tools is None else list(start.tools)


def reward_range(env: Any) -> tuple[float, float]:
    """The rewards ``env`` declares for its finishing steps: its ``reward_range`` attribute
    ``(low, high)``, else [0, 1]. Raises TaskOptionsError for a declaration that is not two
    finite numbers with ``low <= high``."""
    declared = getattr(env, "reward_range", DEFAULT_REWARD_RANGE)
    try:
        low, high = (float(x) for x in declared)
    except (TypeError, ValueError):
        raise TaskOptionsError(f"reward_range {declared!r} is not (low, high)") from None
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise TaskOptionsError(f"reward_range {declared!r} is not finite low <= high")
    return low, high


def tool_schema_problems(tools: Any) -> list[str]:
    """Why ``tools`` is not a list of OpenAI function schemas (empty when it is)."""
    if not isinstance(tools, list):
        return [f"must be a list of schemas, got {type(tools).__name__}"]
    problems, names = [], set()
    for n, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not function:
            problems.append(f"tool {n}: not {{'type': 'function', 'function': {{...}}}}")
            continue
        name = function.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"tool {n}: function.name must be a non-empty string")
        elif name in names:
            problems.append(f"tool {name!r}: the name is used twice")
        names.add(name)
        if not isinstance(function.get("description"), str):
            problems.append(f"tool {name!r}: function.description must be a string")
        params = function.get("parameters")
        if not isinstance(params, dict) or params.get("type") != "object":
            problems.append(f"tool {name!r}: parameters must be a JSON schema of type object")
            continue
        properties = params.get("properties", {})
        if not isinstance(properties, dict):
            problems.append(f"tool {name!r}: parameters.properties must be an object")
            continue
        missing = [k for k in params.get("required", []) if k not in properties]
        if missing:
            problems.append(f"tool {name!r}: required {missing} not among its properties")
    return problems


@dataclass(frozen=True, slots=True)
class Step:
    """What :meth:`Environment.interact` returns for one assistant message."""

    messages: list[ChatMessage]
    """New messages for the model (tool results, user follow-ups); may be empty at the end."""
    status: Status
    """``running`` while the episode goes on, else how it ended."""
    reward: float
    """Environment reward: 0.0 while running; the task's score (0/1 or [0, 1]) at the end."""
    finish: bool
    """True when the episode has ended (exactly when ``status`` is not ``running``)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-episode metrics (``env/<name>``), filled in on the finishing step."""

    @classmethod
    def end(
        cls,
        status: Status,
        reward: float,
        metrics: dict[str, float],
        messages: list[ChatMessage] | None = None,
    ) -> Step:
        """The step that ends an episode: ``finish`` set, its last messages, reward, metrics."""
        return cls(
            messages=messages or [], status=status, reward=reward, finish=True, metrics=metrics
        )


@runtime_checkable
class Environment(Protocol):
    """One task: a numbered set of instances, the tools it offers, and its sessions.

    Sessions are independent, so one environment may run many at once;
    implementations must keep ``start``/``interact``/``cancel`` safe to call
    from several threads for different sessions.
    """

    @property
    def tools(self) -> list[dict]:
        """OpenAI function schemas: ``{"type": "function", "function": {name, description,
        parameters}}``."""
        ...

    @property
    def num_instances(self) -> int:
        """Number of task instances; valid indices are ``0 .. num_instances - 1``."""
        ...

    def start(self, index: int) -> Start:
        """Open a session on instance ``index``; raises IndexError if out of range."""
        ...

    def interact(self, session: Any, message: ChatMessage) -> Step:
        """Apply one parsed assistant message; raises SessionClosed after the end."""
        ...

    def cancel(self, session: Any) -> None:
        """End a session early and release it; idempotent."""
        ...


class EnvError(Exception):
    """Base of every error raised by agentrl.environments."""


class InfraError(EnvError):
    """Raised when the environment itself broke (worker died, container lost, timeout).

    Not the model's fault: the rollout retries the episode on a fresh environment.
    """


class SampleError(EnvError):
    """Raised by ``start`` when the task cannot set this instance up (e.g. its init script fails).

    Not the model's fault and not transient: the rollout does not retry it; the
    episode is published with status ``task_error``, no tokens and metric
    ``sample_error = 1``, and the learner leaves it out of its group (AgentBench
    ends such a sample with status ``unknown``, unscored).
    """


class SessionClosed(EnvError):
    """Raised when ``interact`` is called on a session that already ended or was cancelled."""


class UnknownTask(EnvError, LookupError):
    """Raised by ``make_task`` for a name no factory is registered under."""


class TaskOptionsError(EnvError, TypeError):
    """Raised by ``make_task`` when the options do not fit the task factory's signature."""


class MalformedToolCall(EnvError, ValueError):
    """Raised by ``parse_assistant`` when the text holds a tool call that cannot be read.

    A model failure, not an infra one: the rollout passes the raw text on to the
    task as a message without tool calls, and the task answers it (AgentBench's
    "no executable tool call" reply) or ends the episode; never a crash.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        """Why the call could not be read (shown in logs and episode metrics)."""
