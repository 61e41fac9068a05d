"""The connection half of the AMQP transport: channels, control ops, consumers, reconnect.

Everything here runs on the transport's I/O thread. `Link` owns the pika
SelectConnection and its channels: `ctl` (declarations and passive checks,
one at a time; a broker refusal fails that operation and the channel is
reopened), `pub` (confirm mode, driven by the `Publisher`) and one channel per
consumer. It remembers the topology it declared so a new connection gets the
same exchanges, queues and bindings before consumers and publishes resume.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from pika import SelectConnection
from pika.exceptions import (
    AuthenticationError,
    ChannelClosedByBroker,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)

from ._amqp_consumers import AmqpConsumer, Consumers, refused
from ._amqp_publish import Publisher
from ._support import Backoff, resolve
from ._transport import BrokerLoginRefused, BrokerUnavailable, TransportClosed, TransportError

if TYPE_CHECKING:
    from ._amqp import AmqpTransport

log = structlog.get_logger(__name__)

ControlOp = Callable[[Any, Callable[[Any], None]], None]
"""`run(channel, done)`: start one ctl-channel method; call `done(result)` on its -Ok."""


@dataclass(slots=True, eq=False)
class Control:
    """One queued ctl-channel operation."""

    what: str
    """Description for errors and logs."""
    run: ControlOp
    """Starts the operation."""
    future: Future[Any]
    """Gets the result, or the error."""
    remember: tuple | None = None
    """(kind, name, run) to add to / remove from the remembered topology on success."""
    internal: bool = False
    """Part of a reconnect (re-declaration); not retried on another connection."""


class Link:
    """pika connection, channels and remembered topology of one transport."""

    def __init__(
        self,
        transport: AmqpTransport,
        parameters: Any,
        ioloop: Any,
        publisher: Publisher,
        *,
        reconnect_timeout: float,
    ) -> None:
        self._transport = transport
        self._parameters = parameters
        self._ioloop = ioloop
        self._publisher = publisher
        self._reconnect_timeout = reconnect_timeout
        self._log = log.bind(transport=transport.name, broker=transport.where)
        self.state = "connecting"
        """connecting | restoring | up | down | closing | closed"""
        self.gave_up: BrokerUnavailable | None = None
        self.opened: Future[None] = Future()
        self.last_error: BaseException | None = None
        self.consumers = Consumers(transport, lambda: self._conn if self.state == "up" else None)
        self._conn: Any = None
        self._ctl: Any = None
        self._pub: Any = None
        self._ops: deque[Control] = deque()
        self._busy: Control | None = None
        self._topology: dict[tuple, ControlOp] = {}
        self._backoff = Backoff(0.1, 5.0)
        self._reconnect_timer: Any = None
        self._give_up_timer: Any = None

    # -- connection ---------------------------------------------------------

    def open(self) -> None:
        self._reconnect_timer = None
        if self.state in ("closing", "closed"):
            return
        self.state = "connecting"
        self._conn = SelectConnection(
            self._parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
            custom_ioloop=self._ioloop,
        )

    def _on_open(self, connection: Any) -> None:
        self._log.info("connected")
        self._ctl = self._pub = None
        connection.channel(on_open_callback=self._on_ctl_open)
        connection.channel(on_open_callback=self._on_pub_open)

    def _on_ctl_open(self, channel: Any) -> None:
        self._ctl = channel
        channel.add_on_close_callback(self._on_ctl_closed)
        self._maybe_restore()
        self._next_control()

    def _on_pub_open(self, channel: Any) -> None:
        channel.add_on_close_callback(self._on_pub_closed)
        channel.add_on_return_callback(self._publisher.on_return)
        channel.confirm_delivery(
            self._publisher.on_confirm, callback=lambda _: self._on_pub_ready(channel)
        )

    def _on_pub_ready(self, channel: Any) -> None:
        self._pub = channel
        if self.state == "up":
            self._publisher.channel_opened(channel)
        self._maybe_restore()

    def _maybe_restore(self) -> None:
        """Once both channels are open on a new connection: re-declare, then resume."""
        if self.state != "connecting" or self._ctl is None or self._pub is None:
            return
        self.state = "restoring"
        restore = [
            Control(f"re-declare {key[0]} {key[1]!r}", run, Future(), internal=True)
            for key, run in self._topology.items()
        ]
        for op in restore:
            op.future.add_done_callback(self._log_restore_failure)
        restore.append(Control("resume", self._resume, Future(), internal=True))
        self._ops.extendleft(reversed(restore))
        self._next_control()

    def _log_restore_failure(self, future: Future[Any]) -> None:
        if (error := future.exception()) is not None:
            self._log.error("re-declaration after reconnect failed", error=str(error))

    def _resume(self, _channel: Any, done: Callable[[Any], None]) -> None:
        self.state = "up"
        self.gave_up = None
        self._backoff.reset()
        if self._give_up_timer is not None:
            self._ioloop.remove_timeout(self._give_up_timer)
            self._give_up_timer = None
        self.consumers.resume()
        self._publisher.channel_opened(self._pub)
        resolve(self.opened)
        done(None)

    def _on_open_error(self, connection: Any, error: BaseException) -> None:
        if connection is not self._conn:
            return
        self._conn = None
        self.last_error = error
        if self.state == "closing":
            self._stopped()
            return
        auth = (AuthenticationError, ProbableAuthenticationError, ProbableAccessDeniedError)
        if not self.opened.done() and isinstance(error, auth):
            why = str(error) or type(error).__name__
            failure = BrokerLoginRefused(f"broker at {self._transport.where} refused login: {why}")
            failure.__cause__ = error
            resolve(self.opened, error=failure)
            return
        self._log.warning("connect failed", error=str(error) or type(error).__name__)
        self._lost()

    def _on_closed(self, connection: Any, reason: BaseException) -> None:
        if connection is not self._conn:
            return
        self._conn = self._ctl = self._pub = None
        if self.state == "closing":
            self._stopped()
            return
        self._log.warning("connection lost", reason=str(reason) or type(reason).__name__)
        self._lost()

    def _lost(self) -> None:
        was_up = self.state in ("restoring", "up")
        self.state = "down"
        if self._busy is not None:
            self._ops.appendleft(self._busy)
            self._busy = None
        self._ops = deque(op for op in self._ops if not op.internal)
        self._publisher.channel_lost()
        self.consumers.lost()
        if was_up:
            lost = BrokerUnavailable("connection lost while waiting for an RPC reply")
            self._transport.fail_calls(lost, only_sent=True)
        if self._give_up_timer is None and self.opened.done():
            self._give_up_timer = self._ioloop.call_later(self._reconnect_timeout, self._give_up)
        self._reconnect_timer = self._ioloop.call_later(self._backoff.next(), self.open)

    def _give_up(self) -> None:
        self._give_up_timer = None
        if self.state == "up":
            return
        error = BrokerUnavailable(
            f"{self._transport.where} unreachable for {self._reconnect_timeout}s"
        )
        self._log.error("giving up pending work; still trying to reconnect", error=str(error))
        self.gave_up = error
        self._fail_pending(error)

    def _fail_pending(self, error: TransportError) -> None:
        self._publisher.fail_all(error)
        for op in self._ops:
            resolve(op.future, error=error)
        self._ops.clear()
        self.consumers.fail_starting(error)
        self._transport.fail_calls(error, only_sent=False)

    def stop(self, error: TransportClosed) -> None:
        """Fail everything pending, close the connection, then stop the ioloop."""
        self.state = "closing"
        for timer in (self._reconnect_timer, self._give_up_timer):
            if timer is not None:
                self._ioloop.remove_timeout(timer)
        if self._busy is not None:
            resolve(self._busy.future, error=error)
        self._fail_pending(error)
        self.consumers.release_cancels()
        resolve(self.opened, error=error)
        if self._conn is None:
            self._stopped()
        elif not (self._conn.is_closing or self._conn.is_closed):
            self._conn.close()

    def _stopped(self) -> None:
        self.state = "closed"
        self._ioloop.stop()

    # -- control operations -------------------------------------------------

    def submit_control(
        self, what: str, run: ControlOp, future: Future[Any], remember: tuple | None
    ) -> None:
        if self.gave_up is not None:
            resolve(future, error=self.gave_up)
        elif self.state in ("closing", "closed"):
            resolve(future, error=TransportClosed(f"{self._transport!r} was closed"))
        else:
            self._ops.append(Control(what, run, future, remember))
            self._next_control()

    def _next_control(self) -> None:
        if self._busy is not None or not self._ops or self.state not in ("restoring", "up"):
            return
        if self._ctl is None or not self._ctl.is_open:
            return
        op = self._busy = self._ops.popleft()
        try:
            op.run(self._ctl, lambda result: self._control_done(op, result))
        except Exception as error:
            self._busy = None
            failure = TransportError(f"{op.what}: {error}")
            failure.__cause__ = error
            resolve(op.future, error=failure)
            self._next_control()

    def _control_done(self, op: Control, result: Any) -> None:
        if self._busy is not op:
            return
        self._busy = None
        if op.remember is not None:
            self._remember(*op.remember)
        resolve(op.future, result)
        self._next_control()

    def _remember(self, kind: str, name: Any, run: ControlOp) -> None:
        if kind == "forget-queue":
            self._topology = {
                k: r
                for k, r in self._topology.items()
                if k != ("queue", name) and not (k[0] == "bind" and k[1][0] == name)
            }
        elif kind == "forget-exchange":
            self._publisher.forget_exchange(name)
            self._topology = {
                k: r
                for k, r in self._topology.items()
                if k != ("exchange", name) and not (k[0] == "bind" and k[1][1] == name)
            }
        else:
            self._topology[(kind, name)] = run

    def _on_ctl_closed(self, channel: Any, reason: BaseException) -> None:
        if channel is not self._ctl:
            return
        self._ctl = None
        if not isinstance(reason, ChannelClosedByBroker):
            return  # connection loss: _lost() requeues the busy operation
        op, self._busy = self._busy, None
        if op is not None:
            resolve(op.future, error=refused(op.what, reason))
        else:
            self._log.warning("ctl channel closed by the broker", reason=str(reason))
        self._conn.channel(on_open_callback=self._on_ctl_open)

    def _on_pub_closed(self, channel: Any, reason: BaseException) -> None:
        if channel is not self._pub:
            return
        self._pub = None
        if not isinstance(reason, ChannelClosedByBroker):
            return  # connection loss: _lost() replays unconfirmed messages
        self._log.warning("publish channel closed by the broker; reopening", reason=str(reason))
        self._publisher.channel_lost(forget_exchanges=reason.reply_code == 404)
        self._conn.channel(on_open_callback=self._on_pub_open)

    def start_consumer(self, consumer: AmqpConsumer) -> None:
        if self.gave_up is not None:
            resolve(consumer.started, error=self.gave_up)
        elif self.state in ("closing", "closed"):
            resolve(consumer.started, error=TransportClosed(f"{self._transport!r} was closed"))
        else:
            self.consumers.start(consumer)
