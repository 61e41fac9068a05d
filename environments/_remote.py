"""`RemoteEnvironment`: the Environment a rollout actor uses for a task served by env workers.

``start`` is an RPC on the task queue ``<run>.env.<task>``, ``interact`` an RPC
on the queue of the worker that holds the session. A worker that dies (its
exclusive queue disappears, or it does not answer within ``timeout``) becomes
`InfraError`, which the rollout turns into a retry of the whole episode on a
fresh environment.

It also keeps the table of its live sessions (`sessions()`, reported to the
controller) and takes the controller's verdict that a session is gone
(`abort`): a call waiting on that session fails at once with `InfraError`, and
so does the next one, instead of waiting for ``timeout``.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

import structlog

from agentrl.messages import (
    EnvCancel,
    EnvInteract,
    EnvReply,
    EnvStart,
    TransportError,
    Unroutable,
    decode,
    encode,
)

from ._protocol import InfraError, Start, Status, Step

__all__ = ["UNKNOWN_SESSION", "LiveSession", "RemoteEnvironment", "task_queue", "worker_queue"]

log = structlog.get_logger(__name__)

UNKNOWN_SESSION = "env/unknown_session"
"""Metric set on the reply to a session the worker does not hold (it restarted)."""


def task_queue(run: str, task: str) -> str:
    return f"{run}.env.{task}"


def worker_queue(run: str, worker_id: str) -> str:
    return f"{run}.env.worker.{worker_id}"


@dataclass(frozen=True)
class LiveSession:
    """One session a RemoteEnvironment holds, as reported to the controller."""

    session_id: str
    worker_id: str
    episode_id: str
    task: str
    idle: float
    """Seconds since its start or last interact."""


@dataclass
class _Live:
    worker: str
    episode: str
    last: float
    waiter: Future | None = None
    lost: str | None = None
    """Why the controller declared it gone (set by `abort`)."""


class RemoteEnvironment:
    """The Environment of a task served by `EnvWorker`s (see module doc)."""

    def __init__(self, transport, run: str, task: str, *, timeout: float = 60.0) -> None:
        self._transport = transport
        self._run, self._task, self._timeout = run, task, timeout
        self._tools: list[dict] = []
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        self.aborted = 0
        """Sessions ended by `abort` (the controller's notice)."""

    @property
    def tools(self) -> list[dict]:
        """The task's tool schemas, as the last reply gave them."""
        return list(self._tools)

    @property
    def num_instances(self) -> int:
        raise NotImplementedError("a remote task's instance count comes from its local copy")

    def start(self, index: int, *, episode: str = "") -> Start:
        sid = uuid.uuid4().hex
        reply = self._call(task_queue(self._run, self._task), EnvStart(sid, self._task, index))
        if reply.finish:
            raise InfraError(f"{self._task} instance {index}: the worker could not start it")
        self._tools = list(reply.tools)
        with self._lock:
            self._live[sid] = _Live(reply.worker_id, episode, time.monotonic())
        return Start(
            session=(sid, reply.worker_id), messages=list(reply.messages), tools=list(reply.tools)
        )

    def interact(self, session, message) -> Step:
        sid, worker = session
        waiter: Future = Future()
        with self._lock:
            live = self._live.get(sid)
            if live is not None:
                if live.lost is not None:
                    del self._live[sid]
                    raise InfraError(f"session {sid} on {worker}: {live.lost}")
                live.waiter, live.last = waiter, time.monotonic()
        try:
            reply = self._call(worker_queue(self._run, worker), EnvInteract(sid, message), waiter)
        except InfraError:
            self._forget(sid)
            raise
        if reply.metrics.get(UNKNOWN_SESSION):
            self._forget(sid)
            raise InfraError(f"worker {worker} no longer holds session {sid}")
        if reply.finish:
            self._forget(sid)
        else:
            with self._lock:
                if sid in self._live:
                    self._live[sid].waiter, self._live[sid].last = None, time.monotonic()
        return Step(
            messages=list(reply.messages),
            status=Status(reply.status),
            reward=reply.reward,
            finish=reply.finish,
            metrics=dict(reply.metrics),
        )

    def cancel(self, session) -> None:
        """Best effort: a worker that is gone has nothing left to cancel."""
        sid, worker = session
        self._forget(sid)
        body = encode(EnvCancel(sid), run=self._run)
        try:
            self._transport.publish("", worker_queue(self._run, worker), body).result(10)
        except (Unroutable, TransportError, TimeoutError) as exc:
            log.debug("cancel not delivered", session=sid, error=repr(exc))

    # --- the registry's side -------------------------------------------------------------

    def sessions(self) -> list[LiveSession]:
        """The live sessions, for the rollout's `SessionReport`."""
        now = time.monotonic()
        with self._lock:
            return [
                LiveSession(sid, s.worker, s.episode, self._task, now - s.last)
                for sid, s in self._live.items()
                if s.lost is None
            ]

    def abort(self, session_id: str, reason: str) -> bool:
        """End a session the controller declared gone; False if it is not held (any more).

        A call waiting on it fails now with InfraError; a later one fails at once.
        Safe from any thread (the rollout calls it on its broker I/O thread).
        """
        with self._lock:
            live = self._live.get(session_id)
            if live is None or live.lost is not None:
                return False
            live.lost, waiter = reason, live.waiter
            self.aborted += 1
        if waiter is not None:
            _settle(waiter, exc=InfraError(f"session {session_id} on {live.worker}: {reason}"))
        return True

    def _forget(self, sid: str) -> None:
        with self._lock:
            self._live.pop(sid, None)

    def _call(self, queue: str, payload, waiter: Future | None = None) -> EnvReply:
        body = encode(payload, run=self._run)
        waiter = waiter or Future()
        try:
            sent = self._transport.call("", queue, body, timeout=self._timeout)
            sent.add_done_callback(lambda f: _settle(waiter, source=f))
            delivery = waiter.result(self._timeout + 5)
        except (Unroutable, TransportError, TimeoutError) as exc:
            raise InfraError(f"{queue}: no environment worker answered ({exc!r})") from exc
        return decode(delivery.body, expect=EnvReply).payload


def _settle(waiter: Future, *, source: Future | None = None, exc: BaseException | None = None):
    """Complete ``waiter`` from ``source`` (or with ``exc``) unless it is already done."""
    if source is not None:
        exc = source.exception()
    try:
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(source.result())
    except InvalidStateError:
        pass  # the other side (reply or abort) settled it first; that outcome stands
