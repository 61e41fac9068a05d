"""The publishing half of the AMQP transport: confirms, returns, back-off, replay.

Runs on the transport's I/O thread only. Many messages are in flight at once;
each publish future resolves on the broker's ack (or fails with Unroutable
after a basic.return). A nack means a bounded queue is full
(`x-overflow: reject-publish`): the message is held, and so is every later
message for the same (exchange, routing key), while one probe is retried with
capped exponential back-off; once the probe is acked the held messages are
sent in their original order. Nothing is dropped: a future only resolves on
an ack, on Unroutable, or when the transport gives up or closes.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pika
import structlog
from pika import spec

from ._support import Backoff, resolve
from ._transport import TransportError, Unroutable

log = structlog.get_logger(__name__)

CheckExchange = Callable[[str, Callable[[BaseException | None], None]], None]


@dataclass(slots=True, eq=False)
class Outgoing:
    """One message to publish."""

    order: int
    """Submission order (also its AMQP message_id, used to match basic.return)."""
    exchange: str
    """Target exchange."""
    routing_key: str
    """Routing key."""
    body: bytes
    """The body."""
    properties: pika.BasicProperties
    """AMQP properties (headers, reply_to, correlation_id, message_id)."""
    future: Future[None]
    """Resolved on ack; fails with Unroutable, BrokerUnavailable or TransportClosed."""
    returned: str | None = None
    """Reply text of a basic.return received for the current attempt."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.exchange, self.routing_key)

    def __lt__(self, other: Outgoing) -> bool:
        return self.order < other.order


@dataclass(slots=True, eq=False)
class Hold:
    """Messages of one (exchange, routing key) held back after a nack."""

    backoff: Backoff
    """Delay before the next probe."""
    queue: list[Outgoing] = field(default_factory=list)
    """Held messages, sorted by order."""
    probe: Outgoing | None = None
    """The one message currently retried, if any."""
    timer: Any = None
    """Pending ioloop timeout for the next probe."""


class Publisher:
    """Publish pipeline of one AMQP transport (I/O thread only)."""

    def __init__(
        self,
        ioloop: Any,
        check_exchange: CheckExchange,
        *,
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
    ) -> None:
        self._ioloop = ioloop
        self._check_exchange = check_exchange
        self._retry = (retry_initial, retry_max)
        self._channel: Any = None
        self._seq = 0
        self._unconfirmed: dict[int, Outgoing] = {}
        self._by_id: dict[str, Outgoing] = {}
        self._outbox: deque[Outgoing] = deque()
        self._holds: dict[tuple[str, str], Hold] = {}
        self._known: set[str] = {""}
        self._checking: dict[str, list[Outgoing]] = {}
        self._on_drained: list[Callable[[], None]] = []

    @property
    def in_flight(self) -> int:
        return len(self._unconfirmed)

    def submit(self, out: Outgoing) -> None:
        """Send now, or hold/queue it behind earlier messages that are waiting."""
        if out.exchange not in self._known:
            waiting = self._checking.setdefault(out.exchange, [])
            waiting.append(out)
            if len(waiting) == 1:
                self._check_exchange(out.exchange, lambda e, x=out.exchange: self._checked(x, e))
            return
        hold = self._holds.get(out.key)
        if hold is not None:
            if hold.probe is out:  # the probe waited for a channel: probe again later
                hold.probe = None
            bisect.insort(hold.queue, out)
            self._arm(out.key, hold)
            return
        self._send(out)

    def _checked(self, exchange: str, error: BaseException | None) -> None:
        waiting = self._checking.pop(exchange, [])
        if error is None:
            self._known.add(exchange)
            for out in waiting:
                self.submit(out)
            return
        if getattr(error, "reply_code", None) == 404:
            error = Unroutable(f"no exchange {exchange!r}")
        for out in waiting:
            resolve(out.future, error=error)

    def _send(self, out: Outgoing) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            self._outbox.append(out)
            return
        self._seq += 1
        out.returned = None
        self._unconfirmed[self._seq] = out
        self._by_id[out.properties.message_id] = out
        channel.basic_publish(
            out.exchange, out.routing_key, out.body, out.properties, mandatory=True
        )

    # -- broker events ------------------------------------------------------

    def on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        out = self._by_id.get(properties.message_id)
        if out is not None:
            out.returned = f"{method.reply_code} {method.reply_text}"

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, spec.Basic.Ack)
        tags = [method.delivery_tag]
        if method.multiple:  # every tag up to this one; the dict is in tag order
            tags = list(itertools.takewhile(lambda t: t <= method.delivery_tag, self._unconfirmed))
        for tag in tags:
            out = self._unconfirmed.pop(tag, None)
            if out is None:
                continue
            self._by_id.pop(out.properties.message_id, None)
            if acked:
                self._acked(out)
            else:
                self._nacked(out)
        if not self._unconfirmed:
            callbacks, self._on_drained = self._on_drained, []
            for callback in callbacks:
                callback()

    def _acked(self, out: Outgoing) -> None:
        if out.returned is not None:
            where = f"exchange {out.exchange!r}, routing key {out.routing_key!r}"
            resolve(out.future, error=Unroutable(f"{out.returned} ({where})"))
        else:
            resolve(out.future)
        hold = self._holds.get(out.key)
        if hold is not None and hold.probe is out:
            self._release(out.key, hold)

    def _nacked(self, out: Outgoing) -> None:
        hold = self._holds.get(out.key)
        if hold is None:
            hold = self._holds[out.key] = Hold(Backoff(*self._retry))
            log.info("queue full: holding publishes", exchange=out.exchange, key=out.routing_key)
        if hold.probe is out:
            hold.probe = None
        bisect.insort(hold.queue, out)
        self._arm(out.key, hold)

    def _arm(self, key: tuple[str, str], hold: Hold) -> None:
        if hold.timer is None and hold.probe is None:
            hold.timer = self._ioloop.call_later(hold.backoff.next(), lambda: self._probe(key))

    def _probe(self, key: tuple[str, str]) -> None:
        hold = self._holds.get(key)
        if hold is None:
            return
        hold.timer = None
        if not hold.queue:
            self._release(key, hold)
            return
        hold.probe = hold.queue.pop(0)
        self._send(hold.probe)

    def _release(self, key: tuple[str, str], hold: Hold) -> None:
        del self._holds[key]
        if hold.timer is not None:
            self._ioloop.remove_timeout(hold.timer)
        log.info("queue has room: releasing held publishes", key=key, count=len(hold.queue))
        for out in hold.queue:
            self.submit(out)

    # -- channel lifecycle --------------------------------------------------

    def channel_opened(self, channel: Any) -> None:
        """A fresh confirm-mode channel: send what waited, oldest first."""
        self._channel = channel
        self._seq = 0
        waiting, self._outbox = self._outbox, deque()
        for out in waiting:
            self.submit(out)

    def channel_lost(self, *, forget_exchanges: bool = False) -> None:
        """The channel is gone: unconfirmed messages will be published again."""
        self._channel = None
        if forget_exchanges:  # a 404 closed the channel: re-check exchanges before use
            self._known = {""}
        replay: list[Outgoing] = []
        for out in self._unconfirmed.values():
            hold = self._holds.get(out.key)
            if hold is None:
                replay.append(out)
                continue
            if hold.probe is out:
                hold.probe = None
            bisect.insort(hold.queue, out)
            self._arm(out.key, hold)
        self._unconfirmed.clear()
        self._by_id.clear()
        self._outbox = deque(sorted([*replay, *self._outbox]))

    def forget_exchange(self, name: str) -> None:
        """The exchange was deleted: check it again before the next publish to it."""
        self._known.discard(name)

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call `callback` once no message awaits a confirm."""
        if self._unconfirmed:
            self._on_drained.append(callback)
        else:
            callback()

    def fail_waiting(self, error: TransportError) -> None:
        """Fail everything not in flight (held, queued, awaiting an exchange check)."""
        for hold in self._holds.values():
            if hold.timer is not None:
                self._ioloop.remove_timeout(hold.timer)
            for out in hold.queue:
                resolve(out.future, error=error)
        self._holds.clear()
        for out in self._outbox:
            resolve(out.future, error=error)
        self._outbox.clear()
        for waiting in self._checking.values():
            for out in waiting:
                resolve(out.future, error=error)
        self._checking.clear()

    def fail_all(self, error: TransportError) -> None:
        """Fail every pending publish, in flight or not."""
        self.fail_waiting(error)
        for out in self._unconfirmed.values():
            resolve(out.future, error=error)
        self._unconfirmed.clear()
        self._by_id.clear()
        callbacks, self._on_drained = self._on_drained, []
        for callback in callbacks:
            callback()
