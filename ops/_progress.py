"""The live progress line: version, episodes/s, reward per task, queue depths.

Before the learner's first update there are no batch metrics yet; the line then shows
what this node's rollouts have finished so far (`EpisodeTally`): episodes (beside the
episodes per update; the rollouts run ahead while the first update trains, so the count
may pass it), and per task reward and success, so the first minutes are not a row of
queue depths.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict

import structlog

from agentrl.actors import is_success
from agentrl.messages import Topology, Trajectory, Transport, TransportError

log = structlog.get_logger(__name__)

__all__ = ["EpisodeTally", "Progress", "format_progress", "format_summary"]


class EpisodeTally:
    """Episodes this node's rollouts finished since the run (re)started: per task the count,
    the reward sum and the successes; untrained ones (infra or sample errors) apart.
    `add` is called from rollout threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
        self._untrained = 0

    def add(self, t: Trajectory) -> None:
        with self._lock:
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
) -> str:
    """One line, e.g. `v3 | 0.52 ep/s | calculator r=+0.41 s=0.50 | idle 12% | q episodes=4`;
    before the first update (no ``version`` in ``metrics``), e.g. `v8 | before the first
    update: 5 episodes (16 per update) | db 3 r=+0.33 s=0.33 | ...` from ``tally`` (see the
    module doc)."""
    if "version" not in metrics and tally is not None:
        done = sum(n for task, (n, _, _) in tally.items() if task != "untrained")
        # the rollouts run ahead while the first update trains: done may exceed the batch
        parts = [f"v{start_version}", f"before the first update: {done} episodes "
                 f"({batch_episodes} per update)"]  # fmt: skip
        for task, (n, reward, success) in tally.items():
            if task == "untrained":
                parts.append(f"untrained {n}")
            else:
                parts.append(f"{task} {n} r={reward:+.2f} s={success:.2f}")
        if depths:
            parts.append("q " + " ".join(f"{k}={v}" for k, v in depths.items()))
        return " | ".join(parts)
    parts = [f"v{int(metrics.get('version', start_version))}"]
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
    """Reads queue depths over its own connection and prints the progress line."""

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

    def depths(self) -> dict[str, int]:
        out = {}
        for label, queue in self._queues.items():
            try:
                out[label] = self._transport.queue_depth(queue)
            except TransportError as exc:
                log.warning("queue depth unavailable", queue=queue, error=str(exc))
        return out

    def print_line(self, metrics: dict[str, float]) -> None:
        line = format_progress(
            metrics,
            self.depths(),
            self.tally.snapshot(),
            start_version=self._start_version,
            batch_episodes=self._batch_episodes,
        )
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._transport.close()
