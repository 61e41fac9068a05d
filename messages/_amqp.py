"""`amqp://` / `amqps://`: the Transport on RabbitMQ through pika.

pika connections are not thread-safe, so each AmqpTransport owns one
SelectConnection driven by its own I/O thread; every public method marshals
its work onto that thread (one coalesced `add_callback_threadsafe` wake-up for
any number of queued calls) and blocking methods wait on a Future.

Channels: `ctl` runs declarations and passive checks one at a time (a broker
refusal closes only that channel: the operation fails, the channel reopens);
`pub` is in confirm mode and carries every publish (see `_amqp_publish.py`);
each consumer has a channel of its own, so basic.qos gives it its own prefetch.
RPC calls wait for their replies on one exclusive reply queue (`_amqp_rpc.py`).

On connection loss the transport reconnects with back-off, re-declares the
topology it declared (in order, exclusive queues keep their generated names),
re-registers its consumers and re-publishes unconfirmed messages. If the
broker stays away past `reconnect_timeout`, pending work fails with
BrokerUnavailable (new work too, until a reconnect succeeds). Deliveries from
a lost connection cannot be settled any more: ack/nack become logged no-ops
and the broker redelivers them.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pika
import structlog
from pika.adapters.select_connection import IOLoop

from ._amqp_consumers import AmqpConsumer
from ._amqp_link import ControlOp, Link
from ._amqp_publish import Outgoing, Publisher
from ._amqp_rpc import Calls
from ._support import check_exchange_kind, generated_queue_name, queue_arguments, resolve
from ._transport import (
    BrokerUnavailable,
    Delivery,
    TransportClosed,
    TransportError,
)

log = structlog.get_logger(__name__)


PERSISTENT = 2
"""AMQP delivery mode of a persistent message."""


class AmqpTransport:
    """RabbitMQ Transport; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        connect_timeout: float = 15.0,
        reconnect_timeout: float = 60.0,
        close_timeout: float = 5.0,
        persistent: bool = True,
    ) -> None:
        """``persistent``: every publish has delivery mode 2, so a message in a durable
        queue survives a broker restart (False only to measure what that costs)."""
        parameters = pika.URLParameters(url)
        parameters.client_properties = {"connection_name": name}
        parameters.connection_attempts = 1
        self.name = name
        self.persistent = persistent
        self.where = (
            f"{url.split(':', 1)[0]}://{parameters.host}:{parameters.port}"
            f"/{parameters.virtual_host.lstrip('/')}"
        )
        self._log = log.bind(transport=name, broker=self.where)
        self._reconnect_timeout = reconnect_timeout
        self._close_timeout = close_timeout
        self._wait_limit = connect_timeout + reconnect_timeout + 30.0
        self._inbox: deque[Callable[[], None]] = deque()
        self._wake_lock = threading.Lock()
        self._wake_scheduled = False
        self._closing = False
        self._orders = itertools.count(1)
        self._ioloop = IOLoop()
        self._publisher = Publisher(self._ioloop, self._check_exchange)
        self._link = Link(
            self, parameters, self._ioloop, self._publisher, reconnect_timeout=reconnect_timeout
        )
        self._rpc = Calls(self, self._ioloop, self._link, self._outgoing, self._publish_now)
        self._thread = threading.Thread(target=self._run, name=f"agentrl-amqp-{name}", daemon=True)
        self._thread.start()
        try:
            self._link.opened.result(timeout=connect_timeout)
        except FutureTimeout:
            self._shutdown()
            raise BrokerUnavailable(
                f"no broker answered at {self.where} within {connect_timeout}s"
            ) from self._link.last_error
        except BrokerUnavailable:
            self._shutdown()
            raise

    def __repr__(self) -> str:
        return f"AmqpTransport({self.where}, name={self.name!r})"

    # -- threading ----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._link.open()
        except Exception as error:  # e.g. invalid connection parameters
            failure = BrokerUnavailable(f"cannot connect to {self.where}: {error}")
            failure.__cause__ = error
            resolve(self._link.opened, error=failure)
            self._link.state = "closed"
        else:
            try:
                self._ioloop.start()
            except AssertionError as error:
                # pika asserts when a connection workflow it is still running (a broker
                # that accepted TCP and never answered) is aborted by our own close: the
                # caller already has its BrokerUnavailable, this is not news
                if not self._closing:
                    raise
                self._log.debug("connection attempt aborted by close", error=repr(error))
        self._ioloop.close()

    def _submit(self, call: Callable[[], None]) -> None:
        """Run `call` on the I/O thread (thread-safe, wake-ups coalesced)."""
        if not self._thread.is_alive() and self._thread.ident is not None:
            self._log.debug("I/O thread has stopped; task dropped")
            return
        self._inbox.append(call)
        with self._wake_lock:
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        self._ioloop.add_callback_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._wake_lock:
            self._wake_scheduled = False
        while self._inbox:
            call = self._inbox.popleft()
            try:
                call()
            except Exception:
                self._log.exception("I/O thread task raised")

    def _check(self, *, blocking: bool) -> None:
        if self._closing:
            raise TransportClosed(f"{self!r} is closed")
        if blocking and threading.current_thread() is self._thread:
            raise TransportError(f"blocking call on {self!r}'s own I/O thread")

    def _wait(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(timeout=self._wait_limit)
        except FutureTimeout:
            raise TransportError(f"{what}: no answer from {self!r}") from None

    def _control(self, what: str, run: ControlOp, remember: tuple | None = None) -> Any:
        """Run one operation on the ctl channel and wait for its result."""
        self._check(blocking=True)
        future: Future[Any] = Future()
        self._submit(lambda: self._link.submit_control(what, run, future, remember))
        return self._wait(future, what)

    # -- declarations -------------------------------------------------------

    def declare_exchange(self, name: str, kind: str) -> None:
        check_exchange_kind(kind)

        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.exchange_declare(name, kind, durable=True, callback=lambda _: done(None))

        self._control(f"declare exchange {name!r}", run, ("exchange", name, run))

    def declare_queue(
        self,
        name: str = "",
        *,
        max_length: int | None = None,
        exclusive: bool = False,
        dead_letter: bool = True,
        durable: bool | None = None,
    ) -> str:
        name = name or generated_queue_name(self.name)
        arguments = queue_arguments(name, max_length=max_length, dead_letter=dead_letter)
        durable = not exclusive if durable is None else durable

        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.queue_declare(
                name,
                durable=durable,
                exclusive=exclusive,
                arguments=arguments,
                callback=lambda _: done(name),
            )

        return self._control(f"declare queue {name!r}", run, ("queue", name, run))

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.queue_bind(queue, exchange, routing_key, callback=lambda _: done(None))

        remember = ("bind", (queue, exchange, routing_key), run)
        self._control(f"bind {queue!r} to {exchange!r}", run, remember)

    def queue_depth(self, queue: str) -> int:
        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.queue_declare(
                queue, passive=True, callback=lambda f: done(f.method.message_count)
            )

        return self._control(f"depth of queue {queue!r}", run)

    def delete_queue(self, name: str) -> None:
        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.queue_delete(name, callback=lambda _: done(None))

        self._control(f"delete queue {name!r}", run, ("forget-queue", name, run))

    def delete_exchange(self, name: str) -> None:
        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.exchange_delete(name, callback=lambda _: done(None))

        self._control(f"delete exchange {name!r}", run, ("forget-exchange", name, run))

    def _check_exchange(self, name: str, then: Callable[[BaseException | None], None]) -> None:
        """Passive declare (I/O thread) so a publish never closes `pub` with a 404."""

        def run(channel: Any, done: Callable[[Any], None]) -> None:
            channel.exchange_declare(name, passive=True, callback=lambda _: done(None))

        future: Future[Any] = Future()
        future.add_done_callback(lambda f: then(f.exception()))
        self._link.submit_control(f"check exchange {name!r}", run, future, None)

    # -- messages -----------------------------------------------------------

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
        self._check(blocking=False)
        out = self._outgoing(exchange, routing_key, body, headers, reply_to, correlation_id)
        self._submit(lambda: self._publish_now(out))
        return out.future

    def _outgoing(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: dict[str, Any] | None,
        reply_to: str | None,
        correlation_id: str | None,
    ) -> Outgoing:
        order = next(self._orders)
        properties = pika.BasicProperties(
            delivery_mode=PERSISTENT if self.persistent else None,
            headers=dict(headers) if headers else None,
            reply_to=reply_to,
            correlation_id=correlation_id,
            message_id=str(order),
        )
        return Outgoing(order, exchange, routing_key, bytes(body), properties, Future())

    def _publish_now(self, out: Outgoing) -> None:
        if self._link.gave_up is not None:
            resolve(out.future, error=self._link.gave_up)
        elif self._link.state in ("closing", "closed"):
            resolve(out.future, error=TransportClosed(f"{self!r} was closed"))
        else:
            self._publisher.submit(out)

    def consume(
        self, queue: str, on_message: Callable[[Delivery], None], *, prefetch: int
    ) -> AmqpConsumer:
        self._check(blocking=True)
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        consumer = AmqpConsumer(self, queue, on_message, prefetch, auto_ack=False)
        self._submit(lambda: self._link.start_consumer(consumer))
        self._wait(consumer.started, f"consume {queue!r}")
        return consumer

    def cancel_consumer(self, consumer: AmqpConsumer) -> None:
        """Cancel a consumer (called by AmqpConsumer.cancel); blocks until cancel-ok."""
        if self._closing:
            return
        self._check(blocking=True)
        future: Future[None] = Future()
        self._submit(lambda: self._link.consumers.cancel(consumer, future))
        self._wait(future, f"cancel consumer of {consumer.queue!r}")

    def settle(self, delivery: Delivery, *, ack: bool, requeue: bool) -> None:
        """Settle a delivery (called by Delivery.ack/nack); any thread."""
        if self._link.state == "closed":
            self._log.debug("settle after close ignored; the broker requeued it")
            return
        self._submit(lambda: self._link.consumers.settle(delivery, ack=ack, requeue=requeue))

    # -- RPC ----------------------------------------------------------------

    def call(
        self, exchange: str, routing_key: str, body: bytes, *, timeout: float | None = None
    ) -> Future[Delivery]:
        self._check(blocking=False)
        future: Future[Delivery] = Future()
        correlation_id = uuid.uuid4().hex
        self._submit(
            lambda: self._rpc.send(future, exchange, routing_key, body, correlation_id, timeout)
        )
        return future

    def fail_calls(self, error: TransportError, *, only_sent: bool) -> None:
        """Fail pending calls (all, or those whose request was already confirmed)."""
        self._rpc.fail(error, only_sent=only_sent)

    def reply(self, request: Delivery, body: bytes) -> Future[None]:
        if not request.reply_to:
            raise TransportError(f"{request!r} has no reply_to")
        return self.publish("", request.reply_to, body, correlation_id=request.correlation_id)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Wait up to close_timeout for in-flight confirms, fail the rest, disconnect."""
        if threading.current_thread() is self._thread:
            raise TransportError(f"blocking call on {self!r}'s own I/O thread")
        with self._wake_lock:
            if self._closing:
                return
            self._closing = True
        drained: Future[None] = Future()

        def begin() -> None:
            self._publisher.fail_waiting(TransportClosed(f"{self!r} was closed"))
            self._publisher.when_drained(lambda: resolve(drained))

        self._submit(begin)
        started = time.monotonic()
        try:
            drained.result(timeout=self._close_timeout)
        except FutureTimeout:
            self._log.warning("closing with unconfirmed publishes", waited=self._close_timeout)
        self._shutdown()
        self._log.debug("transport closed", seconds=round(time.monotonic() - started, 3))

    def _shutdown(self) -> None:
        self._closing = True
        self._submit(lambda: self._link.stop(TransportClosed(f"{self!r} was closed")))
        self._thread.join(timeout=self._close_timeout + 5.0)
        if self._thread.is_alive():
            self._log.error("I/O thread did not stop")
