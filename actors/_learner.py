"""The learner: assembles whole GRPO groups oldest first, trains, checkpoints, announces.

Lossless by construction (DESIGN): a trajectory is acked only after the update
that used it has been written to disk and announced, so a learner that dies
mid-step leaves every trajectory of that step to be redelivered; on restart it
resumes from the last checkpoint (the supervisor passes it in).

Groups (`_groups`): a group is trained when all `group_size` members have arrived,
and dropped whole when it is too stale, incomplete for too long, left with fewer than 2
trainable members, or (``drop_flat_groups``) without reward spread.

A dropped group's buffered trajectories are acked at once (they must not hold
the prefetch window), members that arrive later are acked on arrival, and the
whole group is counted as dropped (`DropBook`), so the controller issues its
replacements. Drops are logged. Incomplete groups are checked on every arrival and
every `sweep_interval` seconds.

The update's computation (`build_batch`, the backend's step: minutes on a CPU) runs on a
thread of its own, one update at a time; everything else stays on the actor's thread.
While it runs, the actor goes on buffering arrivals and dropping what can never train
(`GroupBuffer.prune`: flat, stale, too few members), so the controller issues their
replacements during the update instead of after it: with most groups flat, a window
held by undropped groups left the samplers idle for most of each update. The step's
end comes back as a message; the checkpoint, its announcement and the acks follow on
the actor's thread, in the order above. A stop waits for the update in flight and
commits it; a failure discards it (its trajectories are redelivered).
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
import structlog
import torch

from agentrl.messages import (
    CheckpointReady,
    ControlCommand,
    MetricsReport,
    Topology,
    Trajectory,
    connect,
    encode,
)
from agentrl.trainer import LearnerBackend, build_batch

from ._checkpoint import (
    commit,
    disk_full,
    exc_line,
    partial_dir,
    prune_checkpoints,
    remove_partials,
)
from ._groups import Batch, DropBook, Group, GroupBuffer
from ._heartbeat import HeartbeatSender
from ._journal import TRAINED_JOURNAL, TrainedIndex, journal_groups
from ._metrics import batch_metrics
from ._trace_store import TraceWriter
from ._wire import TopologySpec, broadcast, declare, decode_or_dead_letter, forward_to

log = structlog.get_logger(__name__)

__all__ = ["LearnerActor"]


@dataclass
class _Step:
    """An update in flight: its batch, and what its thread hands back."""

    chosen: Batch
    version: int
    start: float
    idle: float
    trained: float = 0.0
    result: tuple[Any, dict[str, float]] | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    cuda_device: int | None = None
    """The actor thread's current CUDA device (per thread; Megatron's rank 0 set it)."""


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
        group_timeout: float = 600.0,
        sweep_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        task_normalize: bool = True,
        task_center: bool = False,
        max_token_lag: int | None = None,
        first_version: int = 0,
        ledger_dir: Path | None = None,
        drop_flat_groups: bool = False,
        disk_problem: Callable[[], str | None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        trace: Callable[[], TraceWriter] | None = None,
    ) -> None:
        """``max_steps`` counts the run's RL updates, ``version - first_version`` (the
        warm start's version, or 0), over every process of the run: a learner restarted
        at v4 of ``max_steps: 6`` trains two more. ``ledger_dir``: where the drops go
        (`_ledger`); the dropped totals continue from it after a restart.
        ``disk_problem()``: asked before each checkpoint; a line (the disk cannot take it)
        stops the run cleanly before anything of that update is written, and goes to
        ``on_fatal``. ``keep_checkpoints``: the newest kept (0 keeps all). ``trace()``: opens
        the trace store (`_trace_store`) in ``on_start``; every trained and dropped episode
        goes there."""
        super().__init__()
        self._log = log.bind(role="learner", actor="learner")
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._backend_factory = backend_factory
        self._ckpt_dir = Path(checkpoint_dir)
        self._version = start_version
        self._group_size = group_size
        self._prefetch = prefetch
        self._pad_id = pad_id
        self._task_normalize = task_normalize  # build_batch's (learner.task_normalize)
        self._task_center = task_center  # build_batch's (learner.task_center)
        self._max_token_lag = max_token_lag  # build_batch's (staleness.max_token_lag)
        self._drop_flat = drop_flat_groups
        self._max_steps = max_steps
        self._first_version = first_version
        self._on_metrics = on_metrics
        self._on_batch = on_batch
        self._done = done or threading.Event()
        self._keep = keep_checkpoints
        self._disk_problem = disk_problem
        self._on_fatal = on_fatal
        self._buffer = GroupBuffer(
            group_size=group_size,
            groups_per_batch=groups_per_batch,
            hard_staleness=hard_staleness,
            group_timeout=group_timeout,
            drop_flat_groups=drop_flat_groups,
            clock=clock,
            drop=self._drop,
            log=self._log,
        )
        self._drops = DropBook(ledger_dir)
        self._trace_factory = trace
        self._trace: TraceWriter | None = None
        self._sweep_every = sweep_interval
        self._sweeper_stop = threading.Event()
        self._clock = clock
        self._steps = 0
        self._step: _Step | None = None  # the update in flight (module doc)
        self._consumer = None  # of the trajectories queue
        self._idle_since = time.monotonic()
        self._last_step_end = time.monotonic()
        self._backend = None
        self._transport = None
        self._journal = self._ckpt_dir / TRAINED_JOURNAL
        self._trained = TrainedIndex(self._journal, start_version, hard_staleness)
        self._node = node or socket.gethostname()
        self._interval = heartbeat_interval
        self._heartbeat: HeartbeatSender | None = None

    def on_start(self) -> None:
        remove_partials(self._ckpt_dir)
        self._backend = self._backend_factory()
        if self._trace_factory is not None:
            self._trace = self._trace_factory()
        self._transport = connect(self._broker, name=f"{self._spec.run}-learner")
        declare(self._transport, self._spec)
        ref = self.actor_ref
        self._consumer = self._transport.consume(
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
                "buffered_groups": float(self.buffered()),
                "dropped_episodes": float(self._drops.episodes),
            },
        )
        self._heartbeat.start()
        threading.Thread(target=self._tick, name="learner-sweep", daemon=True).start()
        self._log.info("learner started", version=self._version, checkpoint_dir=str(self._ckpt_dir))
        self._stop_at_max_steps()  # a run resumed after its last update has nothing to train

    def on_stop(self) -> None:
        step, self._step = self._step, None
        try:
            if step is not None:  # a stop waits for the update in flight, which commits
                self._log.info("stopping: waiting for the update in flight", version=self._version)
                self._stop_consuming()
                step.finished.wait()
                self._commit(step)
        finally:
            self._close()

    def on_failure(self, *exc_info) -> None:
        step, self._step = self._step, None
        if step is not None:  # discarded: its trajectories, unacked, are redelivered
            self._stop_consuming()
            step.finished.wait()  # the backend is closed after this actor: no step may run
        self._close()

    def _stop_consuming(self) -> None:
        """No more deliveries while a stopping learner waits for its update: this actor no
        longer takes messages, so each one would go back to the queue and come straight
        back (`forward_to`), a loop that took the CPU from the update it waits for. The
        deliveries already received stay valid for the update's acks."""
        if self._consumer is not None:
            self._consumer, consumer = None, self._consumer
            consumer.cancel()

    def _close(self) -> None:
        self._sweeper_stop.set()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._transport is not None:
            self._transport.close()  # unacked trajectories go back to the queue
            self._transport = None
        if self._trace is not None:
            self._trace, trace = None, self._trace
            trace.close()

    def version(self) -> int:
        return self._version

    def buffered(self) -> int:
        """Groups waiting in the buffer (incomplete, or complete but not yet trained)."""
        return len(self._buffer)

    def on_receive(self, message):
        kind, delivery = message
        if kind == "sweep":
            self.sweep()
            return
        if kind == "stepped":
            self._finish_step(delivery)
            return
        if kind != "trajectory":
            raise ValueError(f"learner: unknown message {kind!r}")
        msg = decode_or_dead_letter(delivery, Trajectory)
        if msg is None:
            return
        traj = msg.payload
        reason = self._drops.reason(traj.group_id)
        if reason is not None:
            # A late member of a dropped group: already counted (the whole group was).
            self._log.info("late member of a dropped group acked", group=traj.group_id)
            if self._trace is not None:
                self._trace.dropped(self._version, reason, [traj])
            delivery.ack()
            return
        if self._trained.replay(traj.group_id):
            # Trained into the version this learner resumed from, but the learner died
            # before acking it: the checkpoint holds it already, training it again would
            # count it twice.
            self._log.info("replay of a trained group skipped", group=traj.group_id)
            delivery.ack()
            return
        if self._trained.copy(traj.episode_id):
            # A second copy of a trained episode: its rollout died after publishing the
            # trajectory and before acking the episode, which was then played again.
            self._log.info("copy of a trained episode skipped", episode=traj.episode_id)
            delivery.ack()
            return
        if self._buffer.add(traj, delivery):  # not a redelivery of one buffered
            self.sweep()
            self._maybe_train()

    def sweep(self) -> int:
        """Drop every buffered group that is stale or incomplete for too long; how many."""
        return self._buffer.sweep(self._version)

    def _tick(self) -> None:
        while not self._sweeper_stop.wait(self._sweep_every):
            try:
                self.actor_ref.tell(("sweep", None))
            except pykka.ActorDeadError:
                return

    # --- batching ------------------------------------------------------------------

    def _maybe_train(self) -> None:
        """Start the next update if none is in flight; while one is, drop at once what can
        never train (module doc)."""
        if self._done.is_set():
            return
        if self._step is not None:
            self._buffer.prune(self._version)
            return
        chosen = self._buffer.next_batch(self._version)
        if chosen is not None:
            self._start_step(chosen)

    def _drop(self, gid: str, group: Group, reason: str) -> None:
        """Drop a group whole, out of the buffer already (`GroupBuffer`): ack what arrived,
        count all `group_size` episodes (module doc)."""
        self._drops.add(gid, self._group_size, reason, self._version)  # before the acks
        if self._trace is not None:
            self._trace.dropped(self._version, reason, group.trajectories())
        self._buffer.release(group)
        expected = reason == "no_spread"  # dynamic sampling: routine, not a fault
        (self._log.info if expected else self._log.warning)(
            "group dropped",
            group=gid,
            reason=reason,
            members=len(group.members),
            of=self._group_size,
            oldest_version=group.oldest(),
            version=self._version,
            age=round(self._clock() - group.first_seen, 1),
        )
        self._report(self._drops.metrics())

    def _start_step(self, chosen: Batch) -> None:
        problem = self._disk_problem() if self._disk_problem is not None else None
        if problem:  # before the step: nothing of this update is written, nothing acked
            self._stop_run(problem)
            return
        start = time.monotonic()
        step = _Step(chosen, self._version, start, idle=start - self._last_step_end)
        if torch.cuda.is_initialized():  # False without CUDA
            step.cuda_device = torch.cuda.current_device()
        self._step = step
        threading.Thread(
            target=self._run_step, args=(step,), name="learner-step", daemon=True
        ).start()

    def _run_step(self, step: _Step) -> None:
        """The update's computation (the step's thread): nothing here touches the buffer,
        the transport, the journal or the trace."""
        try:
            if step.cuda_device is not None:
                torch.cuda.set_device(step.cuda_device)
            train = build_batch(
                step.chosen.trajectories,
                pad_id=self._pad_id,
                task_normalize=self._task_normalize,
                task_center=self._task_center,
                version=step.version,
                max_token_lag=self._max_token_lag,
            )
            step.result = (train, self._backend.step(train))
        except BaseException as exc:  # raised again on the actor's thread (`_commit`)
            step.error = exc
        step.trained = time.monotonic()
        step.finished.set()
        try:
            self.actor_ref.tell(("stepped", step))
        except pykka.ActorDeadError:
            self._log.debug("the update ended after the learner stopped", version=step.version)

    def _finish_step(self, step: _Step) -> None:
        if self._step is not step:  # committed (or discarded) by the stop already
            return
        self._step = None
        self._commit(step)
        self._maybe_train()

    def _commit(self, step: _Step) -> None:
        """Journal, checkpoint, metrics row, announcement, acks: the update into
        ``version + 1`` made durable (the actor's thread). A step that raised fails the
        actor here, as it did when the step ran on this thread."""
        if step.error is not None:
            raise step.error
        assert step.result is not None
        train, stats = step.result
        stats = {**stats, "staleness/masked_old_tokens": float(train.masked_old_tokens)}
        batch, used = step.chosen.trajectories, step.chosen.deliveries
        start, trained, idle = step.start, step.trained, step.idle
        version = self._version + 1
        path = self._ckpt_dir / f"v{version:06d}"
        partial = partial_dir(self._ckpt_dir, version)
        if partial.exists():
            shutil.rmtree(partial)
        try:
            digest = self._backend.save(partial)
        except Exception as exc:
            shutil.rmtree(partial, ignore_errors=True)  # what the write got to
            if not disk_full(exc):
                raise
            self._stop_run(
                f"disk full while writing checkpoint v{version} ({exc_line(exc)}): nothing of "
                f"that update was kept and its episodes stay queued; free space on "
                f"{self._ckpt_dir}, then start again with --resume"
            )
            return
        # Journal before the commit: if the learner dies after the checkpoint is complete
        # but before the acks, a learner resumed from it skips these groups' redeliveries
        # (an entry past the newest committed checkpoint counts for nothing).
        journal_groups(
            self._journal, version, {t.group_id for t in batch}, [t.episode_id for t in batch]
        )
        if self._trace is not None:  # replaced, not doubled, if this version is trained again
            self._trace.trained(version, batch, train, step.chosen.left_out)
        self._drops.left_out(step.chosen.untrained, version)  # acked with the batch, untrained
        saved = end = time.monotonic()
        metrics = self._update_metrics(batch, stats, version, start, trained, saved, idle)
        self._last_step_end = end
        commit(partial, path, {"time": time.time(), **metrics})  # the row lives or dies with it
        if self._on_metrics is not None:
            self._on_metrics(metrics)
        ready = CheckpointReady(
            version=version, uri=str(path), digest=digest, created_at=time.time()
        )
        broadcast(self._transport, self._names.checkpoints, "", encode(ready, run=self._spec.run))
        self._version = version
        self._steps += 1
        self._buffer.trained(batch, used)
        self._trained.trained(version, [t.episode_id for t in batch])
        prune_checkpoints(self._ckpt_dir, self._keep)
        self._log.info(
            "update", version=version, step_time=round(trained - start, 2), idle=round(idle, 2)
        )
        self._report(metrics)
        if self._on_batch is not None:
            self._on_batch(version, batch)
        self._stop_at_max_steps()

    def _update_metrics(
        self, batch, stats, version: int, start: float, trained: float, end: float, idle: float
    ) -> dict[str, float]:
        """The metrics row of the update into ``version`` (written with its checkpoint)."""
        metrics = {
            "version": float(version),
            "learner/step_time": trained - start,
            "learner/save_time": end - trained,
            "learner/idle_time": idle,
            "learner/idle_ratio": idle / max(end - self._last_step_end, 1e-9),
            **self._drops.metrics(),
            "learner/replays_skipped_total": float(self._trained.replays_skipped),
            "learner/duplicates_skipped_total": float(self._trained.duplicates_skipped),
            **stats,
            **batch_metrics(batch, version, wall=end - self._last_step_end),
        }
        if self._drop_flat:
            metrics.update(self._buffer.flat.metrics({t.task for t in batch}))
        return metrics

    def _stop_run(self, reason: str) -> None:
        """The learner cannot go on (``reason``, one line): ask every node to stop."""
        self._log.error(reason)
        if self._on_fatal is not None:
            self._on_fatal(reason)
        body = encode(ControlCommand(command="shutdown", reason=reason), run=self._spec.run)
        broadcast(self._transport, self._names.control, "command.shutdown", body)
        self._done.set()

    def _stop_at_max_steps(self) -> None:
        """At ``max_steps`` RL updates of the run: ask every node to stop."""
        updates = self._version - self._first_version
        if self._max_steps is not None and updates >= self._max_steps:
            self._log.info(
                "max_steps reached; asking every node to stop",
                updates=updates,
                steps_this_process=self._steps,
            )
            command = ControlCommand(command="shutdown", reason=f"max_steps {self._max_steps}")
            body = encode(command, run=self._spec.run)
            broadcast(self._transport, self._names.control, "command.shutdown", body)
            self._done.set()

    def _report(self, values: dict[str, float]) -> None:
        report = MetricsReport(source="learner", step=self._version, values=values)
        body = encode(report, run=self._spec.run)
        broadcast(self._transport, self._names.control, "metrics.learner", body)
