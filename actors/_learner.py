"""The learner: assembles whole GRPO groups oldest first, trains, checkpoints, announces.

Lossless by construction (DESIGN): a trajectory is acked only after the update
that used it has been written to disk and announced, so a learner that dies
mid-step leaves every trajectory of that step to be redelivered; on restart it
resumes from the last checkpoint (the supervisor passes it in).

Groups: a group is complete when all `group_size` members have arrived. Members
lost to infrastructure (`metrics.infra_failure`) are left out; a group with
fewer than 2 trainable members is dropped and counted, as is a group older than
the hard staleness bound (v - issued_version > hard). Dropped groups are acked
with the next checkpoint and reported to the controller, which issues
replacements (see the controller's admission rule).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pykka
import structlog

from agentrl.messages import (
    CheckpointReady,
    ControlCommand,
    Delivery,
    MetricsReport,
    Topology,
    Trajectory,
    connect,
    encode,
)
from agentrl.trainer import LearnerBackend, build_batch

from ._heartbeat import HeartbeatSender
from ._metrics import batch_metrics
from ._wire import TopologySpec, broadcast, declare, decode_or_dead_letter, forward_to

log = structlog.get_logger(__name__)

__all__ = ["LearnerActor"]


@dataclass
class _Group:
    members: dict[str, tuple[Trajectory, Delivery]] = field(default_factory=dict)
    first_seen: float = field(default_factory=time.monotonic)

    def trajectories(self) -> list[Trajectory]:
        return [t for t, _ in self.members.values()]

    def oldest(self) -> int:
        return min(t.issued_version for t, _ in self.members.values())


class LearnerActor(pykka.ThreadingActor):
    """Pulls bounded-staleness batches and runs the GRPO update on the backend."""

    def __init__(
        self,
        *,
        broker: str,
        topology: TopologySpec,
        backend_factory: Callable[[], LearnerBackend],
        checkpoint_dir: Path,
        start_version: int,
        group_size: int,
        groups_per_batch: int,
        hard_staleness: int,
        prefetch: int,
        pad_id: int,
        max_steps: int | None = None,
        on_metrics: Callable[[dict[str, float]], None] | None = None,
        on_batch: Callable[[int, list[Trajectory]], None] | None = None,
        done: threading.Event | None = None,
        keep_checkpoints: int = 0,
        node: str | None = None,
        heartbeat_interval: float = 10.0,
    ) -> None:
        super().__init__()
        self._log = log.bind(role="learner", actor="learner")
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._backend_factory = backend_factory
        self._ckpt_dir = Path(checkpoint_dir)
        self._version = start_version
        self._group_size = group_size
        self._groups_per_batch = groups_per_batch
        self._hard = hard_staleness
        self._prefetch = prefetch
        self._pad_id = pad_id
        self._max_steps = max_steps
        self._on_metrics = on_metrics
        self._on_batch = on_batch
        self._done = done or threading.Event()
        self._keep = keep_checkpoints
        self._groups: dict[str, _Group] = {}
        self._seen: set[str] = set()
        self._to_ack: list[Delivery] = []
        self._dropped_episodes = 0
        self._dropped_groups = 0
        self._steps = 0
        self._idle_since = time.monotonic()
        self._last_step_end = time.monotonic()
        self._backend = None
        self._transport = None
        self._journal = self._ckpt_dir / TRAINED_JOURNAL
        self._trained = _trained_groups(self._journal, start_version)
        self._replays_skipped = 0
        self._node = node or socket.gethostname()
        self._interval = heartbeat_interval
        self._heartbeat: HeartbeatSender | None = None

    def on_start(self) -> None:
        self._backend = self._backend_factory()
        self._transport = connect(self._broker, name=f"{self._spec.run}-learner")
        declare(self._transport, self._spec)
        ref = self.actor_ref
        self._transport.consume(
            self._names.trajectories, forward_to(ref, "trajectory"), prefetch=self._prefetch
        )
        self._idle_since = self._last_step_end = time.monotonic()
        self._heartbeat = HeartbeatSender(
            self._transport,
            self._spec.run,
            node=self._node,
            role="learner",
            actor_id="learner",
            interval=self._interval,
            state=lambda: {
                "version": float(self._version),
                "steps": float(self._steps),
                "buffered_groups": float(len(self._groups)),
                "dropped_episodes": float(self._dropped_episodes),
            },
        )
        self._heartbeat.start()
        self._log.info("learner started", version=self._version, checkpoint_dir=str(self._ckpt_dir))

    def on_stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._transport is not None:
            self._transport.close()  # unacked trajectories go back to the queue

    def on_failure(self, *exc_info) -> None:
        self.on_stop()

    def version(self) -> int:
        return self._version

    def on_receive(self, message):
        kind, delivery = message
        if kind != "trajectory":
            raise ValueError(f"learner: unknown message {kind!r}")
        msg = decode_or_dead_letter(delivery, Trajectory)
        if msg is None:
            return
        traj = msg.payload
        if traj.group_id in self._trained:
            # Trained into the version this learner resumed from, but the learner died
            # before acking it: the checkpoint holds it already, training it again would
            # count it twice.
            self._replays_skipped += 1
            self._log.info("replay of a trained group skipped", group=traj.group_id)
            delivery.ack()
            return
        if traj.episode_id in self._seen:
            # A redelivery of something already buffered (e.g. after a reconnect):
            # keep the newest delivery handle, the old one belongs to a dead channel.
            group = self._groups.get(traj.group_id)
            if group is not None and traj.episode_id in group.members:
                group.members[traj.episode_id] = (traj, delivery)
            else:
                self._to_ack.append(delivery)
            return
        self._seen.add(traj.episode_id)
        self._groups.setdefault(traj.group_id, _Group()).members[traj.episode_id] = (traj, delivery)
        self._maybe_train()

    # --- batching ------------------------------------------------------------------

    def _complete_groups(self) -> list[tuple[str, _Group]]:
        ready = [(gid, g) for gid, g in self._groups.items() if len(g.members) >= self._group_size]
        ready.sort(key=lambda item: (item[1].oldest(), item[1].first_seen))
        return ready

    def _maybe_train(self) -> None:
        while not self._done.is_set():
            batch: list[Trajectory] = []
            used: list[Delivery] = []
            chosen = 0
            for gid, group in self._complete_groups():
                members = [t for t in group.trajectories() if not t.metrics.get("infra_failure")]
                stale = self._version - group.oldest() > self._hard
                if stale or len(members) < 2:
                    self._drop(gid, group, "stale" if stale else "too few members")
                    continue
                if chosen == self._groups_per_batch:
                    break
                batch.extend(members)
                used.extend(d for _, d in group.members.values())
                chosen += 1
            if chosen < self._groups_per_batch:
                return
            for t in batch:
                self._groups.pop(t.group_id, None)
            self._train(batch, used)

    def _drop(self, gid: str, group: _Group, reason: str) -> None:
        self._groups.pop(gid)
        self._dropped_groups += 1
        self._dropped_episodes += len(group.members)
        self._to_ack.extend(d for _, d in group.members.values())
        self._log.warning("group dropped", group=gid, reason=reason, members=len(group.members))
        self._report({"learner/dropped_episodes_total": float(self._dropped_episodes)})

    def _train(self, batch: list[Trajectory], used: list[Delivery]) -> None:
        start = time.monotonic()
        idle = start - self._last_step_end
        stats = self._backend.step(build_batch(batch, pad_id=self._pad_id))
        trained = time.monotonic()
        version = self._version + 1
        path = self._ckpt_dir / f"v{version:06d}"
        # Journal first: if the learner dies after the checkpoint is complete but before
        # the acks, a learner resumed from it skips these groups' redeliveries.
        _journal_groups(self._journal, version, {t.group_id for t in batch})
        digest = self._backend.save(path)
        saved = time.monotonic()
        ready = CheckpointReady(
            version=version, uri=str(path), digest=digest, created_at=time.time()
        )
        broadcast(self._transport, self._names.checkpoints, "", encode(ready, run=self._spec.run))
        self._version = version
        self._steps += 1
        for delivery in [*used, *self._to_ack]:
            delivery.ack()
        self._to_ack.clear()
        for t in batch:
            self._seen.discard(t.episode_id)
        self._prune_checkpoints()
        end = time.monotonic()
        metrics = {
            "version": float(version),
            "learner/step_time": trained - start,
            "learner/save_time": saved - trained,
            "learner/idle_time": idle,
            "learner/idle_ratio": idle / max(end - self._last_step_end, 1e-9),
            "learner/dropped_groups_total": float(self._dropped_groups),
            "learner/replays_skipped_total": float(self._replays_skipped),
            **stats,
            **batch_metrics(batch, version, wall=end - self._last_step_end),
        }
        self._last_step_end = end
        self._log.info(
            "update", version=version, step_time=round(trained - start, 2), idle=round(idle, 2)
        )
        self._report(metrics)
        if self._on_metrics is not None:
            self._on_metrics(metrics)
        if self._on_batch is not None:
            self._on_batch(version, batch)
        if self._max_steps is not None and self._steps >= self._max_steps:
            self._log.info("max_steps reached; asking every node to stop", steps=self._steps)
            command = ControlCommand(command="shutdown", reason=f"max_steps {self._max_steps}")
            body = encode(command, run=self._spec.run)
            broadcast(self._transport, self._names.control, "command.shutdown", body)
            self._done.set()

    def _report(self, values: dict[str, float]) -> None:
        report = MetricsReport(source="learner", step=self._version, values=values)
        body = encode(report, run=self._spec.run)
        broadcast(self._transport, self._names.control, "metrics.learner", body)

    def _prune_checkpoints(self) -> None:
        if self._keep <= 0:
            return
        versions = sorted(p for p in self._ckpt_dir.glob("v[0-9]*") if p.is_dir())
        for old in versions[: -self._keep]:
            shutil.rmtree(old)


TRAINED_JOURNAL = "trained.jsonl"
"""In the checkpoint directory: one JSON line per update, the groups it trained."""


def _journal_groups(path: Path, version: int, groups: set[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"version": version, "groups": sorted(groups)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _trained_groups(path: Path, version: int) -> set[str]:
    """Groups trained into checkpoint ``version`` (the one a resumed learner starts from).

    Only that version's groups can still be unacked on the queue: every earlier
    batch was acked before the next update began. Entries for later versions are
    from updates whose checkpoint did not survive; their groups are trained again.
    """
    if version == 0 or not path.exists():
        return set()
    groups: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            log.warning("unreadable line in the trained journal", path=str(path), line=number)
            continue  # a line cut by a crash mid-write: its update never completed
        if entry.get("version") == version:
            groups.update(entry.get("groups", []))
    return groups
