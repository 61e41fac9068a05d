"""The controller: task catalogue, GRPO group dispatch, bounded-staleness admission.

Admission (`_admission`): groups are issued while the staleness window of the policy
version allows, the episodes the learner dropped issued anew; the count of what was
issued (`IssueBook`) survives a restart in the ledger.

The controller also keeps the table of actors from their heartbeats (`ActorTable`): the
version each sampler serves, per pool (`samplers`, `pool_versions`), and the
registry of environment workers (`EnvRegistry`, `env_workers`): every
``reconcile_interval`` seconds it cancels orphan and idle sessions on their
workers and tells rollouts which of their sessions are lost (`SessionsLost` on
the control exchange, routing key ``lost.<rollout id>``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pykka
import structlog

from agentrl.environments._remote import worker_queue
from agentrl.messages import (
    CheckpointQuery,
    CheckpointReady,
    Delivery,
    EnvCancel,
    EpisodeRequest,
    Heartbeat,
    MetricsReport,
    SessionReport,
    SessionsLost,
    StatusQuery,
    Topology,
    Unroutable,
    connect,
    encode,
)

from ._admission import IssueBook
from ._env_registry import EnvRegistry, RegistryTimes
from ._heartbeat import ActorTable
from ._ledger import ISSUED_FILE, append_lines
from ._mix import TaskMixer
from ._wire import (
    TopologySpec,
    broadcast_nowait,
    declare,
    decode_or_dead_letter,
    forward_to,
    subscribe,
    wait_all,
)

log = structlog.get_logger(__name__)

__all__ = ["ControllerActor", "TaskEntry"]


@dataclass(frozen=True)
class TaskEntry:
    """One task of the catalogue as the controller sees it."""

    weight: float
    """Relative share of groups given to this task (interleaved, see `_mix`)."""
    num_instances: int
    """Size of the task's instance set; indices are drawn in a seeded shuffled order."""
    schedule: tuple[tuple[float, float], ...] | None = None
    """``((version, weight), ...)``: the weight as a piecewise-linear function of the
    policy version (curriculum, see `_mix`); None = the constant `weight`."""


class ControllerActor(pykka.ThreadingActor):
    """Issues EpisodeRequests group by group while the staleness window allows."""

    def __init__(
        self,
        *,
        broker: str,
        topology: TopologySpec,
        tasks: Mapping[str, TaskEntry],
        group_size: int,
        episodes_per_batch: int,
        max_staleness: int,
        initial: CheckpointReady,
        seed: int = 0,
        env_times: RegistryTimes | None = None,
        reconcile_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        ledger_dir: Path | None = None,
        first_version: int = 0,
        untrained_gone: bool = False,
    ) -> None:
        """``ledger_dir``: where ``issued.jsonl`` goes (`_ledger`); a controller restarted
        on a run with one restores its issue count and task order from it. None: no
        ledger (the count then restarts at one batch per trained version).
        ``first_version``: the version RL began at (the warm start's), where the
        admission budget starts. ``untrained_gone``: the broker holds nothing an earlier
        controller issued (an in-process broker in a new process): the ledger's episodes
        neither trained nor dropped are lost, and the window issues them anew; without
        it a run resumed after its queued episodes died waited for them for good."""
        super().__init__()
        self._log = log.bind(role="controller", actor="controller")
        if episodes_per_batch % group_size:
            raise ValueError("episodes_per_batch must be a multiple of group_size")
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._tasks = dict(tasks)
        self._group_size = group_size
        self._latest = initial
        mixer = TaskMixer(
            {n: t.weight for n, t in self._tasks.items()},
            {n: t.num_instances for n, t in self._tasks.items()},
            seed=seed,
            schedules={n: t.schedule for n, t in self._tasks.items() if t.schedule is not None},
        )
        self._ledger = ledger_dir / ISSUED_FILE if ledger_dir is not None else None
        self._dropped = 0
        self._book = IssueBook(
            self._tasks,
            mixer,
            group_size=group_size,
            episodes_per_batch=episodes_per_batch,
            max_staleness=max_staleness,
            first_version=first_version,
            version=initial.version,
            ledger=self._ledger,
            log=self._log,
        )
        if untrained_gone and ledger_dir is not None:
            self._book.forget_untrained(ledger_dir, initial.version)
        self._actors = ActorTable()
        self._learner_metrics: dict[str, float] = {}
        self._registry = EnvRegistry(env_times)
        self._clock = clock
        self._reconcile_every = reconcile_interval
        self._ticker_stop = threading.Event()
        self._transport = None

    # --- lifecycle -------------------------------------------------------------------

    def on_start(self) -> None:
        self._transport = connect(self._broker, name=f"{self._spec.run}-controller")
        declare(self._transport, self._spec)
        ref = self.actor_ref
        subscribe(self._transport, self._names.checkpoints, forward_to(ref, "checkpoint"))
        subscribe(
            self._transport,
            self._names.control,
            forward_to(ref, "metrics"),
            routing_key="metrics.learner",
        )
        subscribe(
            self._transport,
            self._names.control,
            forward_to(ref, "heartbeat"),
            routing_key="heartbeat.#",
        )
        subscribe(
            self._transport,
            self._names.control,
            forward_to(ref, "sessions"),
            routing_key="sessions.*",
            prefetch=64,
        )
        self._transport.consume(self._names.control_rpc, forward_to(ref, "rpc"), prefetch=16)
        threading.Thread(target=self._tick, name="controller-reconcile", daemon=True).start()
        self._log.info("controller started", version=self._latest.version, tasks=list(self._tasks))
        unconfirmed = self._book.unconfirmed
        if unconfirmed:
            self._log.warning("re-publishing groups journaled but not confirmed",
                              groups=len(unconfirmed))  # fmt: skip
            futures = [f for e in unconfirmed for f in self._publish_group(e)]
            wait_all(futures)
            append_lines(self._ledger, [{"confirmed": [e["group"] for e in unconfirmed]}])
            self._book.unconfirmed = []
        self._admit()

    def on_stop(self) -> None:
        self._ticker_stop.set()
        if self._transport is not None:
            self._transport.close()

    def on_failure(self, *exc_info) -> None:
        self.on_stop()

    # --- messages --------------------------------------------------------------------

    def on_receive(self, message):
        kind, delivery = message
        if kind == "checkpoint":
            self._on_checkpoint(delivery)
        elif kind == "metrics":
            self._on_metrics(delivery)
        elif kind == "rpc":
            self._on_rpc(delivery)
        elif kind == "heartbeat":
            self._on_heartbeat(delivery)
        elif kind == "sessions":
            self._on_sessions(delivery)
        elif kind == "reconcile":
            self.reconcile()
        else:
            raise ValueError(f"controller: unknown message {kind!r}")

    def stats(self) -> dict[str, int]:
        """Counters for the progress line and tests."""
        return {
            "version": self._latest.version,
            "issued": self._book.issued,
            "groups": self._book.groups,
            "dropped": self._dropped,
            "allowance": self._book.allowance(self._latest.version, self._dropped),
            **{f"issued/{t}": n for t, n in self._book.by_task.items()},
        }

    def samplers(self) -> dict[str, dict]:
        """Sampler id -> its last heartbeat: pool, node, served version, age in seconds."""
        return self._actors.samplers()

    def status(self, alive_within: float = 30.0) -> dict[str, float]:
        """The run as the controller sees it, flat (the `StatusQuery` reply; docs/metrics.md).

        Actors count as alive when their last heartbeat is younger than ``alive_within``
        seconds. The learner's latest metrics are included under their own names.
        """
        out: dict[str, float] = dict(self._learner_metrics)
        out.update({f"controller/{k}": float(v) for k, v in self.stats().items()})
        out.update(self._actors.liveness(alive_within))
        out.update(self._registry.status(self._clock()))
        out.update(self._actors.pool_status())
        return out

    def pool_versions(self) -> dict[str, list[int]]:
        """Pool -> the versions its samplers serve (sorted, one entry per sampler)."""
        return self._actors.pool_versions()

    # --- environment workers -----------------------------------------------------------

    def env_workers(self) -> dict[str, dict]:
        """Env worker id -> state, task, capacity, live sessions (count, ids), first/last seen."""
        return self._registry.workers(self._clock())

    def reconcile(self) -> dict[str, int]:
        """One reconciliation pass (see `EnvRegistry`); returns what it sent, for tests."""
        decisions = self._registry.reconcile(self._clock())
        run = self._spec.run
        sent = [
            (
                wid,
                self._transport.publish("", worker_queue(run, wid), encode(EnvCancel(s), run=run)),
            )
            for wid, sids in decisions.cancels.items()
            for s in sids
        ]
        for wid, future in sent:
            try:
                future.result(10)
            except Unroutable:  # its queue is gone with it: nothing left to cancel
                self._log.info("cancel not delivered: worker gone", worker=wid)
        for rid, lost in decisions.lost.items():
            notice = SessionsLost(rid, [sid for sid, _ in lost], [why for _, why in lost])
            self._log.warning(
                "sessions lost",
                rollout=rid,
                sessions=len(lost),
                reasons=sorted({w for _, w in lost}),
            )
            broadcast_nowait(
                self._transport, self._names.control, f"lost.{rid}", encode(notice, run=run)
            )
        return {
            "cancels": sum(map(len, decisions.cancels.values())),
            "lost": sum(map(len, decisions.lost.values())),
        }

    def _on_sessions(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, SessionReport)
        if msg is None:
            return
        self._registry.observe(msg.payload, self._clock())
        delivery.ack()

    def _tick(self) -> None:
        while not self._ticker_stop.wait(self._reconcile_every):
            try:
                self.actor_ref.tell(("reconcile", None))
            except pykka.ActorDeadError:
                return

    def _on_heartbeat(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, Heartbeat)
        if msg is None:
            return
        beat = msg.payload
        if beat.role == "learner":  # its run-wide drop count, also before its next report
            gauge = beat.state.get("dropped_episodes", 0.0)
            if not 0 <= gauge < 2**53:  # NaN and inf too: no count, and int() would raise
                reason = f"heartbeat.state.dropped_episodes: expected a count, got {gauge!r}"
                self._log.warning("malformed message dead-lettered", reason=reason)
                delivery.dead_letter(reason)
                return
            dropped = int(gauge)
            if dropped > self._dropped:
                self._dropped = dropped
                self._admit()
        self._actors.observe(beat)
        delivery.ack()

    def _on_checkpoint(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, CheckpointReady)
        if msg is None:
            return
        if msg.payload.version > self._latest.version:
            self._latest = msg.payload
        delivery.ack()
        self._admit()

    def _on_metrics(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, MetricsReport)
        if msg is None:
            return
        self._learner_metrics = dict(msg.payload.values)
        dropped = msg.payload.values.get("learner/dropped_episodes_total")
        if dropped is not None and int(dropped) > self._dropped:
            self._dropped = int(dropped)
        delivery.ack()
        self._admit()

    def _on_rpc(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, (CheckpointQuery, StatusQuery))
        if msg is None:
            return
        if isinstance(msg.payload, StatusQuery):
            answer = MetricsReport(
                source="controller", step=self._latest.version, values=self.status()
            )
        else:
            answer = self._latest
        self._transport.reply(delivery, encode(answer, run=self._spec.run)).result()
        delivery.ack()

    # --- admission -------------------------------------------------------------------

    def _admit(self) -> None:
        """Issue groups while the window allows: each journaled first (fsynced), then
        published, then marked confirmed once the broker has them (`_ledger`)."""
        groups = []
        while self._book.allowance(self._latest.version, self._dropped) >= self._group_size:
            groups.append(self._book.next_group(self._latest.version))
        if not groups:
            return
        if self._ledger is not None:
            append_lines(self._ledger, groups)
        wait_all([f for g in groups for f in self._publish_group(g)])
        if self._ledger is not None:
            append_lines(self._ledger, [{"confirmed": [g["group"] for g in groups]}])

    def _publish_group(self, group: dict) -> list:
        futures = []
        for sample in range(int(group["episodes"])):
            req = EpisodeRequest(
                episode_id=f"{group['group']}-{sample}",
                task=group["task"],
                index=group["index"],
                group_id=group["group"],
                sample_idx=sample,
                group_size=int(group["episodes"]),
                issued_version=int(group["version"]),
            )
            body = encode(req, run=self._spec.run)
            futures.append(self._transport.publish("", self._names.episodes, body))
        return futures
