"""The live progress line: version, episodes/s, reward per task, queue depths.

Every line says what this node's episodes are doing (`EpisodeTally`): how many are in
flight (played by its rollouts, or open on its endpoint) and how many finished since the
last update (the checkpoints fanout marks each version), so the minutes an update takes
are not a repeated line. Served episodes (the ``serve`` role) are counted like the
rollouts' own.

Before the learner's first update there are no batch metrics yet; the line then shows
what this node has finished so far: episodes (beside the episodes per update; the
rollouts run ahead while the first update trains, so the count may pass it), and per
task reward and success, so the first minutes are not a row of queue depths.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from collections.abc import Callable

import structlog

from agentrl.actors import decode_or_dead_letter, is_success, subscribe
from agentrl.messages import (
    CheckpointReady,
    Delivery,
    Topology,
    Trajectory,
    Transport,
    TransportError,
)

log = structlog.get_logger(__name__)

__all__ = ["EpisodeTally", "Progress", "format_progress", "format_summary"]


class EpisodeTally:
    """Episodes this node finished since the run (re)started: per task the count, the reward
    sum and the successes; untrained ones (infra or sample errors) apart. Beside them the
    episodes in flight and those finished since the last update (`mark`). `add` and
    `running` are called from rollout and endpoint threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
        self._untrained = 0
        self._running = 0
        self._open: list[Callable[[], int]] = []
        self._since = 0
        self.version: int | None = None
        """The newest version announced since the start (`mark`); None before any."""

    def running(self, change: int) -> None:
        """An episode began (+1) or left this node's hands (-1): a rollout's ``on_running``."""
        with self._lock:
            self._running += change

    def count_open(self, source: Callable[[], int]) -> None:
        """Add ``source()`` (e.g. the endpoint's open episodes) to the episodes in flight."""
        self._open.append(source)

    def in_flight(self) -> int:
        with self._lock:
            running = self._running
        return running + sum(source() for source in self._open)

    def mark(self, version: int) -> None:
        """Version ``version`` was announced: the count since the last update restarts."""
        with self._lock:
            if self.version is None or version > self.version:
                self.version = version
                self._since = 0

    def finished_since_update(self) -> int:
        """Episodes finished (trained or not) since the last `mark` (or since the start)."""
        with self._lock:
            return self._since

    def add(self, t: Trajectory) -> None:
        with self._lock:
            self._since += 1
            if "infra_failure" in t.metrics or "sample_error" in t.metrics:
                self._untrained += 1
                return
            row = self._tasks[t.task]
            row[0] += 1
            row[1] += t.reward
            row[2] += is_success(t)

    def snapshot(self) -> dict[str, tuple[int, float, float]]:
        """task -> (episodes, mean reward, success rate); ``"untrained"`` -> (count, 0, 0)."""
        with self._lock:
            out = {t: (int(n), r / n, k / n) for t, (n, r, k) in sorted(self._tasks.items())}
            if self._untrained:
                out["untrained"] = (self._untrained, 0.0, 0.0)
            return out


def format_progress(
    metrics: dict[str, float],
    depths: dict[str, int],
    tally: dict[str, tuple[int, float, float]] | None = None,
    *,
    start_version: int = 0,
    batch_episodes: int = 0,
    flight: tuple[int, int] | None = None,
    announced: int | None = None,
) -> str:
    """One line, e.g. `v3 | 0.52 ep/s | calculator r=+0.41 s=0.50 | idle 12% | 4 in flight,
    6 finished since v3 | q episodes=4`; before the first update (no ``version`` in
    ``metrics``, none ``announced`` past ``start_version``), e.g. `v8 | before the first
    update: 5 episodes (16 per update), 4 in flight | db 3 r=+0.33 s=0.33 | ...` from
    ``tally`` (see the module doc). ``flight``: (episodes in flight, finished since the last
    update); ``announced``: the newest version the checkpoints fanout announced."""
    newest = max(start_version, announced if announced is not None else start_version)
    in_flight, since = flight if flight is not None else (None, None)
    if "version" not in metrics and tally is not None and newest == start_version:
        done = sum(n for task, (n, _, _) in tally.items() if task != "untrained")
        # the rollouts run ahead while the first update trains: done may exceed the batch
        head = f"before the first update: {done} episodes ({batch_episodes} per update)"
        if in_flight is not None:
            head += f", {in_flight} in flight"
        parts = [f"v{start_version}", head]
        for task, (n, reward, success) in tally.items():
            if task == "untrained":
                parts.append(f"untrained {n}")
            else:
                parts.append(f"{task} {n} r={reward:+.2f} s={success:.2f}")
        if depths:
            parts.append("q " + " ".join(f"{k}={v}" for k, v in depths.items()))
        return " | ".join(parts)
    version = int(metrics.get("version", newest))
    parts = [f"v{version}"]
    if "rollout/episodes_per_s" in metrics:
        parts.append(f"{metrics['rollout/episodes_per_s']:.2f} ep/s")
    tasks = sorted(
        k.split("/")[1] for k in metrics if k.startswith("env/") and k.endswith("/reward")
    )
    for task in tasks:
        r = metrics[f"env/{task}/reward"]
        s = metrics.get(f"env/{task}/success", 0.0)
        parts.append(f"{task} r={r:+.2f} s={s:.2f}")
    if "learner/step_time" in metrics:
        parts.append(f"step {metrics['learner/step_time']:.1f}s")
    if "learner/idle_ratio" in metrics:
        parts.append(f"idle {100 * metrics['learner/idle_ratio']:.0f}%")
    if flight is not None:
        parts.append(f"{in_flight} in flight, {since} finished since v{max(version, newest)}")
    if depths:
        parts.append("q " + " ".join(f"{k}={v}" for k, v in depths.items()))
    return " | ".join(parts)


def format_summary(
    run: str, tally: dict[str, tuple[int, float, float]], first: int, last: int
) -> str:
    """The end-of-run lines: versions trained, then per task the episodes this node finished,
    their mean reward and success rate, e.g.::

        run local: v0 -> v12, 192 episodes on this node
          calculator   192 episodes  reward +0.43  success 0.56
    """
    done = sum(n for task, (n, _, _) in tally.items() if task != "untrained")
    lines = [f"run {run}: v{first} -> v{last}, {done} episodes on this node"]
    width = max((len(t) for t in tally), default=0)
    for task, (n, reward, success) in tally.items():
        if task == "untrained":
            lines.append(f"  {task:<{width}} {n:5d} episodes  (infra or sample errors)")
        else:
            lines.append(
                f"  {task:<{width}} {n:5d} episodes  reward {reward:+.2f}  success {success:.2f}"
            )
    return "\n".join(lines)


class Progress:
    """Reads queue depths over its own connection and prints the progress line; follows the
    checkpoints fanout for the tally's count since the last update (the run's topology must
    be declared on ``transport``)."""

    def __init__(
        self,
        transport: Transport,
        topology: Topology,
        pools: tuple[str, ...],
        *,
        tally: EpisodeTally | None = None,
        start_version: int = 0,
        batch_episodes: int = 0,
    ) -> None:
        self._transport = transport
        self.tally = tally if tally is not None else EpisodeTally()
        """Fed by this node's rollouts (their ``on_episode``)."""
        self._start_version = start_version
        self._batch_episodes = batch_episodes
        self._queues = {
            "episodes": topology.episodes,
            "trajectories": topology.trajectories,
            **{f"gen.{p}": topology.generate_queue(p) for p in pools},
        }
        subscribe(transport, topology.checkpoints, self._on_checkpoint)

    def depths(self) -> dict[str, int]:
        out = {}
        for label, queue in self._queues.items():
            try:
                out[label] = self._transport.queue_depth(queue)
            except TransportError as exc:
                log.warning("queue depth unavailable", queue=queue, error=str(exc))
        return out

    def _on_checkpoint(self, delivery: Delivery) -> None:
        """A version was announced (I/O thread): the tally's count since the update restarts."""
        msg = decode_or_dead_letter(delivery, CheckpointReady)
        if msg is None:
            return
        delivery.ack()
        self.tally.mark(msg.payload.version)

    def line(self, metrics: dict[str, float]) -> str:
        tally = self.tally
        return format_progress(
            metrics,
            self.depths(),
            tally.snapshot(),
            start_version=self._start_version,
            batch_episodes=self._batch_episodes,
            flight=(tally.in_flight(), tally.finished_since_update()),
            announced=tally.version,
        )

    def print_line(self, metrics: dict[str, float]) -> None:
        print(self.line(metrics), file=sys.stderr, flush=True)

    def close(self) -> None:
        self._transport.close()
