"""The live progress line: version, episodes/s, reward per task, queue depths."""

from __future__ import annotations

import sys

import structlog

from agentrl.messages import Topology, Transport, TransportError

log = structlog.get_logger(__name__)

__all__ = ["Progress", "format_progress"]


def format_progress(metrics: dict[str, float], depths: dict[str, int]) -> str:
    """One line, e.g. `v3 | 0.52 ep/s | calculator r=+0.41 s=0.50 | idle 12% | q episodes=4`."""
    parts = [f"v{int(metrics.get('version', 0))}"]
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


class Progress:
    """Reads queue depths over its own connection and prints the progress line."""

    def __init__(self, transport: Transport, topology: Topology, pools: tuple[str, ...]) -> None:
        self._transport = transport
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
        print(format_progress(metrics, self.depths()), file=sys.stderr, flush=True)

    def close(self) -> None:
        self._transport.close()
