"""Consumers of the AMQP transport: one channel each, so basic.qos is per consumer.

Runs on the transport's I/O thread, except `AmqpConsumer.cancel` (any thread,
it marshals through the transport). A Delivery remembers the channel it came
on; once that channel is gone (cancel, connection loss) settling it is a
logged no-op because the broker redelivers the message anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import structlog
from pika.exceptions import ChannelClosedByBroker

from ._support import BrokerRefused, resolve, run_consumer_callback
from ._transport import Delivery, TransportError

if TYPE_CHECKING:
    from ._amqp import AmqpTransport

log = structlog.get_logger(__name__)


def refused(what: str, reason: ChannelClosedByBroker) -> BrokerRefused:
    """The error for an operation the broker refused by closing the channel."""
    error = BrokerRefused(f"{what}: {reason.reply_text}", reason.reply_code)
    error.__cause__ = reason
    return error


class AmqpConsumer:
    """One consumer of an AmqpTransport; its state is touched on the I/O thread only."""

    def __init__(
        self,
        transport: AmqpTransport,
        queue: str,
        on_message: Callable[[Delivery], None],
        prefetch: int,
        *,
        auto_ack: bool,
    ) -> None:
        self.transport = transport
        self._queue = queue
        self.on_message = on_message
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.tag = f"{transport.name}.{uuid.uuid4().hex[:12]}"
        self.channel: Any = None
        self.active = True
        self.unsettled = 0
        self.started: Future[None] = Future()
        self.cancelled: Future[None] | None = None

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        return self._queue

    def cancel(self) -> None:
        """Stop deliveries; deliveries already received may still be settled."""
        self.transport.cancel_consumer(self)


class Consumers:
    """The registered consumers of one transport and their channels."""

    def __init__(self, transport: AmqpTransport, connection: Callable[[], Any]) -> None:
        self._transport = transport
        self._connection = connection  # the open connection, or None while not up
        self._log = log.bind(transport=transport.name)
        self._active: dict[str, AmqpConsumer] = {}
        self._cancelling: dict[str, AmqpConsumer] = {}

    def start(self, consumer: AmqpConsumer) -> None:
        """Register; the channel opens now if connected, else on `resume`."""
        self._active[consumer.tag] = consumer
        if self._connection() is not None:
            self._open_channel(consumer)

    def resume(self) -> None:
        """A new connection is up: every active consumer gets a new channel."""
        for consumer in list(self._active.values()):
            self._open_channel(consumer)

    def lost(self) -> None:
        for consumer in self._active.values():
            consumer.channel = None

    def fail_starting(self, error: TransportError) -> None:
        """Fail (and forget) consumers whose basic.consume has not been confirmed."""
        for consumer in list(self._active.values()):
            if not consumer.started.done():
                del self._active[consumer.tag]
                resolve(consumer.started, error=error)

    def release_cancels(self) -> None:
        """Closing: nobody will confirm pending cancels any more."""
        for consumer in self._cancelling.values():
            if consumer.cancelled is not None:
                resolve(consumer.cancelled)
        self._cancelling.clear()

    def _open_channel(self, consumer: AmqpConsumer) -> None:
        def opened(channel: Any) -> None:
            consumer.channel = channel
            consumer.unsettled = 0
            channel.add_on_close_callback(lambda ch, why: self._on_closed(consumer, ch, why))
            channel.add_on_cancel_callback(lambda _: self._on_broker_cancel(consumer, channel))
            channel.basic_qos(prefetch_count=consumer.prefetch, callback=lambda _: consume())

        def consume() -> None:
            if consumer.channel is None or not consumer.channel.is_open:
                return
            consumer.channel.basic_consume(
                consumer.queue,
                lambda ch, method, properties, body: self._on_message(
                    consumer, ch, method, properties, body
                ),
                auto_ack=consumer.auto_ack,
                consumer_tag=consumer.tag,
                callback=lambda _: resolve(consumer.started),
            )

        self._connection().channel(on_open_callback=opened)

    def _on_message(
        self, consumer: AmqpConsumer, channel: Any, method: Any, properties: Any, body: bytes
    ) -> None:
        delivery = Delivery(
            settler=self._transport,
            token=(consumer, channel, method.delivery_tag),
            body=body,
            headers=properties.headers or {},
            queue=consumer.queue,
            exchange=method.exchange,
            routing_key=method.routing_key,
            redelivered=method.redelivered,
            reply_to=properties.reply_to,
            correlation_id=properties.correlation_id,
            no_ack=consumer.auto_ack,
        )
        if not consumer.auto_ack:
            consumer.unsettled += 1
        run_consumer_callback(consumer.on_message, delivery)

    def settle(self, delivery: Delivery, *, ack: bool, requeue: bool) -> None:
        consumer, channel, tag = delivery.token
        if channel is not consumer.channel or not channel.is_open:
            self._log.info(
                "delivery of a lost channel: settling is a no-op, the broker redelivers it",
                queue=consumer.queue,
            )
            return
        consumer.unsettled -= 1
        if ack:
            channel.basic_ack(tag)
        else:
            channel.basic_nack(tag, requeue=requeue)
        if not consumer.active and consumer.unsettled == 0:
            channel.close()

    def cancel(self, consumer: AmqpConsumer, future: Future[None]) -> None:
        consumer.active = False
        self._active.pop(consumer.tag, None)
        channel = consumer.channel
        if channel is None or not channel.is_open:
            resolve(future)
            return
        consumer.cancelled = future
        self._cancelling[consumer.tag] = consumer

        def cancelled(_: Any) -> None:
            self._cancelling.pop(consumer.tag, None)
            resolve(future)
            if consumer.unsettled == 0 and channel.is_open:
                channel.close()

        channel.basic_cancel(consumer.tag, callback=cancelled)

    def _on_broker_cancel(self, consumer: AmqpConsumer, channel: Any) -> None:
        self._log.warning("consumer cancelled by the broker (queue deleted?)", queue=consumer.queue)
        consumer.active = False
        self._active.pop(consumer.tag, None)
        if consumer.unsettled == 0 and channel.is_open:
            channel.close()

    def _on_closed(self, consumer: AmqpConsumer, channel: Any, reason: Any) -> None:
        if self._cancelling.pop(consumer.tag, None) is not None and consumer.cancelled:
            resolve(consumer.cancelled)
        if channel is not consumer.channel:
            return
        consumer.channel = None
        if not isinstance(reason, ChannelClosedByBroker):
            return  # our own close, or the connection is gone (resume() reopens)
        error = refused(f"consume {consumer.queue!r}", reason)
        if not consumer.started.done():
            self._active.pop(consumer.tag, None)
            resolve(consumer.started, error=error)
        elif consumer.active and self._connection() is not None:
            self._log.warning("consumer channel closed by the broker; reopening", error=str(error))
            self._open_channel(consumer)
