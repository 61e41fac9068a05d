"""The rollout actor: runs many multi-turn episodes at once and publishes trajectories.

One episode, turn by turn (DESIGN "Episodes"):

1. the environment starts a session: first messages + tools; the chat format
   renders them to prompt ids;
2. a sampler pool is picked at random by the cross-policy weights and sent a
   GenerateRequest with the whole context so far; the reply carries the sampled
   ids, their logprobs and the policy version that produced them;
3. the sampled ids are appended *as sampled* (loss mask 1, with their logprobs
   and version); the decoded text is parsed for tool calls: a malformed call
   ends the episode as `agent_validation_failed`, never as a crash;
4. the environment answers; its messages are rendered by diffing the templated
   conversation and appended with loss mask 0; repeat until it finishes or a
   limit is hit.

The episode request is acked only after the trajectory is confirmed by the
broker. A sampler that does not answer in time is an *infra* failure: the
request is re-issued (attempt + 1) up to `max_attempts`, after which a
trajectory with status `task_error` and `infra_failure = 1` is published so the
learner can complete the group with the surviving members.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pykka
import structlog

from agentrl.environments import (
    ChatFormat,
    Environment,
    InfraError,
    MalformedToolCall,
    Status,
    parse_assistant,
)
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
from agentrl.trainer import episode_reward

from ._heartbeat import HeartbeatSender
from ._session_report import RolloutSessions
from ._wire import TopologySpec, declare, decode_or_dead_letter

log = structlog.get_logger(__name__)

__all__ = ["EpisodeLimits", "RolloutActor"]


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits and sampling parameters."""

    max_turns: int = 4
    """Assistant turns before `task_limit_reached`."""
    max_tokens: int = 1024
    """Context tokens before `agent_context_limit`."""
    max_new_tokens: int = 128
    """Most tokens sampled per turn."""
    temperature: float = 0.8
    top_p: float = 1.0
    penalty: float = -0.2
    """Reward of an episode that does not end `completed`."""
    generate_timeout: float = 600.0
    """Seconds to wait for a sampler before the turn counts as an infra failure."""
    max_attempts: int = 3
    """Infra failures tolerated per episode before it is given up as `task_error`."""


class _InfraFailure(Exception):
    """Raised when something outside the model broke the episode (no sampler answered)."""


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
    ) -> None:
        super().__init__()
        self._log = log.bind(role="rollout", actor=rollout_id)
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._envs = dict(environments)
        self._remote = tuple(remote_tasks)
        self._env_timeout = env_timeout
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
        self._counts = {"started": 0, "finished": 0, "infra_retries": 0, "turns": 0}
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
        lost = self._sessions.aborted if self._sessions is not None else 0
        return {**counts, "sessions_lost": lost}

    # --- I/O thread: hand the delivery to a worker ---------------------------------------

    def _on_episode(self, delivery: Delivery) -> None:
        self._executor.submit(self._guarded, delivery)

    def _guarded(self, delivery: Delivery) -> None:
        self._slots(+1)
        try:
            self._handle(delivery)
        except TransportError as exc:
            # The broker is gone (or we are stopping): the request stays unacked and is
            # redelivered to another rollout actor.
            if self._stopping.is_set():
                self._log.info("episode handed back at shutdown", error=str(exc))
            else:
                self._log.error("episode abandoned: broker lost", error=str(exc))
        except BaseException as exc:
            self._log.exception("episode crashed; request requeued")
            delivery.nack(requeue=True)
            self.actor_ref.tell(("crash", exc))  # stop the actor: a bug, not a model failure
            raise
        finally:
            self._slots(-1)

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
        self._bump("started")
        try:
            traj = self.run_episode(req)
        except (_InfraFailure, InfraError) as exc:
            self._bump("infra_retries")
            if req.attempt + 1 < self._limits.max_attempts:
                self._log.warning(
                    "infra failure; episode re-issued",
                    episode=req.episode_id,
                    task=req.task,
                    error=str(exc),
                )
                retry = replace(req, attempt=req.attempt + 1)
                self._publish("", self._names.episodes, retry)
                delivery.ack()
                return
            self._log.error(
                "infra failure; episode given up", episode=req.episode_id, error=str(exc)
            )
            traj = _infra_trajectory(req, self._limits.penalty)
        self._publish("", self._names.trajectories, traj)
        delivery.ack()
        self._bump("finished")

    def _publish(self, exchange: str, key: str, payload) -> None:
        self._transport.publish(exchange, key, encode(payload, run=self._spec.run)).result()

    def _bump(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[key] += n

    # --- one episode -----------------------------------------------------------------

    def run_episode(self, req: EpisodeRequest) -> Trajectory:
        """Drive one episode to its end and build its trajectory."""
        env, lim, fmt = self._envs[req.task], self._limits, self._fmt
        t0 = time.monotonic()
        if isinstance(env, RemoteEnvironment):  # its session is reported with the episode id
            start = env.start(req.index, episode=req.episode_id)
        else:
            start = env.start(req.index)
        history = list(start.messages)
        ids = list(fmt.prompt_ids(history, env.tools))
        mask, logps, versions, pools = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), []
        status, env_reward, metrics, gen_time, finished = (
            Status.TASK_LIMIT_REACHED,
            0.0,
            {},
            0.0,
            False,
        )
        try:
            for _turn in range(lim.max_turns):
                budget = lim.max_tokens - len(ids)
                if budget <= 0:
                    status = Status.AGENT_CONTEXT_LIMIT
                    break
                pool = self._pick_pool()
                g0 = time.monotonic()
                result = self._generate(req, pool, ids, min(lim.max_new_tokens, budget))
                gen_time += time.monotonic() - g0
                pools.append(pool)
                ids += result.token_ids
                mask += [1] * len(result.token_ids)
                logps += result.logprobs
                versions += [result.version] * len(result.token_ids)
                text = fmt.decode_assistant(result.token_ids)
                try:
                    message = parse_assistant(text)
                except MalformedToolCall as exc:
                    status, metrics = Status.AGENT_VALIDATION_FAILED, {"malformed": 1.0}
                    self._log.debug(
                        "malformed tool call",
                        episode=req.episode_id,
                        task=req.task,
                        version=result.version,
                        reason=str(exc),
                    )
                    break
                if result.finish_reason == "length" and len(ids) >= lim.max_tokens:
                    status = Status.AGENT_CONTEXT_LIMIT
                    break
                history.append(message)
                step = env.interact(start.session, message)
                metrics = dict(step.metrics)
                if step.finish:
                    status, env_reward, finished = Status(step.status), step.reward, True
                    break
                closing = fmt.closing_ids(result.token_ids)
                obs = closing + fmt.observation_ids(history, step.messages, env.tools)
                history.extend(step.messages)
                ids += obs
                mask += [0] * len(obs)
                logps += [0.0] * len(obs)
                versions += [-1] * len(obs)
        finally:
            if not finished:
                env.cancel(start.session)
        self._bump("turns", len(pools))
        return _trajectory(
            req,
            token_ids=ids,
            loss_mask=mask,
            logprobs=logps,
            versions=versions,
            pools=pools,
            reward=episode_reward(env_reward, str(status.value), lim.penalty),
            env_reward=float(env_reward),
            status=str(status.value),
            num_turns=len(pools),
            timings={"episode": time.monotonic() - t0, "generate": gen_time},
            metrics={k: float(v) for k, v in metrics.items()},
        )

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
            raise _InfraFailure(f"no sampler of pool {pool!r} answered in time") from exc
        result = decode(reply.body, expect=GenerateResult).payload
        if result.request_id != request.request_id:
            raise _InfraFailure(f"reply for {result.request_id}, expected {request.request_id}")
        return result


def _trajectory(req: EpisodeRequest, **outcome) -> Trajectory:
    """A Trajectory carrying the request's identity fields plus the episode's outcome."""
    return Trajectory(
        episode_id=req.episode_id,
        group_id=req.group_id,
        task=req.task,
        index=req.index,
        sample_idx=req.sample_idx,
        group_size=req.group_size,
        issued_version=req.issued_version,
        **outcome,
    )


def _infra_trajectory(req: EpisodeRequest, penalty: float) -> Trajectory:
    """The record of an episode lost to infrastructure: no tokens, left out of its group."""
    return _trajectory(
        req,
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        versions=[],
        pools=[],
        reward=penalty,
        env_reward=0.0,
        status=Status.TASK_ERROR.value,
        num_turns=0,
        timings={},
        metrics={"infra_failure": 1.0},
    )
