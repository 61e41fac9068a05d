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
- A `Heartbeat` (role ``env``, label ``task``, gauge ``sessions``) every
  ``heartbeat_interval`` seconds tells the controller the worker is alive.

`RemoteEnvironment` is the Environment a rollout actor uses for a remote task:
``start`` is an RPC on the task queue, ``interact`` an RPC on the worker that
holds the session. A worker that dies (its exclusive queue disappears, or it
does not answer within ``timeout``) becomes `InfraError`, which the rollout turns
into a retry of the whole episode on a fresh environment.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import Environment, InfraError, Start, Status, Step
from agentrl.messages import (
    Delivery,
    EnvCancel,
    EnvInteract,
    EnvReply,
    EnvStart,
    Heartbeat,
    MessageError,
    Topology,
    TransportError,
    Unroutable,
    connect,
    decode,
    encode,
)

__all__ = ["EnvWorker", "RemoteEnvironment", "task_queue", "worker_queue"]

log = structlog.get_logger(__name__)


UNKNOWN_SESSION = "env/unknown_session"
"""Metric set on the reply to a session the worker does not hold (it restarted)."""


def task_queue(run: str, task: str) -> str:
    return f"{run}.env.{task}"


def worker_queue(run: str, worker_id: str) -> str:
    return f"{run}.env.worker.{worker_id}"


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
            delivery.dead_letter(str(exc))
            return
        req = msg.payload
        try:
            start = self.env.start(req.index)
        except (IndexError, InfraError, ValueError) as exc:
            self._reply(delivery, req.session_id, [], Status.TASK_ERROR, finish=True)
            self._log.warning("session not started", index=req.index, error=str(exc))
            delivery.ack()
            return
        limit = self._orphan if delivery.redelivered else self._idle
        with self._lock:
            self._sessions[req.session_id] = _Held(start.session, delivery, time.monotonic(), limit)
        self._reply(delivery, req.session_id, start.messages, Status.RUNNING, finish=False)

    def _on_session_message(self, delivery: Delivery) -> None:
        try:
            msg = decode(delivery.body, expect=(EnvInteract, EnvCancel))
        except MessageError as exc:
            delivery.dead_letter(str(exc))
            return
        sid = msg.payload.session_id
        with self._lock:
            held = self._sessions.get(sid)
            if held is not None:
                held.last_used = time.monotonic()
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

    def _reply_step(self, delivery: Delivery, sid: str, step: Step) -> None:
        reply = EnvReply(
            session_id=sid,
            worker_id=self.worker_id,
            messages=step.messages,
            tools=self.env.tools,
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
            now = time.monotonic()
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
                self._transport.publish(
                    Topology(self.run).control, "heartbeat.env", encode(beat, run=self.run)
                )
            except TransportError as exc:
                self._log.debug("heartbeat not sent", error=repr(exc))


class RemoteEnvironment:
    """The Environment of a task served by `EnvWorker`s (see module doc)."""

    def __init__(self, transport, run: str, task: str, *, timeout: float = 60.0) -> None:
        self._transport = transport
        self._run, self._task, self._timeout = run, task, timeout
        self._tools: list[dict] = []

    @property
    def tools(self) -> list[dict]:
        """The task's tool schemas, as the last reply gave them."""
        return list(self._tools)

    @property
    def num_instances(self) -> int:
        raise NotImplementedError("a remote task's instance count comes from its local copy")

    def start(self, index: int) -> Start:
        sid = uuid.uuid4().hex
        reply = self._call(task_queue(self._run, self._task), EnvStart(sid, self._task, index))
        if reply.finish:
            raise InfraError(f"{self._task} instance {index}: the worker could not start it")
        self._tools = list(reply.tools)
        return Start(session=(sid, reply.worker_id), messages=list(reply.messages))

    def interact(self, session, message) -> Step:
        sid, worker = session
        reply = self._call(worker_queue(self._run, worker), EnvInteract(sid, message))
        if reply.metrics.get(UNKNOWN_SESSION):
            raise InfraError(f"worker {worker} no longer holds session {sid}")
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
        body = encode(EnvCancel(sid), run=self._run)
        try:
            self._transport.publish("", worker_queue(self._run, worker), body).result(10)
        except (Unroutable, TransportError, TimeoutError) as exc:
            log.debug("cancel not delivered", session=sid, error=repr(exc))

    def _call(self, queue: str, payload) -> EnvReply:
        body = encode(payload, run=self._run)
        try:
            delivery = self._transport.call("", queue, body, timeout=self._timeout).result(
                self._timeout + 5
            )
        except (Unroutable, TransportError, TimeoutError) as exc:
            raise InfraError(f"{queue}: no environment worker answered ({exc!r})") from exc
        return decode(delivery.body, expect=EnvReply).payload
