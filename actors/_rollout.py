"""The rollout actor: runs many multi-turn episodes at once and publishes trajectories.

Each delivered `EpisodeRequest` runs on a worker thread: the environment starts
a session, `play_episode` (`_episode`) drives it turn by turn, a sampler pool
picked at random by the cross-policy weights answers each turn.

The episode request is acked only after the trajectory is confirmed by the
broker. A sampler that does not answer in time is an *infra* failure: the
request is re-issued (attempt + 1) up to `max_attempts`, after which a
trajectory with status `task_error` and `infra_failure = 1` is published so the
learner can complete the group with the surviving members. An instance the task
cannot set up (`SampleError`, e.g. its init script fails) is not retried: a
`task_error` trajectory with `sample_error = 1` is published, left out alike.

In-process tasks run behind `GuardedEnvironment`: each of their calls is bounded by
``env_timeout`` seconds, and a call that raises (not an `EnvError`), times out or
returns a bad reward or schema is a `TaskFailure`, an infra failure of that episode
like any other (retried, then given up). It is logged with the task and the exception
class and counted in ``task_failures/<task>/<class>``. A task that keeps failing
stops the run: when more than half of its last ``failure_window`` attempts failed,
the actor logs one error line naming the task and its last failure, hands that line to
``on_fatal`` and stops.

Counters (`stats()`, sent with each heartbeat): episodes started and finished,
infra retries, assistant turns, turns whose tool call was malformed
(`malformed_turns`), sessions lost on environment workers, and the task failures
by task and class. A trajectory's ``env/failed_attempts`` metric is how many earlier
attempts of its episode failed (``env/<task>/failed_attempts`` in the learner's row).
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pykka
import structlog

from agentrl.environments import ChatFormat, Environment, InfraError, SampleError
from agentrl.environments._guard import GuardedEnvironment, TaskFailure
from agentrl.environments._worker import RemoteEnvironment
from agentrl.messages import (
    Delivery,
    EpisodeRequest,
    GenerateRequest,
    GenerateResult,
    Topology,
    Trajectory,
    TransportError,
    connect,
    decode,
    encode,
)

from ._episode import (
    EpisodeLimits,
    InfraFailure,
    infra_trajectory,
    play_episode,
    sample_error_trajectory,
)
from ._heartbeat import HeartbeatSender
from ._session_report import RolloutSessions
from ._wire import TopologySpec, declare, decode_or_dead_letter

log = structlog.get_logger(__name__)

__all__ = ["EpisodeLimits", "RolloutActor"]


class RolloutActor(pykka.ThreadingActor):
    """Consumes EpisodeRequests with prefetch = concurrency and runs each on a worker thread."""

    def __init__(
        self,
        *,
        broker: str,
        topology: TopologySpec,
        environments: Mapping[str, Environment],
        chat_format: ChatFormat,
        pool_weights: Mapping[str, float],
        limits: EpisodeLimits,
        concurrency: int,
        rollout_id: str,
        seed: int = 0,
        node: str | None = None,
        heartbeat_interval: float = 10.0,
        remote_tasks: Sequence[str] = (),
        env_timeout: float = 120.0,
        on_episode: Callable[[Trajectory], None] | None = None,
        on_running: Callable[[int], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        failure_window: int = 50,
    ) -> None:
        super().__init__()
        self._log = log.bind(role="rollout", actor=rollout_id)
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._envs: dict[str, Environment] = {
            task: GuardedEnvironment(task, env, timeout=env_timeout)
            for task, env in environments.items()
        }
        self._remote = tuple(remote_tasks)
        self._env_timeout = env_timeout
        self._episode_done = on_episode
        """Called with each trajectory once the broker has it (the progress line's tally)."""
        self._on_running = on_running
        """Called with +1 when a worker takes an episode request, -1 when it is done with it
        (published, re-issued or left to the broker): the progress line's in flight."""
        self._on_fatal = on_fatal
        """Called once with the line that says why a task stopped the run."""
        if failure_window < 1:
            raise ValueError(f"failure_window must be >= 1, got {failure_window}")
        self._window = failure_window
        self._recent: dict[str, deque[bool]] = {}
        """Task -> whether each of its last ``failure_window`` attempts failed."""
        self._failures: Counter[tuple[str, str]] = Counter()
        self._fatal = False
        self._fmt = chat_format
        self._pools = [p for p, w in pool_weights.items() if w > 0]
        self._weights = [pool_weights[p] for p in self._pools]
        self._limits = limits
        self._concurrency = concurrency
        self._id = rollout_id
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._transport = None
        self._consumer = None
        self._stopping = threading.Event()
        self._counts_lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("started", "finished", "infra_retries", "turns", "malformed_turns"), 0
        )
        self._running = 0
        self._busy_area = 0.0
        self._busy_mark = self._idle_mark = time.monotonic()
        self._node = node or socket.gethostname()
        self._interval = heartbeat_interval
        self._heartbeat: HeartbeatSender | None = None
        self._sessions: RolloutSessions | None = None

    def on_start(self) -> None:
        self._transport = connect(self._broker, name=f"{self._spec.run}-{self._id}")
        declare(self._transport, self._spec)
        for task in self._remote:  # served by environment workers over the broker
            self._envs[task] = RemoteEnvironment(
                self._transport, self._spec.run, task, timeout=self._env_timeout
            )
        self._executor = ThreadPoolExecutor(self._concurrency, thread_name_prefix=self._id)
        self._consumer = self._transport.consume(
            self._names.episodes, self._on_episode, prefetch=self._concurrency
        )
        self._heartbeat = HeartbeatSender(
            self._transport,
            self._spec.run,
            node=self._node,
            role="rollout",
            actor_id=self._id,
            interval=self._interval,
            state=lambda: {
                **{k: float(v) for k, v in self.stats().items()},
                "running": float(self._running),
                "idle_ratio": self.idle_ratio(),
            },
        )
        self._heartbeat.start()
        self._sessions = RolloutSessions(
            self._transport,
            self._spec.run,
            rollout_id=self._id,
            concurrency=self._concurrency,
            envs={t: self._envs[t] for t in self._remote},
            interval=self._interval,
        )
        self._sessions.start()
        self._log.info("rollout started", concurrency=self._concurrency)

    def on_stop(self) -> None:
        self._stopping.set()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._sessions is not None:
            self._sessions.stop()
        if self._consumer is not None:
            self._consumer.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._transport is not None:
            self._transport.close()  # unacked episodes are redelivered to another actor

    def on_failure(self, *exc_info) -> None:
        self.on_stop()

    def stats(self) -> dict[str, int]:
        with self._counts_lock:
            counts = dict(self._counts)
            failures = {f"task_failures/{t}/{k}": n for (t, k), n in self._failures.items()}
        lost = self._sessions.aborted if self._sessions is not None else 0
        return {**counts, "sessions_lost": lost, **failures}

    # --- I/O thread: hand the delivery to a worker ---------------------------------------

    def _on_episode(self, delivery: Delivery) -> None:
        self._executor.submit(self._guarded, delivery)

    def _guarded(self, delivery: Delivery) -> None:
        self._slots(+1)
        if self._on_running is not None:
            self._on_running(+1)
        try:
            self._handle(delivery)
        except TransportError as exc:
            # The broker is gone (or we are stopping): the request stays unacked and is
            # redelivered to another rollout actor.
            if self._stopping.is_set():  # normal at a stop: not a failure, so not above debug
                self._log.debug("unfinished episode left to be redelivered", reason=str(exc))
            else:
                self._log.error("episode abandoned: broker lost", error=str(exc))
        except BaseException as exc:
            self._log.exception("episode crashed; request requeued")
            delivery.nack(requeue=True)
            self.actor_ref.tell(("crash", exc))  # stop the actor: a bug, not a model failure
            raise
        finally:
            self._slots(-1)
            if self._on_running is not None:
                self._on_running(-1)

    def _slots(self, change: int) -> None:
        """Integrate busy episode slots over time (for the idle ratio)."""
        now = time.monotonic()
        with self._counts_lock:
            self._busy_area += self._running * (now - self._busy_mark)
            self._busy_mark = now
            self._running += change

    def idle_ratio(self) -> float:
        """Share of episode slots (concurrency) idle since the previous call."""
        self._slots(0)
        now = time.monotonic()
        with self._counts_lock:
            span = (now - self._idle_mark) * self._concurrency
            busy, self._busy_area, self._idle_mark = self._busy_area, 0.0, now
        return 1.0 - min(1.0, busy / span) if span > 0 else 0.0

    def on_receive(self, message):
        kind, exc = message
        if kind == "crash":
            raise RuntimeError("rollout worker crashed") from exc
        raise ValueError(f"rollout: unknown message {kind!r}")

    def _handle(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, EpisodeRequest)
        if msg is None:
            return
        req = msg.payload
        if req.task not in self._envs:
            delivery.dead_letter(f"episode_request.task: no environment for task {req.task!r}")
            return
        env = self._envs[req.task]
        if not isinstance(env, RemoteEnvironment) and not 0 <= req.index < env.num_instances:
            delivery.dead_letter(  # a malformed request, not a bug: it must not stop the actor
                f"episode_request.index: {req.index} not in [0, {env.num_instances}) "
                f"for task {req.task!r}"
            )
            return
        self._bump("started")
        try:
            traj = self.run_episode(req)
        except TransportError:
            raise
        except (InfraFailure, InfraError) as exc:
            self._bump("infra_retries")
            kind = exc.kind if isinstance(exc, TaskFailure) else type(exc).__name__
            if isinstance(exc, TaskFailure):
                self._attempt(req.task, failed=True, kind=kind, error=str(exc))
            if req.attempt + 1 < self._limits.max_attempts:
                self._log.warning(
                    "infra failure; episode re-issued",
                    episode=req.episode_id,
                    task=req.task,
                    kind=kind,
                    attempt=req.attempt + 1,
                    error=str(exc),
                )
                retry = replace(req, attempt=req.attempt + 1)
                self._publish("", self._names.episodes, retry)
                delivery.ack()
                return
            self._log.error(
                "infra failure; episode given up",
                episode=req.episode_id,
                task=req.task,
                kind=kind,
                error=str(exc),
            )
            traj = infra_trajectory(req, self._limits.penalty)
        except SampleError as exc:  # the task cannot set this instance up: not retried
            self._log.warning(
                "instance cannot be set up; episode ends task_error",
                episode=req.episode_id,
                task=req.task,
                index=req.index,
                error=str(exc),
            )
            traj = sample_error_trajectory(req, self._limits.penalty)
        except Exception as exc:  # a bug: _guarded stops the actor; say where it happened
            exc.add_note(f"episode {req.episode_id}, task {req.task!r}, index {req.index}")
            raise
        self._publish("", self._names.trajectories, traj)
        if self._episode_done is not None:
            self._episode_done(traj)
        delivery.ack()
        self._bump("finished")

    def _attempt(self, task: str, *, failed: bool, kind: str = "", error: str = "") -> None:
        """Book one attempt of ``task``; stop the run when the task keeps failing (module
        doc): one error line, ``on_fatal``, then this actor stops."""
        with self._counts_lock:
            recent = self._recent.setdefault(task, deque(maxlen=self._window))
            recent.append(failed)
            if failed:
                self._failures[(task, kind)] += 1
            failing = sum(recent)
            fatal = failed and failing > self._window // 2 and not self._fatal
            self._fatal = self._fatal or fatal
        if not fatal:
            return
        line = (
            f"task {task!r} keeps failing ({failing} of its last {len(recent)} attempts); "
            f"last: {error}"
        )
        self._log.error("task keeps failing; run stopped", task=task, reason=line)
        if self._on_fatal is not None:
            self._on_fatal(line)
        self.actor_ref.stop(block=False)

    def _publish(self, exchange: str, key: str, payload) -> None:
        self._transport.publish(exchange, key, encode(payload, run=self._spec.run)).result()

    def _bump(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[key] += n

    # --- one episode -----------------------------------------------------------------

    def run_episode(self, req: EpisodeRequest) -> Trajectory:
        """Start the episode's session, drive it to its end (`play_episode`), count it."""
        env = self._envs[req.task]
        if isinstance(env, RemoteEnvironment):  # its session is reported with the episode id
            start = env.start(req.index, episode=req.episode_id)
        else:
            start = env.start(req.index)

        def sample(ids: list[int], max_new: int) -> tuple[str, GenerateResult]:
            pool = self._pick_pool()
            return pool, self._generate(req, pool, ids, max_new)

        traj = play_episode(req, env, start, self._fmt, self._limits, sample)
        if isinstance(env, GuardedEnvironment):
            self._attempt(req.task, failed=False)
        self._bump("turns", traj.num_turns)
        self._bump("malformed_turns", int(traj.metrics["malformed_turns"]))
        return traj

    def _pick_pool(self) -> str:
        with self._rng_lock:
            return self._rng.choices(self._pools, weights=self._weights)[0]

    def _generate(self, req: EpisodeRequest, pool: str, ids: list[int], max_new: int):
        lim = self._limits
        request = GenerateRequest(
            request_id=uuid.uuid4().hex,
            episode_id=req.episode_id,
            prompt_ids=ids,
            max_new_tokens=max_new,
            temperature=lim.temperature,
            top_p=lim.top_p,
            stop_ids=list(self._fmt.stop_ids),
        )
        body = encode(request, run=self._spec.run)
        try:
            reply = self._transport.call(
                self._names.generate, pool, body, timeout=lim.generate_timeout
            ).result(timeout=lim.generate_timeout + 5)
        except TimeoutError as exc:
            raise InfraFailure(f"no sampler of pool {pool!r} answered in time") from exc
        result = decode(reply.body, expect=GenerateResult).payload
        if result.request_id != request.request_id:
            raise InfraFailure(f"reply for {result.request_id}, expected {request.request_id}")
        return result
