"""Calls into a task's own code, bounded in time and checked at the boundary.

An in-process task is code agentrl does not control: its ``start``, ``interact``
or ``cancel`` may raise anything, block forever, or return a reward of ``7.0`` or
``"0.5"``. `GuardedEnvironment` wraps one so that each of these becomes a
`TaskFailure` (an `InfraError`: the rollout retries the episode, then gives it up)
naming the task, instead of ending the run or being trained on:

- every call runs on a fresh daemon thread and is waited for at most ``timeout``
  seconds. A call still running then is *abandoned*: its thread keeps running until
  the task's code returns (Python cannot kill a thread), but nothing waits for it and,
  being a daemon, it does not keep the process alive at exit; the episode fails with
  ``TaskFailure(kind="timeout")``;
- an exception other than an `EnvError` from the task is a ``TaskFailure`` with
  ``kind`` the exception's class name (an `EnvError`, the task's own word, passes);
- a returned `Start` must be a `Start` whose messages are `ChatMessage` and whose
  tool schemas are valid (`tool_schema_problems`), a returned `Step` a `Step` with
  `ChatMessage` messages whose status is a `Status` and, on the finishing step, whose
  reward is a finite number inside the task's `reward_range`; otherwise
  ``TaskFailure(kind="contract")`` says what was wrong.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.environments._protocol import (
    EnvError,
    Environment,
    InfraError,
    Start,
    Status,
    Step,
    reward_range,
    tool_schema_problems,
)
from agentrl.messages import ChatMessage

__all__ = ["GuardedEnvironment", "TaskFailure", "reward_problem"]

T = TypeVar("T")


class TaskFailure(InfraError):
    """Raised when a task's own code failed a call: it raised, timed out or broke the contract.

    An infra failure of the episode (retried, then given up), never the model's fault.
    """

    def __init__(self, task: str, kind: str, detail: str) -> None:
        super().__init__(f"task {task!r}: {kind}: {detail}")
        self.task = task
        """The task whose code failed."""
        self.kind = kind
        """The exception's class name, ``timeout`` or ``contract``."""


def reward_problem(reward: Any, bounds: tuple[float, float]) -> str | None:
    """Why ``reward`` may not be trained on (not a number, not finite, outside ``bounds``),
    or None when it may."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return f"reward {reward!r} is a {type(reward).__name__}, not a number"
    if not math.isfinite(reward):
        return f"reward {reward!r} is not finite"
    low, high = bounds
    if not low <= reward <= high:
        return f"reward {reward!r} is outside the declared range [{low:g}, {high:g}]"
    return None


def _messages(messages: Any) -> bool:
    return isinstance(messages, list) and all(isinstance(m, ChatMessage) for m in messages)


class GuardedEnvironment:
    """An in-process task behind the checks of the module doc; same protocol as the task."""

    def __init__(self, task: str, env: Environment, *, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.task = task
        self.inner = env
        self.timeout = timeout
        self._bounds = reward_range(env)

    @property
    def tools(self) -> list[dict]:
        return self.inner.tools

    @property
    def num_instances(self) -> int:
        return self.inner.num_instances

    def start(self, index: int) -> Start:
        start = self._call("start", lambda: self.inner.start(index))
        if not isinstance(start, Start):
            self._broken(f"start({index}) returned {type(start).__name__}, not Start")
        if not _messages(start.messages):
            self._broken(f"start({index}): messages must be a list of ChatMessage")
        if start.tools is not None:
            problems = tool_schema_problems(start.tools)
            if problems:
                self._broken(f"start({index}): Start.tools: {problems[0]}")
        return start

    def interact(self, session: Any, message: ChatMessage) -> Step:
        step = self._call("interact", lambda: self.inner.interact(session, message))
        if not isinstance(step, Step):
            self._broken(f"interact returned {type(step).__name__}, not Step")
        if not _messages(step.messages):
            self._broken("interact: messages must be a list of ChatMessage")
        if not isinstance(step.status, Status):
            try:
                Status(step.status)
            except ValueError:
                self._broken(f"interact returned status {step.status!r}, not a Status")
        if step.finish:
            problem = reward_problem(step.reward, self._bounds)
            if problem is not None:
                self._broken(problem)
        return step

    def cancel(self, session: Any) -> None:
        self._call("cancel", lambda: self.inner.cancel(session))

    def __getattr__(self, name: str) -> Any:  # describe(), item(), ... of the task
        return getattr(self.inner, name)

    def _broken(self, detail: str) -> None:
        raise TaskFailure(self.task, "contract", detail)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` on a daemon thread, waited for at most ``timeout`` seconds (module doc)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the waiting thread below, never lost
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"task-{self.task}-{what}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise TaskFailure(
                self.task, "timeout", f"{what} did not return in {self.timeout:g} s (abandoned)"
            )
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, EnvError) or not isinstance(exc, Exception):
                raise exc
            raise TaskFailure(self.task, type(exc).__name__, f"{what} raised: {exc}") from exc
        return box["value"]
