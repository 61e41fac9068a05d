"""A solved example in the prompt: the task's oracle played on another instance.

Small models follow a tool-call format far more often after one example of it
(SmolLM2-135M: about 4 in 6 well-formed calls with one example, almost none
without). `with_demo` wraps any task that offers check agents (``CHECK_AGENTS``
with an ``oracle``, or built into `_check`): each session's opening messages become

    system, demo user, (demo assistant call, demo tool reply) x steps, user ...

(opening messages that the demo instance shares with the episode's, such as a
task's fixed example, come once, before the demo), where the demo is the oracle's
first ``steps`` actions on instance
``(index + len(levels)) % num_instances`` (the next instance of the same level:
indices cycle through a task's ``levels``; 1 for a task without levels), run
through the task itself, with each call
written as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` text (the
form the calculator's demo uses and the parser reads). Demos are computed once
per demo instance and kept. Tasks with a ``demo`` option of their own
(calculator) are not wrapped.
"""

from __future__ import annotations

import json
import random
import threading
from typing import Any

from agentrl.environments._protocol import Environment, Start, Step
from agentrl.environments._toolcalls import call_text
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["DemoPrompt", "with_demo"]


def _call_text(call: ToolCall | list[ToolCall] | str) -> str:
    if isinstance(call, str):  # a scripted step without a call: the text itself
        return call
    if isinstance(call, list):  # several calls in one turn: one per line
        return "\n".join(_call_text(c) for c in call)
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        arguments = call.arguments
    return call_text(call.name, arguments)


class DemoPrompt:
    """`Environment` wrapper that puts an oracle demo in front of each episode (module doc)."""

    def __init__(self, env: Environment, task: str, steps: int = 2) -> None:
        from agentrl.environments._check import scripts_for, teacher_of

        if getattr(env, "instance_tools", False):
            raise ValueError(
                f"task {task!r} gives each instance its own tools; a demo from another "
                "instance would show calls to tools this one does not have"
            )
        teacher = teacher_of(scripts_for(task, env))
        if teacher is None:
            raise ValueError(f"task {task!r} has no oracle agent to make a demo with")
        if steps < 1:
            raise ValueError("demo steps must be >= 1")
        self._env, self._teacher, self._steps = env, teacher, steps
        self._demos: dict[int, list[ChatMessage]] = {}
        self._lock = threading.Lock()

    @property
    def inner(self) -> Environment:
        """The wrapped task environment."""
        return self._env

    @property
    def tools(self) -> list[dict]:
        return self._env.tools

    @property
    def num_instances(self) -> int:
        return self._env.num_instances

    def __getattr__(self, name: str) -> Any:  # item(), describe(), ... of the task
        return getattr(self._env, name)

    def start(self, index: int) -> Start:
        start = self._env.start(index)
        if self.num_instances < 2:
            return start
        # The next instance of the same level (indices cycle through the task's levels).
        stride = len(getattr(self._env, "levels", ())) or 1
        demo = self._demo((index + stride) % self.num_instances)
        head = start.messages[:1] if start.messages[0].role == "system" else []
        rest = start.messages[len(head) :]
        # Opening messages every instance starts with (a task's fixed example, e.g. kg's
        # one-shot) are shown once, before the demo; the episode's last one always follows it.
        shared = 0
        while shared < min(len(rest) - 1, len(demo)) and demo[shared] == rest[shared]:
            shared += 1
        messages = head + rest[:shared] + demo[shared:] + rest[shared:]
        return Start(session=start.session, messages=messages)

    def interact(self, session: Any, message: ChatMessage) -> Step:
        return self._env.interact(session, message)

    def cancel(self, session: Any) -> None:
        self._env.cancel(session)

    def _demo(self, index: int) -> list[ChatMessage]:
        with self._lock:
            if index in self._demos:
                return self._demos[index]
        from agentrl.environments._check import agent_message

        start = self._env.start(index)
        messages = [m for m in start.messages if m.role != "system"]
        finished = False
        try:
            actions = self._teacher(self._env, index, random.Random(index))
            for _, call in zip(range(self._steps), actions, strict=False):
                step = self._env.interact(start.session, agent_message(call))
                messages.append(ChatMessage(role="assistant", content=_call_text(call)))
                messages += step.messages
                if step.finish:
                    finished = True
                    break
        finally:
            if not finished:
                self._env.cancel(start.session)
        with self._lock:
            return self._demos.setdefault(index, messages)


def with_demo(env: Environment, task: str, demo: bool | int) -> Environment:
    """``env`` with oracle demos of ``demo`` steps (True: 2); ``env`` itself for False/0."""
    if demo is False or demo == 0:
        return env
    return DemoPrompt(env, task, steps=2 if demo is True else int(demo))
