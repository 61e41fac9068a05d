"""Heartbeats: every actor tells the controller, on the control exchange, that it is alive.

`HeartbeatSender` publishes a `Heartbeat` (routing key ``heartbeat.<role>``)
when asked (`beat(event, **gauges)`) and every ``interval`` seconds from its own
thread, with the gauges of ``state()``. Publishing never blocks the caller and
never raises: a lost beat only makes the controller's table a little older.

`ActorTable` is that table: the newest beat of each actor, read for the samplers'
versions per pool and the run's status.
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


class ActorTable:
    """The controller's table of the run's actors, from their heartbeats: the newest beat
    of each, the version each sampler serves (per pool) and which actors are alive."""

    def __init__(self) -> None:
        self._beats: dict[str, Heartbeat] = {}  # actor id -> its latest heartbeat

    def observe(self, beat: Heartbeat) -> None:
        """Keep ``beat`` unless its actor's known beat is newer (beats may cross)."""
        known = self._beats.get(beat.actor_id)
        if known is None or beat.at >= known.at:
            self._beats[beat.actor_id] = beat

    def samplers(self) -> dict[str, dict]:
        """Sampler id -> its last heartbeat: pool, node, served version, age in seconds."""
        now = time.time()
        return {
            sid: {
                "pool": beat.labels.get("pool", ""),
                "node": beat.node,
                "version": int(beat.state.get("version", -1)),
                "served": int(beat.state.get("served", 0)),
                "age": now - beat.at,
            }
            for sid, beat in self._beats.items()
            if beat.role == "sampler"
        }

    def pool_versions(self) -> dict[str, list[int]]:
        """Pool -> the versions its samplers serve (sorted, one entry per sampler)."""
        out: dict[str, list[int]] = {}
        for info in self.samplers().values():
            out.setdefault(info["pool"], []).append(info["version"])
        return {pool: sorted(versions) for pool, versions in out.items()}

    def liveness(self, alive_within: float) -> dict[str, float]:
        """``actors/<node>/<role>/<alive|silent>``: actors whose last heartbeat is younger
        (older) than ``alive_within`` seconds; ``rollout/idle_ratio``: the mean of the
        alive rollouts' (when they report one)."""
        now = time.time()
        out: dict[str, float] = {}
        idle = []
        for beat in self._beats.values():
            state = "alive" if now - beat.at < alive_within else "silent"
            key = f"actors/{beat.node}/{beat.role}/{state}"
            out[key] = out.get(key, 0.0) + 1
            if beat.role == "rollout" and state == "alive" and "idle_ratio" in beat.state:
                idle.append(beat.state["idle_ratio"])
        if idle:
            out["rollout/idle_ratio"] = sum(idle) / len(idle)
        return out

    def pool_status(self) -> dict[str, float]:
        """``pool/<pool>/samplers``, ``version_min`` and ``version_max``."""
        out: dict[str, float] = {}
        for pool, versions in self.pool_versions().items():
            out[f"pool/{pool}/samplers"] = float(len(versions))
            out[f"pool/{pool}/version_min"] = float(min(versions))
            out[f"pool/{pool}/version_max"] = float(max(versions))
        return out
