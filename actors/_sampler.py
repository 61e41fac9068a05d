"""A sampler: serves generate requests of one pool from an engine and follows checkpoints.

Requests arrive on `generate.<pool>`; each is handed to the engine, which batches
whatever is in flight; the reply (token ids, logprobs, the version that produced
them) goes back through reply-to, and only then is the request acked, so a
sampler that dies mid-request leaves it to be redelivered to another one.

Checkpoints arrive on the fanout exchange. A pool with `every = k` takes version
v only when v is a multiple of k (the `stale` pools of cross-policy sampling).
Weights are verified against the announced digest and loaded on this actor's
thread; the engine swaps them between batches, so requests in flight finish on
the old weights and report the old version.

Heartbeats (`Heartbeat` on the control exchange, routing key
``heartbeat.sampler``) say which version this sampler serves: one when it
starts, one as soon as a loaded version is in place (``event = loaded``, with
the seconds from the announcement), and one every ``heartbeat_interval``
seconds. The controller keeps the table; `bench/fanout.py` times fan-out by them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pykka
import structlog

from agentrl.messages import (
    CheckpointQuery,
    CheckpointReady,
    Delivery,
    GenerateRequest,
    GenerateResult,
    Topology,
    TransportError,
    Unroutable,
    connect,
    decode,
    encode,
)
from agentrl.trainer import checkpoint_digest

from ._heartbeat import HeartbeatSender
from ._wire import (
    TopologySpec,
    declare,
    decode_or_dead_letter,
    forward_to,
    subscribe,
)
from .engines.base import EngineClosed, SamplerEngine, WeightsMismatch

log = structlog.get_logger(__name__)

__all__ = ["SamplerActor"]


class SamplerActor(pykka.ThreadingActor):
    """One engine of a sampler pool."""

    def __init__(
        self,
        *,
        broker: str,
        topology: TopologySpec,
        pool: str,
        every: int,
        engine_factory: Callable[[], SamplerEngine],
        sampler_id: str,
        prefetch: int = 32,
        query_timeout: float = 10.0,
        heartbeat_interval: float = 10.0,
        node: str | None = None,
    ) -> None:
        super().__init__()
        self._log = log.bind(role="sampler", actor=sampler_id, pool=pool)
        self._broker = broker
        self._spec = topology
        self._names = Topology(topology.run)
        self._pool = pool
        self._every = every
        self._engine_factory = engine_factory
        self._id = sampler_id
        self._prefetch = prefetch
        self._query_timeout = query_timeout
        self._engine: SamplerEngine | None = None
        self._transport = None
        self._served = 0
        self._loads = 0
        self._node = node or socket.gethostname()
        self._interval = heartbeat_interval
        self._heartbeat: HeartbeatSender | None = None

    def on_start(self) -> None:
        self._engine = self._engine_factory()
        self._transport = connect(self._broker, name=f"{self._spec.run}-{self._id}")
        declare(self._transport, self._spec)
        self._heartbeat = HeartbeatSender(
            self._transport,
            self._spec.run,
            node=self._node,
            role="sampler",
            actor_id=self._id,
            interval=self._interval,
            state=self._gauges,
            labels={"pool": self._pool},
        )
        ref = self.actor_ref
        subscribe(
            self._transport,
            self._names.checkpoints,
            forward_to(ref, "checkpoint"),
            prefetch=4,
        )
        self._catch_up()
        self._transport.consume(
            self._names.generate_queue(self._pool), self._on_request, prefetch=self._prefetch
        )
        self._heartbeat.start()
        self._log.info("sampler started", version=self.version())

    def on_stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._transport is not None:
            self._transport.close()
        if self._engine is not None:
            self._engine.close()

    def on_failure(self, *exc_info) -> None:
        self.on_stop()

    def version(self) -> int:
        return self._engine.version

    def stats(self) -> dict[str, int]:
        return {"version": self._engine.version, "served": self._served, "loads": self._loads}

    def on_receive(self, message):
        kind, delivery = message
        if kind != "checkpoint":
            raise ValueError(f"sampler: unknown message {kind!r}")
        msg = decode_or_dead_letter(delivery, CheckpointReady)
        if msg is not None:
            self._maybe_load(msg.payload)
            delivery.ack()

    # --- checkpoints -----------------------------------------------------------------

    def _catch_up(self) -> None:
        """A sampler that starts late asks the controller for the latest version."""
        query = encode(CheckpointQuery(requester=self._id), run=self._spec.run)
        try:
            reply = self._transport.call(
                "", self._names.control_rpc, query, timeout=self._query_timeout
            ).result(timeout=self._query_timeout + 1)
        except (TransportError, TimeoutError) as exc:
            self._log.warning("no controller answered; serving initial weights", error=str(exc))
            return
        latest = decode(reply.body, expect=CheckpointReady).payload
        target = latest.version - latest.version % self._every
        if target > self._engine.version and target == latest.version:
            self._maybe_load(latest)

    def _maybe_load(self, ckpt: CheckpointReady) -> None:
        if ckpt.version <= self._engine.version or ckpt.version % self._every:
            return
        start = time.monotonic()
        try:
            digest = checkpoint_digest(ckpt.uri)
            if ckpt.digest and digest != ckpt.digest:
                raise WeightsMismatch(f"digest {digest} is not the announced {ckpt.digest}")
            future = self._engine.load(ckpt.uri, ckpt.version)
        except (OSError, WeightsMismatch) as exc:
            # A broken or half-written checkpoint: keep serving the weights we have.
            self._log.error("checkpoint rejected", version=ckpt.version, error=str(exc))
            self._heartbeat.beat("rejected", rejected_version=float(ckpt.version))
            return
        self._loads += 1
        staged = time.monotonic() - start
        future.add_done_callback(lambda f: self._on_loaded(ckpt, f, staged))

    def _on_loaded(self, ckpt: CheckpointReady, future, staged: float) -> None:
        """The engine serves ``ckpt`` now (or failed to, or was superseded)."""
        error = future.exception()
        if isinstance(error, EngineClosed):
            self._log.debug("checkpoint load abandoned: engine closed", version=ckpt.version)
            return
        if error is not None:
            self._log.error("checkpoint load failed", version=ckpt.version, error=repr(error))
            return
        if self._engine.version != ckpt.version:
            return  # superseded by a newer staged version before it was applied
        lag = time.time() - ckpt.created_at
        self._log.info(
            "checkpoint loaded",
            version=ckpt.version,
            read_s=round(staged, 3),
            since_announce_s=round(lag, 3),
        )
        self._heartbeat.beat("loaded", since_announce=lag, read_seconds=staged)

    # --- heartbeats --------------------------------------------------------------------

    def _gauges(self) -> dict[str, float]:
        gauges = {
            "version": float(self._engine.version),
            "served": float(self._served),
            "loads": float(self._loads),
        }
        stats = getattr(self._engine, "stats", None)  # e.g. prefix reuse counters
        if stats is not None:
            gauges.update({f"engine_{k}": float(v) for k, v in stats().items()})
        return gauges

    # --- requests (I/O thread) ---------------------------------------------------------

    def _on_request(self, delivery: Delivery) -> None:
        msg = decode_or_dead_letter(delivery, GenerateRequest)
        if msg is None:
            return
        req = msg.payload
        future = self._engine.submit(
            req.prompt_ids,
            max_new_tokens=req.max_new_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop_ids=req.stop_ids,
            seed=req.seed,
        )
        future.add_done_callback(lambda f: self._reply(delivery, req, f))

    def _reply(self, delivery: Delivery, req: GenerateRequest, future) -> None:
        exc = future.exception()
        if exc is not None:
            # Hand the request back: another sampler (or this one, later) serves it.
            if isinstance(exc, EngineClosed):
                self._log.debug("engine closed; request handed back")
            else:
                self._log.error("generation failed; request requeued", error=repr(exc))
            delivery.nack(requeue=True)
            return
        gen = future.result()
        result = GenerateResult(
            request_id=req.request_id,
            token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            version=gen.version,
            pool=self._pool,
            finish_reason=gen.finish_reason,
        )
        sent = self._transport.reply(delivery, encode(result, run=self._spec.run))
        sent.add_done_callback(lambda f: _settle(delivery, f))
        self._served += 1


def _settle(delivery: Delivery, sent) -> None:
    """Ack a request once its reply is confirmed; requeue it if the reply was lost.

    A reply that is unroutable means the requester (and its reply queue) is gone,
    e.g. a request left in the queue by an earlier process: nobody waits for it,
    so it is acked, with a log line, instead of being requeued forever.
    """
    error = sent.exception()
    if error is None:
        delivery.ack()
    elif isinstance(error, Unroutable):
        log.info("requester gone; request dropped", reply_to=delivery.reply_to)
        delivery.ack()
    else:
        log.warning("reply not confirmed; request requeued", error=repr(error))
        delivery.nack(requeue=True)
