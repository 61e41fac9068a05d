"""The rollout's side of the env worker registry: report live sessions, take lost notices.

`RolloutSessions` gathers the live sessions of a rollout actor's remote
environments (`RemoteEnvironment.sessions`), publishes them as a
`SessionReport` (routing key ``sessions.rollout`` on the control exchange)
every ``interval`` seconds from its own thread, and subscribes to the
controller's `SessionsLost` notices for this actor (``lost.<rollout id>``):
each named session is aborted, so the episode using it ends at once as an
infra failure and is retried on a fresh environment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import structlog

from agentrl.environments._remote import RemoteEnvironment
from agentrl.messages import (
    Delivery,
    SessionReport,
    SessionsLost,
    Topology,
    TransportError,
    encode,
)

from ._wire import broadcast_nowait, decode_or_dead_letter, subscribe

log = structlog.get_logger(__name__)

__all__ = ["RolloutSessions"]


class RolloutSessions:
    """Reports a rollout actor's remote sessions and applies the controller's notices."""

    def __init__(
        self,
        transport,
        run: str,
        *,
        rollout_id: str,
        concurrency: int,
        envs: Mapping[str, RemoteEnvironment],
        interval: float,
    ) -> None:
        self._transport = transport
        self._run = run
        self._control = Topology(run).control
        self._id = rollout_id
        self._concurrency = concurrency
        self._envs = dict(envs)
        self._interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"{rollout_id}-sessions", daemon=True
        )

    def start(self) -> None:
        subscribe(self._transport, self._control, self._on_lost, routing_key=f"lost.{self._id}")
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def aborted(self) -> int:
        """Sessions ended by the controller's notices so far."""
        return sum(env.aborted for env in self._envs.values())

    def report(self) -> SessionReport:
        live = [s for env in self._envs.values() for s in env.sessions()]
        return SessionReport(
            reporter=self._id,
            role="rollout",
            at=time.time(),
            task="",
            capacity=self._concurrency,
            session_ids=[s.session_id for s in live],
            idle=[s.idle for s in live],
            workers=[s.worker_id for s in live],
            episodes=[s.episode_id for s in live],
            tasks=[s.task for s in live],
        )

    def send(self) -> None:
        """Publish one report now (never raises: a lost report only ages the registry)."""
        body = encode(self.report(), run=self._run)
        try:
            broadcast_nowait(self._transport, self._control, "sessions.rollout", body)
        except TransportError as exc:
            level = log.debug if self._stopping.is_set() else log.warning
            level("session report not sent", actor=self._id, error=repr(exc))

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval):
            self.send()

    def _on_lost(self, delivery: Delivery) -> None:
        """Broker I/O thread: abort each named session (fast: it only fails a future)."""
        msg = decode_or_dead_letter(delivery, SessionsLost)
        if msg is None:
            return
        notice = msg.payload
        for sid, reason in zip(notice.session_ids, notice.reasons, strict=True):
            held = [env.abort(sid, reason) for env in self._envs.values()]
            log.info("session lost", actor=self._id, session=sid, reason=reason, held=any(held))
        delivery.ack()
