"""The controller's registry of environment workers and its session reconciliation.

Env workers and rollout actors send `SessionReport`s (every heartbeat
interval): a worker lists the sessions it serves, a rollout the sessions its
episodes hold (with worker, episode and task of each). `EnvRegistry` keeps the
latest of each, on the controller's own clock (receipt time, so hosts' clocks
never matter), and `reconcile(now)` decides:

- **worker state** by the age of its last report: ``alive`` below
  ``unresponsive_after``, ``unresponsive`` below ``dead_after``, then ``dead``.
- **orphans**: a session a live worker has listed for ``orphan_grace`` seconds
  that no live rollout claims (its rollout crashed or gave up) is cancelled on
  that worker.
- **lost sessions**: a session a rollout claims on a worker that is dead, or
  that the worker left out of two consecutive reports received after the claim
  was first seen, is announced to that rollout, which ends the episode as an
  infra failure (retried on a fresh environment) instead of waiting for its
  timeout. Two reports, not one: a session that just ended normally may still be
  in the rollout's previous report; the next rollout report drops it first.
- **idle expiry**: a session with no start/interact for ``idle_limit`` seconds
  (the smaller of the worker's and the rollout's idle figure, aged since the
  report) is cancelled on its worker and announced to its rollout.

Each decision is made once per session (a session the worker lists again after
its cancel restarts its grace period). Pure logic: the controller feeds it
reports and a clock and sends what it decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.messages import SessionReport

__all__ = ["Decisions", "EnvRegistry", "RegistryTimes"]

ALIVE, UNRESPONSIVE, DEAD = "alive", "unresponsive", "dead"
STATE_CODES = {ALIVE: 0.0, UNRESPONSIVE: 1.0, DEAD: 2.0}
"""Worker state as a number, for the flat status table."""


@dataclass(frozen=True)
class RegistryTimes:
    """Thresholds of the registry, in seconds (defaults for a 10 s heartbeat interval)."""

    unresponsive_after: float = 30.0
    """A worker whose last report is older is ``unresponsive`` (3x the interval)."""
    dead_after: float = 100.0
    """Older still: ``dead``; its sessions are announced lost (10x the interval)."""
    orphan_grace: float = 30.0
    """A session no rollout claims for this long on a live worker is cancelled."""
    idle_limit: float = 300.0
    """A session idle this long is expired by the controller (below the worker's own timer)."""

    @classmethod
    def for_interval(cls, interval: float, *, idle_limit: float = 300.0) -> RegistryTimes:
        """The default multiples of a heartbeat interval."""
        return cls(3 * interval, 10 * interval, 3 * interval, idle_limit)


@dataclass
class _Worker:
    task: str
    capacity: int
    first_seen: float
    last_seen: float
    sessions: dict[str, float] = field(default_factory=dict)
    """Session id -> its idle seconds at ``last_seen``."""
    listed_since: dict[str, float] = field(default_factory=dict)
    """Session id -> when this worker first listed it (since its last cancel)."""
    declared_dead: bool = False


@dataclass
class _Claim:
    worker: str
    episode: str
    task: str
    idle: float
    """Idle seconds at the rollout's report."""
    first_seen: float
    missing: int = 0
    """Consecutive reports of its worker, after ``first_seen``, that did not list it."""


@dataclass
class _Rollout:
    last_seen: float
    claims: dict[str, _Claim] = field(default_factory=dict)


@dataclass
class Decisions:
    """What one reconciliation pass decided."""

    cancels: dict[str, list[str]] = field(default_factory=dict)
    """Worker id -> sessions to cancel on it."""
    lost: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """Rollout id -> (session id, reason) to end as infra failures."""


class EnvRegistry:
    """Env workers and the sessions rollouts hold on them (see module doc)."""

    def __init__(self, times: RegistryTimes | None = None) -> None:
        self.times = times or RegistryTimes()
        self._workers: dict[str, _Worker] = {}
        self._rollouts: dict[str, _Rollout] = {}
        self._announced: set[str] = set()
        self.counts = {"orphans_cancelled": 0, "lost": 0, "idle_expired": 0, "workers_died": 0}

    # --- reports -------------------------------------------------------------------------

    def observe(self, report: SessionReport, now: float) -> None:
        """Take a worker's or a rollout's report, received at ``now``."""
        if report.role == "env":
            self._observe_worker(report, now)
        else:
            self._observe_rollout(report, now)

    def _observe_worker(self, report: SessionReport, now: float) -> None:
        w = self._workers.get(report.reporter)
        if w is None:
            w = self._workers[report.reporter] = _Worker(report.task, report.capacity, now, now)
        w.task, w.capacity, w.last_seen, w.declared_dead = report.task, report.capacity, now, False
        w.sessions = dict(zip(report.session_ids, report.idle, strict=True))
        w.listed_since = {sid: w.listed_since.get(sid, now) for sid in w.sessions}
        for rollout in self._rollouts.values():
            for sid, claim in rollout.claims.items():
                if claim.worker != report.reporter or claim.first_seen >= now:
                    continue
                claim.missing = 0 if sid in w.sessions else claim.missing + 1

    def _observe_rollout(self, report: SessionReport, now: float) -> None:
        r = self._rollouts.setdefault(report.reporter, _Rollout(now))
        r.last_seen = now
        rows = zip(
            report.session_ids, report.workers, report.episodes, report.tasks, report.idle,
            strict=True,
        )  # fmt: skip
        claims = {}
        for sid, worker, episode, task, idle in rows:
            old = r.claims.get(sid)
            claims[sid] = _Claim(
                worker, episode, task, idle,
                old.first_seen if old else now, old.missing if old else 0,
            )  # fmt: skip
        for sid in set(r.claims) - set(claims):
            self._announced.discard(sid)
        r.claims = claims

    # --- decisions -----------------------------------------------------------------------

    def state(self, worker_id: str, now: float) -> str:
        age = now - self._workers[worker_id].last_seen
        if age < self.times.unresponsive_after:
            return ALIVE
        return UNRESPONSIVE if age < self.times.dead_after else DEAD

    def reconcile(self, now: float) -> Decisions:
        """Compare the tables; return the cancels and lost-session notices to send."""
        out = Decisions()
        t = self.times
        claimed = {
            sid: (rid, claim)
            for rid, r in self._rollouts.items()
            if now - r.last_seen < t.dead_after
            for sid, claim in r.claims.items()
        }
        for wid, w in self._workers.items():
            if self.state(wid, now) == DEAD:
                if not w.declared_dead:
                    w.declared_dead = True
                    self.counts["workers_died"] += 1
                continue
            aged = now - w.last_seen
            for sid, idle in list(w.sessions.items()):
                owner = claimed.get(sid)
                if owner is None:
                    if now - w.listed_since[sid] >= t.orphan_grace:
                        self._cancel(out, wid, sid, "orphans_cancelled")
                    continue
                rollout_idle = owner[1].idle + (now - self._rollouts[owner[0]].last_seen)
                if min(idle + aged, rollout_idle) >= t.idle_limit:
                    self._cancel(out, wid, sid, "idle_expired")
                    self._announce(out, owner[0], sid, "idle")
        for sid, (rid, claim) in claimed.items():
            w = self._workers.get(claim.worker)
            if w is None:
                if now - claim.first_seen >= t.dead_after:
                    self._announce(out, rid, sid, "worker unknown")
            elif w.declared_dead:
                self._announce(out, rid, sid, "worker dead")
            elif claim.missing >= 2:
                self._announce(out, rid, sid, "not on its worker")
        return out

    def _cancel(self, out: Decisions, wid: str, sid: str, counter: str) -> None:
        w = self._workers[wid]
        del w.sessions[sid]
        del w.listed_since[sid]
        out.cancels.setdefault(wid, []).append(sid)
        self.counts[counter] += 1

    def _announce(self, out: Decisions, rid: str, sid: str, reason: str) -> None:
        if sid in self._announced:
            return
        self._announced.add(sid)
        out.lost.setdefault(rid, []).append((sid, reason))
        self.counts["lost"] += 1

    # --- views ---------------------------------------------------------------------------

    def workers(self, now: float) -> dict[str, dict]:
        """Worker id -> state, task, capacity, live sessions (count and ids), first/last seen."""
        return {
            wid: {
                "state": self.state(wid, now),
                "task": w.task,
                "capacity": w.capacity,
                "sessions": len(w.sessions),
                "session_ids": sorted(w.sessions),
                "first_seen": w.first_seen,
                "last_seen": w.last_seen,
                "age": now - w.last_seen,
            }
            for wid, w in self._workers.items()
        }

    def status(self, now: float) -> dict[str, float]:
        """The flat status rows (docs/metrics.md, "Environment workers")."""
        views = self.workers(now)
        out = {f"env_workers/{s}": 0.0 for s in STATE_CODES}
        live = 0
        for wid, v in views.items():
            out[f"env_workers/{v['state']}"] += 1
            if v["state"] != DEAD:
                live += v["sessions"]
            prefix = f"env_worker/{v['task']}/{wid}"
            out[f"{prefix}/state"] = STATE_CODES[v["state"]]
            out[f"{prefix}/sessions"] = float(v["sessions"])
            out[f"{prefix}/capacity"] = float(v["capacity"])
            out[f"{prefix}/age"] = v["age"]
            out[f"{prefix}/up_for"] = now - v["first_seen"]
        out["env_sessions/live"] = float(live)
        out["env_sessions/claimed"] = float(sum(len(r.claims) for r in self._rollouts.values()))
        out.update({f"env_sessions/{k}": float(v) for k, v in self.counts.items()})
        return out
