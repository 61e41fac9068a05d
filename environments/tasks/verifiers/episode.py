"""One verifiers episode run in its own thread and event loop, one model message at a time.

verifiers' Env drives an episode (``env.setup(agents)``, ``env.run(task, agents)``,
``env.finalize(task, episode)``, ``env.py`` ``Env.run_episode``) and calls the model when it
needs a reply; agentrl's Environment protocol is the other way round: the rollout calls
``interact`` with each reply. `Episode` joins the two: the Env's coroutines run in a
thread of their own, and each time the seat asks the model (`seat.Rollout.ask`) the
episode hands the new messages to agentrl and waits for the reply, so the Env's own
control flow (its loop, its game engine, its scoring) runs unchanged between messages.

`open` returns the opening messages, `reply` one assistant message's outcome: `Shown` (the
model's turn again) or `Ended` (the verdict). A verifiers failure (setup, ``run()``,
scoring raising) is `Ended` with ``error`` set; an episode the environment does not answer
within ``timeout`` seconds raises InfraError.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import structlog

from agentrl.environments._protocol import InfraError
from agentrl.environments.tasks.verifiers.library import load
from agentrl.environments.tasks.verifiers.seat import Seat, Unsupported, to_chat
from agentrl.messages import ChatMessage

__all__ = ["Ended", "Episode", "Shown"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Shown:
    """The episode goes on: messages for the model, which answers next."""

    messages: list[ChatMessage]
    """The new messages since the model's last reply (all of them at the opening)."""


@dataclass(frozen=True)
class Ended:
    """The episode is over: verifiers' verdict on it."""

    messages: list[ChatMessage]
    """Tool results of the last reply, if the episode ended on them."""
    traces: list[Any] = field(default_factory=list)
    """The scored ``vf.Trace`` of each rollout (one for a single-seat Env)."""
    error: str | None = None
    """Why verifiers could not finish the episode (None when it did)."""
    unsupported: str | None = None
    """A verifiers feature the task uses that agentrl cannot play (None when none)."""
    bad_calls: int = 0
    """Tool calls answered with an error (unreadable, unknown tool, bad arguments)."""


class Episode:
    """One task played by the source's Env (module doc); not thread-safe for one episode,
    independent across episodes."""

    def __init__(self, source: Any, task: Any, *, max_turns: int, timeout: float) -> None:
        self._source, self._task, self._timeout = source, task, timeout
        self._out: queue.Queue[Shown | Ended] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.Future | None = None
        self._main: asyncio.Task | None = None
        self._over = False
        self._seat = Seat(source.role, source.seat, source.taskset, max_turns, self._ask)
        self._thread = threading.Thread(target=self._thread_main, daemon=True, name="vf-episode")

    def open(self) -> Shown | Ended:
        """Start the episode; its opening messages (or its end, when it fails to open)."""
        self._thread.start()
        return self._wait()

    def reply(self, message: ChatMessage) -> Shown | Ended:
        """Hand the model's reply to the episode; what follows it."""
        loop, pending = self._loop, self._next
        assert loop is not None and pending is not None, "reply before the model was asked"
        self._next = None
        loop.call_soon_threadsafe(_resolve, pending, message)
        return self._wait()

    def tools(self) -> list[dict]:
        """The tool schemas of the rollout the model plays (after `open`)."""
        rollouts = self._seat.rollouts
        return list(rollouts[-1].schemas) if rollouts else []

    def cancel(self) -> None:
        """Stop the episode wherever it is (waiting for the model or in the Env's own code:
        its coroutine is cancelled); idempotent."""
        loop, main = self._loop, self._main
        self._over = True
        self._next = None
        if loop is not None and main is not None:
            try:
                loop.call_soon_threadsafe(main.cancel)
            except RuntimeError:  # its loop has closed: the episode is over already
                log.debug("verifiers episode ended before its cancel", task=self._source.id)

    def _wait(self) -> Shown | Ended:
        try:
            outcome = self._out.get(timeout=self._timeout)
        except queue.Empty:
            self.cancel()
            raise InfraError(
                f"{self._source.id}: the verifiers episode did not answer in {self._timeout:g} s"
            ) from None
        if isinstance(outcome, Ended):
            self._over = True
        return outcome

    # --- the episode's own thread -------------------------------------------------

    def _thread_main(self) -> None:
        asyncio.run(self._run())

    async def _ask(self, messages: list[ChatMessage]) -> ChatMessage:
        self._next = pending = asyncio.get_running_loop().create_future()
        self._out.put(Shown(messages))
        return await pending

    async def _run(self) -> None:
        self._main = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        if self._over:  # cancelled before the thread got here
            return
        m = load()
        env, task = self._source.env, self._task
        agents = _Agents(self._source.role, self._seat)
        try:
            await env.setup(agents)
            await env.run(task, agents)
            traces = [r.trace for r in self._seat.rollouts]
            if not traces:
                raise ValueError(f"{type(env).__name__}.run() ran no agent")
            episode = m.vf.Episode(
                env=m.vf.EnvInfo(id=env.config.env_id),
                task=traces[0].task,
                traces=traces,
            )
            await env.finalize(task, episode)
        except asyncio.CancelledError:  # our own cancel(): the episode just stops
            return
        except Unsupported as exc:
            self._out.put(Ended([], unsupported=str(exc)))
            return
        except Exception as exc:  # any failure of the Env's or task's code ends the episode
            log.warning("verifiers episode failed", task=self._source.id, error=repr(exc))
            self._out.put(Ended([], error=f"{type(exc).__name__}: {exc}", bad_calls=self._bad()))
            return
        self._out.put(Ended(self._last_tools(), traces=traces, bad_calls=self._bad()))

    def _bad(self) -> int:
        return sum(r.bad_calls for r in self._seat.rollouts)

    def _last_tools(self) -> list[ChatMessage]:
        """Tool results the model has not seen: a stop or limit ended the episode on them."""
        if not self._seat.rollouts:
            return []
        conversation = self._seat.rollouts[-1].conversation
        tail: list[Any] = []
        for message in reversed(conversation):
            if message.role != "tool":
                break
            tail.append(message)
        return [to_chat(x) for x in reversed(tail)]


def _resolve(pending: asyncio.Future, value: Any) -> None:
    if not pending.done():
        pending.set_result(value)


class _Agents:
    """``vf.Agents``' surface for one seat: ``agents.<role>``."""

    def __init__(self, role: str, seat: Seat) -> None:
        self._role, self._seat = role, seat

    def __getattr__(self, name: str) -> Seat:
        if name == self._role:
            return self._seat
        raise AttributeError(f"this Env seats one agent, {self._role!r}, not {name!r}")
