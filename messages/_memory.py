"""`memory://<name>`: the in-process Transport, with the AMQP transport's semantics.

Several `MemoryTransport`s opened with the same URL in one process share one
`Broker` (see `_memory_broker.py`). Each transport has a dispatcher thread that
plays the role of the AMQP I/O thread: consumer callbacks and the resolution
of the futures it returns run there, never in the publisher's thread.
`reset_memory_broker(name)` closes everything attached to a broker and forgets it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import urllib.parse
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog

from ._memory_broker import Broker
from ._memory_state import ConsumerRecord, Message
from ._support import (
    check_exchange_kind,
    generated_queue_name,
    queue_arguments,
    resolve,
    run_consumer_callback,
)
from ._transport import Delivery, TransportClosed, TransportError

log = structlog.get_logger(__name__)

_registry_lock = threading.Lock()
_brokers: dict[str, Broker] = {}
_attached: dict[str, weakref.WeakSet[MemoryTransport]] = {}


def _attach(name: str, transport: MemoryTransport) -> Broker:
    with _registry_lock:
        if name not in _brokers:
            _brokers[name] = Broker(name)
            _attached[name] = weakref.WeakSet()
        _attached[name].add(transport)
        return _brokers[name]


def reset_memory_broker(name: str) -> None:
    """Close every transport attached to `memory://<name>` and forget its state."""
    with _registry_lock:
        transports = list(_attached.pop(name, ()))
        _brokers.pop(name, None)
    for transport in transports:
        transport.close()


class EventLoop:
    """A thread running posted callables and timers in order (the 'I/O thread')."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def post(self, call: Callable[[], None]) -> None:
        """Run `call` on the loop thread soon (dropped once the loop has stopped)."""
        with self._cond:
            self._calls.append(call)
            self._cond.notify()

    def call_later(self, delay: float, call: Callable[[], None]) -> None:
        """Run `call` on the loop thread after `delay` seconds (unless stopped first)."""
        with self._cond:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), call))
            self._cond.notify()

    def stop(self) -> None:
        """Run what was already posted, drop pending timers, join the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if threading.current_thread() is not self.thread:
            self.thread.join()

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while True:
                if self._calls:
                    return self._calls.popleft()
                if self._stopping:
                    return None
                now = time.monotonic()
                if self._timers and self._timers[0][0] <= now:
                    return heapq.heappop(self._timers)[2]
                wait = self._timers[0][0] - now if self._timers else None
                self._cond.wait(wait)

    def _run(self) -> None:
        while (call := self._next()) is not None:
            try:
                call()
            except Exception:
                log.exception("callback on the memory transport loop raised")


class MemoryConsumer:
    """Handle of one consumer of a MemoryTransport."""

    def __init__(self, transport: MemoryTransport, record: ConsumerRecord) -> None:
        self._transport = transport
        self._record = record

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        return self._record.queue

    def cancel(self) -> None:
        """Stop deliveries; deliveries already handed out may still be settled."""
        self._transport._check(blocking=True, allow_closed=True)
        self._transport._broker.cancel(self._record.tag)


class MemoryTransport:
    """In-process Transport; see the module docstring."""

    def __init__(self, url: str, *, name: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "memory":
            raise ValueError(f"not a memory:// URL: {url!r}")
        self.broker_name = (parts.netloc + parts.path).strip("/") or "default"
        self.name = name
        self._log = log.bind(transport=name, broker=f"memory://{self.broker_name}")
        self._lock = threading.Lock()
        self._closed = False
        self._tags = itertools.count(1)
        self._calls: dict[str, Future[Delivery]] = {}
        self._reply_queue: str | None = None
        self._loop = EventLoop(f"agentrl-memory-{name}")
        self._broker = _attach(self.broker_name, self)
        self._log.debug("transport opened")

    def __repr__(self) -> str:
        return f"MemoryTransport(memory://{self.broker_name}, name={self.name!r})"

    def _check(self, *, blocking: bool, allow_closed: bool = False) -> None:
        if self._closed and not allow_closed:
            raise TransportClosed(f"{self!r} is closed")
        if blocking and threading.current_thread() is self._loop.thread:
            raise TransportError(f"blocking call on {self!r}'s own callback thread")

    # -- declarations -------------------------------------------------------

    def declare_exchange(self, name: str, kind: str) -> None:
        check_exchange_kind(kind)
        self._check(blocking=True)
        self._broker.declare_exchange(name, kind)

    def declare_queue(
        self,
        name: str = "",
        *,
        max_length: int | None = None,
        exclusive: bool = False,
        dead_letter: bool = True,
        durable: bool | None = None,
    ) -> str:
        self._check(blocking=True)
        name = name or generated_queue_name(self.name)
        arguments = queue_arguments(name, max_length=max_length, dead_letter=dead_letter)
        durable = not exclusive if durable is None else durable
        self._broker.declare_queue(name, arguments, self if exclusive else None, durable)
        return name

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self._check(blocking=True)
        self._broker.bind(queue, exchange, routing_key)

    def queue_depth(self, queue: str) -> int:
        self._check(blocking=True)
        return self._broker.depth(queue, self)

    def delete_queue(self, name: str) -> None:
        self._check(blocking=True)
        self._broker.delete_queue(name)

    def delete_exchange(self, name: str) -> None:
        self._check(blocking=True)
        self._broker.delete_exchange(name)

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
        future: Future[None] = Future()
        message = Message(
            bytes(body), dict(headers or {}), exchange, routing_key, reply_to, correlation_id
        )

        def done(error: BaseException | None) -> None:
            self._loop.post(lambda: resolve(future, None, error))

        self._broker.publish(self, exchange, message, done)
        return future

    def consume(
        self, queue: str, on_message: Callable[[Delivery], None], *, prefetch: int
    ) -> MemoryConsumer:
        self._check(blocking=True)
        return self._consume(queue, on_message, prefetch=prefetch, auto_ack=False)

    def _consume(
        self, queue: str, on_message: Callable[[Delivery], None], *, prefetch: int, auto_ack: bool
    ) -> MemoryConsumer:
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        tag = f"{self.name}.{next(self._tags)}.{uuid.uuid4().hex[:8]}"

        def deliver(message: Message, token: int) -> None:
            self._loop.post(lambda: self._deliver(record, message, token, on_message))

        record = ConsumerRecord(tag, queue, self, prefetch, auto_ack, deliver)
        self._broker.consume(record)
        return MemoryConsumer(self, record)

    def _deliver(
        self,
        record: ConsumerRecord,
        message: Message,
        token: int,
        on_message: Callable[[Delivery], None],
    ) -> None:
        if self._closed:
            return  # the broker requeued it when this transport detached
        delivery = Delivery(
            settler=self,
            token=(record.tag, token),
            body=message.body,
            headers=message.headers,
            queue=record.queue,
            exchange=message.exchange,
            routing_key=message.routing_key,
            redelivered=message.redelivered,
            reply_to=message.reply_to,
            correlation_id=message.correlation_id,
            no_ack=record.auto_ack,
        )
        if not record.active and not record.auto_ack:
            delivery.nack(requeue=True)  # arrived after cancel: back to the queue, as pika does
            return
        run_consumer_callback(on_message, delivery)

    def settle(self, delivery: Delivery, *, ack: bool, requeue: bool) -> None:
        """Settle a delivery (called by Delivery.ack/nack); any thread."""
        if self._closed:
            self._log.debug(
                "settle after close ignored; the broker requeued it", queue=delivery.queue
            )
            return
        tag, token = delivery.token
        self._broker.settle(tag, token, ack=ack, requeue=requeue)

    # -- RPC ----------------------------------------------------------------

    def call(
        self, exchange: str, routing_key: str, body: bytes, *, timeout: float | None = None
    ) -> Future[Delivery]:
        self._check(blocking=False)
        with self._lock:
            if self._reply_queue is None:
                queue = generated_queue_name(self.name, "reply")
                self._broker.declare_queue(queue, {}, self)
                self._consume(queue, self._on_reply, prefetch=0, auto_ack=True)
                self._reply_queue = queue
            reply_queue = self._reply_queue
        correlation_id = uuid.uuid4().hex
        future: Future[Delivery] = Future()
        self._calls[correlation_id] = future
        sent = self.publish(
            exchange, routing_key, body, reply_to=reply_queue, correlation_id=correlation_id
        )
        sent.add_done_callback(lambda f: self._on_request_sent(correlation_id, f))
        if timeout is not None:
            self._loop.call_later(timeout, lambda: self._expire(correlation_id, timeout))
        return future

    def _on_request_sent(self, correlation_id: str, sent: Future[None]) -> None:
        error = sent.exception()
        if error is not None and (future := self._calls.pop(correlation_id, None)):
            resolve(future, error=error)

    def _expire(self, correlation_id: str, timeout: float) -> None:
        if (future := self._calls.pop(correlation_id, None)) is not None:
            resolve(future, error=TimeoutError(f"no RPC reply within {timeout}s"))

    def _on_reply(self, delivery: Delivery) -> None:
        future = self._calls.pop(delivery.correlation_id or "", None)
        if future is None:
            self._log.debug("late or unknown RPC reply dropped", id=delivery.correlation_id)
            return
        resolve(future, delivery)

    def reply(self, request: Delivery, body: bytes) -> Future[None]:
        if not request.reply_to:
            raise TransportError(f"{request!r} has no reply_to")
        return self.publish("", request.reply_to, body, correlation_id=request.correlation_id)

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Requeue unacked deliveries, fail pending work, stop the loop. Idempotent."""
        self._check(blocking=True, allow_closed=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        closed = TransportClosed(f"{self!r} was closed")
        self._broker.detach(self, closed)
        for future in list(self._calls.values()):
            self._loop.post(lambda f=future: resolve(f, error=closed))
        self._calls.clear()
        self._loop.stop()
        self._log.debug("transport closed")
