"""Environment workers: a task's sessions served over the broker, and the client side.

`EnvWorker` serves one task (``agentrl-env-worker --task NAME --broker URL
--capacity N``):

- ``EnvStart`` arrives on the task's shared queue ``<run>.env.<task>``. The
  worker starts the session, replies (`EnvReply` with its ``worker_id``) and
  keeps the start message *unacked until the session ends*: with prefetch =
  capacity, the broker hands new sessions only to workers with a free slot, so
  load goes to the least-loaded worker, and a worker never holds more than
  ``capacity`` sessions.
- ``EnvInteract`` / ``EnvCancel`` arrive on the worker's own exclusive queue
  ``<run>.env.worker.<id>``; the reply goes back through reply-to.
- Sessions idle for ``idle_timeout`` seconds are cancelled (their client is
  gone), freeing the slot. A start that was *redelivered* (its first worker died)
  may belong to a client that already gave up, so its session gets
  ``orphan_timeout`` instead: a waiting client interacts at once.
- Starts and interactions run on a pool of ``capacity`` threads, never on the
  connection's I/O thread.
- A `Heartbeat` (role ``env``, label ``task``, gauge ``sessions``) and a
  `SessionReport` (its session ids and their idle seconds) every
  ``heartbeat_interval`` seconds tell the controller the worker is alive and
  what it holds. The controller's registry reconciles that table with the
  rollouts' and may send an `EnvCancel` (orphan, idle) on the worker's queue.
  The worker's own idle and orphan timers stay as a backstop for a run whose
  controller is down; whichever rule fires first ends the session, with the same
  effect (see docs/internals.md, "Environment worker registry").

`RemoteEnvironment` (the client side, in `_remote.py`) is re-exported here.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import (
    Environment,
    InfraError,
    SampleError,
    Status,
    Step,
    session_tools,
)
from agentrl.messages import (
    Delivery,
    EnvCancel,
    EnvInteract,
    EnvReply,
    EnvStart,
    Heartbeat,
    MessageError,
    SessionReport,
    Topology,
    TransportError,
    connect,
    decode,
    encode,
)

from ._remote import UNKNOWN_SESSION, RemoteEnvironment, task_queue, worker_queue

__all__ = ["UNKNOWN_SESSION", "EnvWorker", "RemoteEnvironment", "task_queue", "worker_queue"]

log = structlog.get_logger(__name__)


@dataclass
class _Held:
    session: Any
    start: Delivery
    """The EnvStart delivery, acked when the session ends (it holds the slot)."""
    last_used: float
    idle_limit: float


class EnvWorker:
    """Serves one task's sessions over the broker (see module doc)."""

    def __init__(
        self,
        env: Environment,
        *,
        broker: str,
        run: str,
        task: str,
        capacity: int,
        worker_id: str | None = None,
        idle_timeout: float = 600.0,
        orphan_timeout: float = 30.0,
        heartbeat_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.env = env
        self.run, self.task, self.capacity = run, task, capacity
        self.worker_id = worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self._idle = idle_timeout
        self._orphan = min(orphan_timeout, idle_timeout)
        self._pool = ThreadPoolExecutor(capacity, thread_name_prefix=f"env-{task}")
        self._interval = heartbeat_interval
        self._clock = clock  # session idle times (a test may pass a fake clock)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Held] = {}
        self._stopping = threading.Event()
        self._log = log.bind(role="env", actor=self.worker_id, task=task)
        self._transport = connect(broker, name=f"{run}-env-{self.worker_id}")
        self._transport.declare_queue(task_queue(run, task))
        self._own = self._transport.declare_queue(
            worker_queue(run, self.worker_id), exclusive=True, dead_letter=False
        )
        self._transport.consume(
            self._own, lambda d: self._pool.submit(self._on_session_message, d), prefetch=64
        )
        self._transport.consume(
            task_queue(run, task), lambda d: self._pool.submit(self._on_start, d), prefetch=capacity
        )
        self._thread = threading.Thread(target=self._housekeeping, daemon=True)
        self._thread.start()
        self._log.info("env worker started", capacity=capacity)

    @property
    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def serve_forever(self) -> None:
        self._stopping.wait()

    def close(self) -> None:
        """Stop; sessions held are lost to their clients (they see InfraError and retry)."""
        self._stopping.set()
        self._thread.join()
        self._transport.close()  # unacked starts go back to the queue
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- requests (pool threads) -------------------------------------------------------

    def _on_start(self, delivery: Delivery) -> None:
        try:
            msg = decode(delivery.body, expect=EnvStart)
        except MessageError as exc:
            self._log.warning(
                "malformed message dead-lettered", queue=delivery.queue, reason=str(exc)
            )
            delivery.dead_letter(str(exc))
            return
        req = msg.payload
        try:
            start = self.env.start(req.index)
        except (IndexError, InfraError, SampleError, ValueError) as exc:
            self._reply(delivery, req.session_id, [], Status.TASK_ERROR, finish=True)
            self._log.warning("session not started", index=req.index, error=str(exc))
            delivery.ack()
            return
        limit = self._orphan if delivery.redelivered else self._idle
        with self._lock:
            self._sessions[req.session_id] = _Held(start.session, delivery, self._clock(), limit)
        self._reply_step(
            delivery,
            req.session_id,
            Step(start.messages, Status.RUNNING, 0.0, False, {}),
            tools=session_tools(self.env, start),
        )

    def _on_session_message(self, delivery: Delivery) -> None:
        try:
            msg = decode(delivery.body, expect=(EnvInteract, EnvCancel))
        except MessageError as exc:
            self._log.warning(
                "malformed message dead-lettered", queue=delivery.queue, reason=str(exc)
            )
            delivery.dead_letter(str(exc))
            return
        sid = msg.payload.session_id
        with self._lock:
            held = self._sessions.get(sid)
            if held is not None:
                held.last_used = self._clock()
        if isinstance(msg.payload, EnvCancel) or held is None:
            if held is not None:
                self._end(sid, cancel=True)
            if held is not None:
                self._reply(delivery, sid, [], Status.CANCELLED, finish=True)
            else:
                step = Step([], Status.TASK_ERROR, 0.0, True, {UNKNOWN_SESSION: 1.0})
                self._reply_step(delivery, sid, step)
            delivery.ack()
            return
        step = self.env.interact(held.session, msg.payload.message)
        self._reply_step(delivery, sid, step)
        if step.finish:
            self._end(sid, cancel=False)
        delivery.ack()

    # --- helpers -----------------------------------------------------------------------

    def _end(self, sid: str, *, cancel: bool) -> None:
        with self._lock:
            held = self._sessions.pop(sid, None)
        if held is None:
            return
        if cancel:
            self.env.cancel(held.session)
        held.start.ack()  # frees the slot: the broker may deliver the next start

    def _reply(self, delivery, sid, messages, status: Status, *, finish: bool) -> None:
        self._reply_step(delivery, sid, Step(messages, status, 0.0, finish, {}))

    def _reply_step(
        self, delivery: Delivery, sid: str, step: Step, *, tools: list[dict] | None = None
    ) -> None:
        reply = EnvReply(
            session_id=sid,
            worker_id=self.worker_id,
            messages=step.messages,
            tools=self.env.tools if tools is None else tools,
            status=str(step.status),
            reward=float(step.reward),
            finish=step.finish,
            metrics=dict(step.metrics),
        )
        if not delivery.reply_to:
            return  # a cancel sent without waiting for the answer
        sent = self._transport.reply(delivery, encode(reply, run=self.run))
        sent.add_done_callback(
            lambda f: (
                f.exception()
                and self._log.info(
                    "reply not delivered (client gone)", session=sid, error=repr(f.exception())
                )
            )
        )

    def _housekeeping(self) -> None:
        """Heartbeats and idle-session expiry."""
        while not self._stopping.wait(min(self._interval, self._orphan / 2)):
            now = self._clock()
            with self._lock:
                idle = [
                    sid for sid, h in self._sessions.items() if now - h.last_used > h.idle_limit
                ]
            for sid in idle:
                self._log.info("idle session expired", session=sid)
                self._end(sid, cancel=True)
            beat = Heartbeat(
                node=socket.gethostname(),
                role="env",
                actor_id=self.worker_id,
                at=time.time(),
                state={"sessions": float(self.sessions), "capacity": float(self.capacity)},
                labels={"task": self.task, "event": "alive"},
            )
            try:
                control = Topology(self.run).control
                self._transport.publish(control, "heartbeat.env", encode(beat, run=self.run))
                report = encode(self.report(), run=self.run)
                self._transport.publish(control, "sessions.env", report)
            except TransportError as exc:
                self._log.debug("heartbeat not sent", error=repr(exc))

    def report(self) -> SessionReport:
        """The sessions held now, for the controller's registry."""
        now = self._clock()
        with self._lock:
            held = [(sid, now - h.last_used) for sid, h in self._sessions.items()]
        return SessionReport(
            reporter=self.worker_id,
            role="env",
            at=time.time(),
            task=self.task,
            capacity=self.capacity,
            session_ids=[sid for sid, _ in held],
            idle=[idle for _, idle in held],
        )
