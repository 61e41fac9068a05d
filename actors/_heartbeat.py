"""Heartbeats: every actor tells the controller, on the control exchange, that it is alive.

`HeartbeatSender` publishes a `Heartbeat` (routing key ``heartbeat.<role>``)
when asked (`beat(event, **gauges)`) and every ``interval`` seconds from its own
thread, with the gauges of ``state()``. Publishing never blocks the caller and
never raises: a lost beat only makes the controller's table a little older.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from agentrl.messages import Heartbeat, Topology, TransportError, encode

from ._wire import broadcast_nowait

log = structlog.get_logger(__name__)


class HeartbeatSender:
    def __init__(
        self,
        transport,
        run: str,
        *,
        node: str,
        role: str,
        actor_id: str,
        interval: float,
        state: Callable[[], dict[str, float]],
        labels: dict[str, str] | None = None,
    ) -> None:
        self._transport = transport
        self._run = run
        self._exchange = Topology(run).control
        self._node, self._role, self._id = node, role, actor_id
        self._interval = interval
        self._state = state
        self._labels = dict(labels or {})
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"{actor_id}-heartbeat", daemon=True
        )

    def start(self) -> None:
        self.beat("started")
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic beats (call before closing the transport)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self, event: str, **gauges: float) -> None:
        beat = Heartbeat(
            node=self._node,
            role=self._role,
            actor_id=self._id,
            at=time.time(),
            state={**self._state(), **gauges},
            labels={**self._labels, "event": event},
        )
        body = encode(beat, run=self._run)
        try:
            broadcast_nowait(self._transport, self._exchange, f"heartbeat.{self._role}", body)
        except TransportError as exc:
            level = log.debug if self._stopping.is_set() else log.warning
            level("heartbeat not sent", actor=self._id, error=repr(exc))

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval):
            self.beat("alive")
