"""State machine of the in-process broker behind `memory://<name>`.

Mirrors the RabbitMQ semantics the AMQP transport relies on: the default
exchange routes by queue name; direct, fanout and topic exchanges; queues
bounded with reject-publish (only *ready* messages count, as in RabbitMQ),
where a publish that does not fit waits, in order, until there is room;
per-consumer prefetch; round-robin across consumers; requeue with
redelivered=True; dead-lettering on reject. One lock guards everything;
callbacks handed in (`deliver`, `done`) must only post work to a thread and
return, as they are called with the lock held.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import replace
from typing import Any

import structlog

from ._memory_state import (
    ConsumerRecord,
    Done,
    ExchangeState,
    Message,
    QueueState,
    Waiting,
    topic_matches,
)
from ._support import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    BrokerRefused,
)
from ._transport import Unroutable

log = structlog.get_logger(__name__)


class Broker:
    """All exchanges and queues of one `memory://<name>` broker."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._exchanges: dict[str, ExchangeState] = {}
        self._queues: dict[str, QueueState] = {}
        self._consumers: dict[str, ConsumerRecord] = {}
        self._waiting: deque[Waiting] = deque()
        self._ids = itertools.count(1)

    # -- declarations -------------------------------------------------------

    def declare_exchange(self, name: str, kind: str) -> None:
        if not name or name.startswith("amq."):
            raise BrokerRefused(f"exchange name {name!r} is reserved", ACCESS_REFUSED)
        with self._lock:
            existing = self._exchanges.setdefault(name, ExchangeState(kind))
        if existing.kind != kind:
            raise BrokerRefused(
                f"exchange {name!r} is {existing.kind}, not {kind}", PRECONDITION_FAILED
            )

    def declare_queue(
        self, name: str, arguments: dict[str, Any], owner: object | None, durable: bool = False
    ) -> None:
        with self._lock:
            queue = self._queues.setdefault(name, QueueState(name, dict(arguments), owner, durable))
        if queue.owner is not None and queue.owner is not owner:
            raise BrokerRefused(f"queue {name!r} is exclusive to another owner", RESOURCE_LOCKED)
        if queue.durable != durable:
            raise BrokerRefused(
                f"queue {name!r} declared with durable={queue.durable}, not {durable}",
                PRECONDITION_FAILED,
            )
        if (queue.owner is None) != (owner is None) or queue.arguments != arguments:
            raise BrokerRefused(
                f"queue {name!r} declared with {queue.arguments} "
                f"(exclusive={queue.owner is not None}), "
                f"not {arguments} (exclusive={owner is not None})",
                PRECONDITION_FAILED,
            )

    def bind(self, queue: str, exchange: str, routing_key: str) -> None:
        with self._lock:
            self._queue(queue)
            state = self._exchange(exchange)
            if (queue, routing_key) not in state.bindings:
                state.bindings.append((queue, routing_key))

    def delete_queue(self, name: str) -> None:
        with self._lock:
            queue = self._queues.pop(name, None)
            if queue is None:
                return
            for consumer in queue.consumers:
                consumer.active = False
                self._consumers.pop(consumer.tag, None)
            for exchange in self._exchanges.values():
                exchange.bindings = [b for b in exchange.bindings if b[0] != name]
            self._settle_down(self._retry_waiting())

    def delete_exchange(self, name: str) -> None:
        with self._lock:
            if self._exchanges.pop(name, None) is not None:
                self._settle_down(self._retry_waiting())

    def depth(self, name: str, owner: object) -> int:
        with self._lock:
            queue = self._queue(name)
            if queue.owner is not None and queue.owner is not owner:
                raise BrokerRefused(f"queue {name!r} is exclusive", RESOURCE_LOCKED)
            return len(queue.ready)

    # -- publishing ---------------------------------------------------------

    def publish(self, owner: object, exchange: str, message: Message, done: Done) -> None:
        """Route and enqueue; `done(None)` once every target queue took it."""
        with self._lock:
            message.seq = next(self._ids)
            self._waiting.append(Waiting(owner, exchange, message, done))
            self._settle_down(self._retry_waiting())

    def _route(self, exchange: str, key: str) -> list[QueueState] | None:
        """Target queues, or None when the exchange does not exist."""
        if exchange == "":
            queue = self._queues.get(key)
            return [queue] if queue is not None else []
        state = self._exchanges.get(exchange)
        if state is None:
            return None
        names: dict[str, None] = {}
        for queue, binding in state.bindings:
            if (
                state.kind == "fanout"
                or (state.kind == "direct" and binding == key)
                or (state.kind == "topic" and topic_matches(binding, key))
            ):
                names[queue] = None
        return [self._queues[name] for name in names]

    def _retry_waiting(self) -> set[str]:
        """Enqueue held publishes that now fit, in order; returns touched queue names."""
        touched: set[str] = set()
        blocked: set[str] = set()
        keep: deque[Waiting] = deque()
        for waiting in self._waiting:
            message = waiting.message
            targets = self._route(waiting.exchange, message.routing_key)
            if not targets:
                where = f"exchange {waiting.exchange!r}"
                reason = f"no {where}" if targets is None else f"no queue bound for {where}"
                waiting.done(Unroutable(f"{reason} (routing key {message.routing_key!r})"))
                continue
            names = {queue.name for queue in targets}
            if names & blocked or any(queue.full() for queue in targets):
                blocked |= names
                keep.append(waiting)
                continue
            for queue in targets:
                queue.ready.append(replace(message, headers=dict(message.headers)))
            touched |= names
            waiting.done(None)
        self._waiting = keep
        return touched

    # -- consuming ----------------------------------------------------------

    def consume(self, record: ConsumerRecord) -> None:
        with self._lock:
            queue = self._queue(record.queue)
            if queue.owner is not None and queue.owner is not record.owner:
                raise BrokerRefused(f"queue {queue.name!r} is exclusive", RESOURCE_LOCKED)
            queue.consumers.append(record)
            self._consumers[record.tag] = record
            self._settle_down({queue.name})

    def cancel(self, tag: str) -> None:
        with self._lock:
            record = self._consumers.get(tag)
            if record is None or not record.active:
                return
            record.active = False
            queue = self._queues.get(record.queue)
            if queue is not None:
                queue.consumers.remove(record)
                queue.next_consumer = 0
            if not record.unacked:
                del self._consumers[tag]

    def settle(self, tag: str, token: int, *, ack: bool, requeue: bool) -> None:
        with self._lock:
            record = self._consumers.get(tag)
            message = record.unacked.pop(token, None) if record is not None else None
            if record is None or message is None:
                log.debug("settle of an unknown delivery ignored", tag=tag, token=token)
                return
            if not record.active and not record.unacked:
                del self._consumers[tag]
            touched = {record.queue}
            if not ack and requeue:
                self._requeue(record.queue, [message])
            elif not ack:
                touched |= self._dead_letter(record.queue, message)
            self._settle_down(touched)

    def detach(self, owner: object, error: BaseException) -> None:
        """Forget an owner: requeue its unacked deliveries, drop its exclusive
        queues, fail its held publishes with `error`."""
        with self._lock:
            touched: set[str] = set()
            for record in [r for r in self._consumers.values() if r.owner is owner]:
                del self._consumers[record.tag]
                queue = self._queues.get(record.queue)
                if queue is not None and record.active:
                    queue.consumers.remove(record)
                    queue.next_consumer = 0
                self._requeue(record.queue, list(record.unacked.values()))
                touched.add(record.queue)
            for waiting in [w for w in self._waiting if w.owner is owner]:
                self._waiting.remove(waiting)
                waiting.done(error)
            exclusive = [name for name, q in self._queues.items() if q.owner is owner]
        for name in exclusive:
            self.delete_queue(name)
        with self._lock:
            self._settle_down(touched | self._retry_waiting())

    def _requeue(self, name: str, messages: list[Message]) -> None:
        queue = self._queues.get(name)
        if queue is None:
            return
        for message in sorted(messages, key=lambda m: m.seq, reverse=True):
            message.redelivered = True
            queue.ready.appendleft(message)

    def _dead_letter(self, name: str, message: Message) -> set[str]:
        """What RabbitMQ does on reject without requeue: republish to the DLX."""
        queue = self._queues.get(name)
        dlx = queue.arguments.get("x-dead-letter-exchange") if queue is not None else None
        targets = self._route(dlx, message.routing_key) if dlx else None
        if not targets:
            log.warning("rejected message dropped: no dead-letter route", queue=name)
            return set()
        death = {
            "queue": name,
            "reason": "rejected",
            "exchange": message.exchange,
            "routing-keys": [message.routing_key],
            "count": 1,
        }
        headers = {
            **message.headers,
            "x-death": [death],
            "x-first-death-queue": name,
            "x-first-death-reason": "rejected",
            "x-first-death-exchange": message.exchange,
        }
        for target in targets:
            dead = replace(message, headers=dict(headers), exchange=dlx, redelivered=False)
            target.ready.append(dead)
        return {target.name for target in targets}

    def _settle_down(self, touched: set[str]) -> None:
        """Deliver what can be delivered; room made in a queue lets held publishes in."""
        pending = set(touched)
        while pending:
            queue = self._queues.get(pending.pop())
            if queue is not None and self._dispatch(queue) and self._waiting:
                pending |= self._retry_waiting()

    def _dispatch(self, queue: QueueState) -> int:
        moved = 0
        while queue.ready and queue.consumers:
            count = len(queue.consumers)
            for offset in range(count):
                record = queue.consumers[(queue.next_consumer + offset) % count]
                if record.auto_ack or not record.prefetch or len(record.unacked) < record.prefetch:
                    break
            else:
                break
            queue.next_consumer = (queue.next_consumer + offset + 1) % count
            message = queue.ready.popleft()
            token = next(self._ids)
            if not record.auto_ack:
                record.unacked[token] = message
            record.deliver(message, token)
            moved += 1
        return moved

    def _queue(self, name: str) -> QueueState:
        queue = self._queues.get(name)
        if queue is None:
            raise BrokerRefused(f"no queue {name!r} in memory broker {self.name!r}", NOT_FOUND)
        return queue

    def _exchange(self, name: str) -> ExchangeState:
        state = self._exchanges.get(name)
        if state is None:
            raise BrokerRefused(f"no exchange {name!r} in memory broker {self.name!r}", NOT_FOUND)
        return state
