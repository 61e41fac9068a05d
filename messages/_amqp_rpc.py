"""RPC on the AMQP transport: the exclusive reply queue, declared on first use, and the
calls waiting for their replies, by correlation id.

Everything here runs on the transport's I/O thread (`AmqpTransport.call` submits `send`).
A call fails when its request cannot be published, when no reply comes within its
``timeout``, or when the transport fails it (`AmqpTransport.fail_calls`: the connection
was lost after its request was confirmed, or the broker stayed away).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import structlog

from ._amqp_consumers import AmqpConsumer
from ._amqp_publish import Outgoing
from ._support import generated_queue_name, resolve
from ._transport import Delivery, TransportError

if TYPE_CHECKING:
    from ._amqp import AmqpTransport
    from ._amqp_link import Link

log = structlog.get_logger(__name__)


class Calls:
    """The RPC calls of one transport waiting for their replies (I/O thread)."""

    def __init__(
        self,
        transport: AmqpTransport,
        ioloop: Any,
        link: Link,
        outgoing: Callable[..., Outgoing],
        publish_now: Callable[[Outgoing], None],
    ) -> None:
        """``outgoing(exchange, routing_key, body, headers, reply_to, correlation_id)``
        builds a publish, ``publish_now`` sends it (the transport's own)."""
        self._transport = transport
        self._ioloop = ioloop
        self._link = link
        self._outgoing = outgoing
        self._publish_now = publish_now
        self._log = log.bind(transport=transport.name, broker=transport.where)
        self._calls: dict[str, tuple[Future[Delivery], Future[None]]] = {}
        self._reply_queue: str | None = None
        self._reply_waiters: list[Callable[[BaseException | None], None]] | None = None

    def send(
        self,
        future: Future[Delivery],
        exchange: str,
        routing_key: str,
        body: bytes,
        correlation_id: str,
        timeout: float | None,
    ) -> None:
        """Publish a call's request once the reply queue is there; ``future`` gets the reply."""

        def start(error: BaseException | None) -> None:
            if error is not None:
                resolve(future, error=error)
                return
            out = self._outgoing(
                exchange, routing_key, body, None, self._reply_queue, correlation_id
            )
            self._calls[correlation_id] = (future, out.future)
            out.future.add_done_callback(lambda f: self._request_failed(correlation_id, f))
            self._publish_now(out)
            if timeout is not None:
                self._ioloop.call_later(timeout, lambda: self._expire(correlation_id, timeout))

        self._with_reply_queue(start)

    def _with_reply_queue(self, then: Callable[[BaseException | None], None]) -> None:
        """Declare the exclusive reply queue and its consumer once, then call `then`."""
        if self._reply_queue is not None and self._reply_waiters is None:
            then(None)
            return
        if self._reply_waiters is not None:
            self._reply_waiters.append(then)
            return
        self._reply_waiters = [then]
        name = generated_queue_name(self._transport.name, "reply")

        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.queue_declare(name, exclusive=True, callback=lambda _: done(name))

        def declared(future: Future[Any]) -> None:
            error = future.exception()
            if error is None:
                self._reply_queue = name
                reply_consumer = AmqpConsumer(
                    self._transport, name, self._on_reply, 0, auto_ack=True
                )
                self._link.start_consumer(reply_consumer)
            waiters, self._reply_waiters = self._reply_waiters or [], None
            for waiter in waiters:
                waiter(error)

        future: Future[Any] = Future()
        future.add_done_callback(declared)
        self._link.submit_control("declare reply queue", run, future, ("queue", name, run))

    def _request_failed(self, correlation_id: str, sent: Future[None]) -> None:
        error = sent.exception()
        if error is not None and (pending := self._calls.pop(correlation_id, None)):
            resolve(pending[0], error=error)

    def _expire(self, correlation_id: str, timeout: float) -> None:
        if (pending := self._calls.pop(correlation_id, None)) is not None:
            resolve(pending[0], error=TimeoutError(f"no RPC reply within {timeout}s"))

    def _on_reply(self, delivery: Delivery) -> None:
        pending = self._calls.pop(delivery.correlation_id or "", None)
        if pending is None:
            self._log.debug("late or unknown RPC reply dropped", id=delivery.correlation_id)
            return
        resolve(pending[0], delivery)

    def fail(self, error: TransportError, *, only_sent: bool) -> None:
        """Fail pending calls (all, or those whose request was already confirmed)."""
        for correlation_id, (future, sent) in list(self._calls.items()):
            if not only_sent or (sent.done() and sent.exception() is None):
                del self._calls[correlation_id]
                resolve(future, error=error)
