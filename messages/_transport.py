"""The Transport interface: bytes in, bytes out, over a broker.

One Protocol (`Transport`), two implementations (`memory://` in `_memory.py`,
`amqp://` in `_amqp.py`, both opened by `_connect.connect`), one conformance suite
(`tests/unit/transport_suite.py`).
The records and codec live elsewhere; a Transport never looks inside a body.

Threading contract shared by both implementations: every public method is
thread-safe; consumer callbacks, and the done-callbacks of the futures a
transport returns, run on the transport's own I/O thread. Blocking methods
(declarations, `consume`, `queue_depth`, `Consumer.cancel`, `close`) must not
be called from that thread: they raise `TransportError` instead of deadlocking.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

REASON_HEADER = "x-agentrl-reason"
"""Header set by `Delivery.dead_letter`: why the message was dead-lettered."""
QUEUE_HEADER = "x-agentrl-queue"
"""Header set by `Delivery.dead_letter`: the queue the message was taken from (for a
broadcast, the exchange it was published to: its queue is a server-named one of the
consumer's own)."""


class TransportError(Exception):
    """Raised when a transport operation fails (base class of all transport errors).

    Also raised directly for broker-side refusals such as a re-declaration with
    different arguments, a missing queue, or a blocking call made from the
    transport's own I/O thread.
    """


class BrokerUnavailable(TransportError):
    """Raised when the broker cannot be reached, or the connection was lost and
    not re-established before the give-up deadline."""


class BrokerLoginRefused(BrokerUnavailable):
    """Raised when the broker refused the connection itself: wrong credentials, a user
    without access, or a virtual host that does not exist. Not transient: retrying
    cannot help, so roles fail their start with it instead of reconnecting."""


class Unroutable(TransportError):
    """Raised (on the publish future) when a message reached no queue: the
    exchange does not exist or no binding matched."""


class TransportClosed(TransportError):
    """Raised when the transport was closed by its owner before the operation finished."""


class Settler(Protocol):
    """What a Delivery needs from the transport that produced it."""

    def settle(self, delivery: Delivery, *, ack: bool, requeue: bool) -> None:
        """Ack (or nack, requeueing or not) the delivery; any thread."""
        ...

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> Future[None]:
        """Publish with confirm (used by `Delivery.dead_letter`)."""
        ...


class Delivery:
    """One message handed to a consumer; settle it exactly once."""

    __slots__ = (
        "_lock",
        "_no_ack",
        "_settled",
        "_settler",
        "body",
        "correlation_id",
        "exchange",
        "headers",
        "queue",
        "redelivered",
        "reply_to",
        "routing_key",
        "token",
    )

    def __init__(
        self,
        *,
        settler: Settler,
        token: Any,
        body: bytes,
        headers: dict[str, Any],
        queue: str,
        exchange: str,
        routing_key: str,
        redelivered: bool,
        reply_to: str | None,
        correlation_id: str | None,
        no_ack: bool = False,
    ) -> None:
        self.body = body
        """The message body, untouched."""
        self.headers = headers
        """Application headers (empty dict when none)."""
        self.queue = queue
        """The queue this delivery was taken from."""
        self.exchange = exchange
        """The exchange the message was published to ('' = default exchange)."""
        self.routing_key = routing_key
        """The routing key it was published with."""
        self.redelivered = redelivered
        """True when the broker delivered this message before (nack, lost consumer)."""
        self.reply_to = reply_to
        """Queue to send an RPC reply to (see `Transport.reply`), or None."""
        self.correlation_id = correlation_id
        """RPC correlation id, or None."""
        self.token = token
        """Implementation-private handle used to settle the delivery."""
        self._settler = settler
        self._no_ack = no_ack
        self._settled = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"Delivery(queue={self.queue!r}, routing_key={self.routing_key!r}, "
            f"redelivered={self.redelivered}, {len(self.body)} bytes)"
        )

    @property
    def settled(self) -> bool:
        """True once ack, nack or dead_letter was called (always True for auto-ack)."""
        return self._settled or self._no_ack

    @property
    def dead_letter_exchange(self) -> str | None:
        """The DLX this delivery's queue belongs to (see `dead_letter_exchange_for`); for a
        broadcast taken from a server-named queue (``amq.gen-...``, see `subscribe`), the
        DLX of the run whose exchange it was published to (``<run>.checkpoints`` ->
        ``<run>.dlx``)."""
        return dead_letter_exchange_for(self.queue) or dead_letter_exchange_for(self.exchange)

    def _claim(self) -> bool:
        if self._no_ack:
            return False
        with self._lock:
            if self._settled:
                raise TransportError(f"{self!r} was already settled")
            self._settled = True
        return True

    def ack(self) -> None:
        """Acknowledge: the broker forgets the message. Any thread."""
        if self._claim():
            self._settler.settle(self, ack=True, requeue=False)

    def nack(self, requeue: bool = True) -> None:
        """Reject: back to the queue (redelivered=True), or to the queue's DLX."""
        if self._claim():
            self._settler.settle(self, ack=False, requeue=requeue)

    def dead_letter(self, reason: str) -> None:
        """Publish body+headers to `<run>.dlx` with `x-agentrl-reason`/`x-agentrl-queue`
        headers, and ack once the broker confirmed it. Does not block.

        If that publish fails, the failure is logged and the delivery is nacked
        without requeue (so the broker's own dead-lettering applies).
        """
        exchange = self.dead_letter_exchange
        if exchange is None:
            raise TransportError(f"queue {self.queue!r} has no dead-letter exchange")
        if not self._claim():
            return
        where = self.queue if dead_letter_exchange_for(self.queue) else self.exchange
        headers = {**self.headers, REASON_HEADER: reason, QUEUE_HEADER: where}
        try:
            future = self._settler.publish(exchange, self.routing_key, self.body, headers=headers)
        except TransportClosed:
            log.info("transport closed: dead_letter is a no-op, the broker redelivers it")
            return
        future.add_done_callback(self._after_dead_letter)

    def _after_dead_letter(self, future: Future[None]) -> None:
        error = future.exception()
        if error is None:
            self._settler.settle(self, ack=True, requeue=False)
            return
        log.error("dead_letter publish failed; rejecting instead", queue=self.queue, error=error)
        self._settler.settle(self, ack=False, requeue=False)


class Consumer(Protocol):
    """A registered consumer; `cancel()` stops deliveries (unsettled ones stay valid)."""

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        ...

    def cancel(self) -> None:
        """Stop receiving; blocks until the broker confirmed. Idempotent."""
        ...


class Transport(Protocol):
    """A broker connection. Every method is thread-safe (see module docstring)."""

    def declare_exchange(self, name: str, kind: str) -> None:
        """Declare a direct|fanout|topic exchange; idempotent."""
        ...

    def declare_queue(
        self,
        name: str = "",
        *,
        max_length: int | None = None,
        exclusive: bool = False,
        dead_letter: bool = True,
        durable: bool | None = None,
    ) -> str:
        """Declare a queue and return its name ('' -> a unique generated name).

        `max_length` bounds the ready messages (publishers are held back, never
        dropped); `dead_letter` sets the queue's DLX to `<run>.dlx`. `durable` (default:
        not `exclusive`) queues and their messages (every publish is persistent) survive
        a broker restart; a redeclaration with the other durability is refused (406).
        Exchanges are always durable.
        """
        ...

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        """Bind a queue to an exchange; idempotent."""
        ...

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> Future[None]:
        """Publish; the future resolves on the broker's confirm, fails with Unroutable."""
        ...

    def consume(
        self, queue: str, on_message: Callable[[Delivery], None], *, prefetch: int
    ) -> Consumer:
        """Start consuming; `on_message` runs on the I/O thread. prefetch 0 = unlimited."""
        ...

    def call(
        self, exchange: str, routing_key: str, body: bytes, *, timeout: float | None = None
    ) -> Future[Delivery]:
        """RPC: publish with reply-to + correlation id; the future gets the reply.

        On timeout the future fails with `TimeoutError`.
        """
        ...

    def reply(self, request: Delivery, body: bytes) -> Future[None]:
        """Send `body` as the reply to an RPC request."""
        ...

    def queue_depth(self, queue: str) -> int:
        """Number of ready (not yet delivered) messages in a queue."""
        ...

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages (tests and ops); missing is fine."""
        ...

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange (tests and ops); missing is fine."""
        ...

    def close(self) -> None:
        """Wait briefly for in-flight confirms, then disconnect. Idempotent."""
        ...


def dead_letter_exchange_for(queue: str) -> str | None:
    """`<run>.dlx` for a queue named `<run>.<anything>`; None for names without a dot.

    The run is the queue name up to its first dot, which is why run names may
    not contain dots (see `Topology`).
    """
    run, dot, _ = queue.partition(".")
    if not dot or not run or run == "amq":
        return None
    return f"{run}.dlx"


@dataclass(frozen=True, slots=True)
class Topology:
    """Names of every exchange and queue of one run, all prefixed `<run>.`."""

    run: str
    """The run id; no dots (queue names are `<run>.<suffix>` and the DLX is found by prefix)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.run):
            raise ValueError(f"run must match [A-Za-z0-9_-]+, got {self.run!r}")

    @property
    def episodes(self) -> str:
        """Work queue of EpisodeRequest (default exchange, key = queue name)."""
        return f"{self.run}.episodes"

    @property
    def trajectories(self) -> str:
        """Bounded work queue of Trajectory (max_length = trajectory_capacity)."""
        return f"{self.run}.trajectories"

    @property
    def generate(self) -> str:
        """Direct exchange for GenerateRequest; routing key = sampler pool."""
        return f"{self.run}.generate"

    def generate_queue(self, pool: str) -> str:
        """Work queue of one sampler pool, bound to `generate` with key = pool."""
        return f"{self.run}.generate.{pool}"

    @property
    def checkpoints(self) -> str:
        """Fanout exchange for CheckpointReady (each sampler binds its own exclusive queue)."""
        return f"{self.run}.checkpoints"

    @property
    def control(self) -> str:
        """Topic exchange for ControlCommand / Heartbeat / MetricsReport."""
        return f"{self.run}.control"

    @property
    def control_rpc(self) -> str:
        """The controller's RPC queue (CheckpointQuery)."""
        return f"{self.run}.control.rpc"

    @property
    def dlx(self) -> str:
        """Fanout dead-letter exchange of the run."""
        return f"{self.run}.dlx"

    @property
    def dead(self) -> str:
        """The queue bound to `dlx` that keeps dead-lettered messages."""
        return f"{self.run}.dead"

    def declare(self, transport: Transport, pools: Iterable[str], trajectory_capacity: int) -> None:
        """Declare all of the run's exchanges, queues and bindings (idempotent)."""
        transport.declare_exchange(self.dlx, "fanout")
        transport.declare_queue(self.dead, dead_letter=False)
        transport.bind(self.dead, self.dlx)
        transport.declare_queue(self.episodes)
        transport.declare_queue(self.trajectories, max_length=trajectory_capacity)
        transport.declare_exchange(self.generate, "direct")
        for pool in pools:
            queue = transport.declare_queue(self.generate_queue(pool))
            transport.bind(queue, self.generate, pool)
        transport.declare_exchange(self.checkpoints, "fanout")
        transport.declare_exchange(self.control, "topic")
        transport.declare_queue(self.control_rpc)
