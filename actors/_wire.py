"""Small helpers the actors share for talking to the transport."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import pykka
import structlog

from agentrl.messages import Delivery, MessageError, Topology, Transport, Unroutable, decode

log = structlog.get_logger(__name__)

__all__ = ["TopologySpec", "broadcast", "declare", "decode_or_dead_letter", "subscribe", "wait_all"]


@dataclass(frozen=True)
class TopologySpec:
    """What every actor needs to declare the run's queues and exchanges identically."""

    run: str
    """Run name; prefixes every queue and exchange."""
    pools: tuple[str, ...]
    """Sampler pool names; each gets a `generate.<pool>` queue."""
    trajectory_capacity: int
    """x-max-length of the trajectories queue (publishers back off when it is full)."""


def declare(transport: Transport, spec: TopologySpec) -> Topology:
    """Declare the whole topology (idempotent: every actor does it in on_start)."""
    topology = Topology(spec.run)
    topology.declare(transport, list(spec.pools), spec.trajectory_capacity)
    return topology


def wait_all(futures: Iterable[Future], timeout: float | None = None) -> None:
    """Wait for publisher confirms; the first failure is raised."""
    for future in futures:
        future.result(timeout=timeout)


def decode_or_dead_letter(delivery: Delivery, expect: type):
    """Decode a delivery, or send it to the dead-letter queue with the reason and return None."""
    try:
        return decode(delivery.body, expect=expect)
    except MessageError as exc:
        log.warning("malformed message dead-lettered", queue=delivery.queue, reason=str(exc))
        delivery.dead_letter(str(exc))
        return None


def broadcast(transport: Transport, exchange: str, routing_key: str, body: bytes) -> bool:
    """Publish to a fanout/topic exchange and wait for the confirm.

    Unlike a work-queue publish, a broadcast nobody listens to is not an error
    (e.g. metrics before any controller started): it is logged and False is
    returned.
    """
    try:
        transport.publish(exchange, routing_key, body).result()
    except Unroutable:
        log.debug("broadcast had no listeners", exchange=exchange, routing_key=routing_key)
        return False
    return True


def broadcast_nowait(transport: Transport, exchange: str, routing_key: str, body: bytes) -> None:
    """Publish a broadcast without waiting for its confirm (safe from any thread).

    For notices whose loss only delays an observer (heartbeats): the outcome is
    logged, never raised.
    """

    def settled(future) -> None:
        error = future.exception()
        if isinstance(error, Unroutable):
            log.debug("broadcast had no listeners", exchange=exchange, routing_key=routing_key)
        elif error is not None:
            log.warning("broadcast not confirmed", routing_key=routing_key, error=repr(error))

    transport.publish(exchange, routing_key, body).add_done_callback(settled)


def forward_to(ref, kind: str) -> Callable[[Delivery], None]:
    """A consumer callback that hands each delivery to actor ``ref`` as ``(kind, delivery)``.

    Deliveries that arrive while the actor is stopping (its transport not yet
    closed) go back to the broker (nack with requeue) instead of raising on the
    I/O thread: another consumer, or this one after a restart, gets them.
    """

    def forward(delivery: Delivery) -> None:
        try:
            ref.tell((kind, delivery))
        except pykka.ActorDeadError:
            delivery.nack(requeue=True)

    return forward


def subscribe(
    transport: Transport,
    exchange: str,
    on_message: Callable[[Delivery], None],
    *,
    routing_key: str = "",
    prefetch: int = 16,
) -> None:
    """Receive an exchange's broadcasts on a queue of this connection's own (exclusive)."""
    queue = transport.declare_queue("", exclusive=True, dead_letter=False)
    transport.bind(queue, exchange, routing_key)
    transport.consume(queue, on_message, prefetch=prefetch)
