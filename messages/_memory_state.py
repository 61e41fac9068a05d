"""The state of the in-process broker (`_memory_broker.Broker`): its stored messages,
consumers, queues, exchanges and held publishes, and AMQP's topic match."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConsumerRecord",
    "Done",
    "ExchangeState",
    "Message",
    "QueueState",
    "Waiting",
    "topic_matches",
]

Done = Callable[[BaseException | None], None]


@dataclass(slots=True)
class Message:
    """A message as stored in a queue."""

    body: bytes
    """The body, untouched."""
    headers: dict[str, Any]
    """Application headers."""
    exchange: str
    """Exchange it was published to."""
    routing_key: str
    """Routing key it was published with."""
    reply_to: str | None = None
    """RPC reply queue."""
    correlation_id: str | None = None
    """RPC correlation id."""
    redelivered: bool = False
    """Delivered before (requeued)."""
    seq: int = 0
    """Broker-wide arrival order, used to put requeued messages back in place."""


@dataclass(slots=True)
class ConsumerRecord:
    """One consumer registered on a queue."""

    tag: str
    """Unique consumer tag."""
    queue: str
    """Queue consumed from."""
    owner: object
    """The transport that registered it."""
    prefetch: int
    """Max unacked deliveries (0 = unlimited)."""
    auto_ack: bool
    """Deliveries are settled on delivery (RPC reply consumers)."""
    deliver: Callable[[Message, int], None]
    """Posts (message, token) to the owner's dispatcher thread."""
    unacked: dict[int, Message] = field(default_factory=dict)
    """Delivered, not yet settled, by token."""
    active: bool = True
    """False once cancelled (unacked deliveries may still be settled)."""


@dataclass(slots=True)
class QueueState:
    """One queue."""

    name: str
    """Queue name."""
    arguments: dict[str, Any]
    """x-arguments it was declared with."""
    owner: object | None
    """The transport owning an exclusive queue, else None."""
    durable: bool = False
    """Declared durable (the in-process broker never restarts; kept for redeclarations)."""
    ready: deque[Message] = field(default_factory=deque)
    """Messages waiting for a consumer."""
    consumers: list[ConsumerRecord] = field(default_factory=list)
    """Active consumers, served round-robin."""
    next_consumer: int = 0
    """Round-robin cursor."""

    def full(self) -> bool:
        limit = self.arguments.get("x-max-length")
        return limit is not None and len(self.ready) >= limit


@dataclass(slots=True)
class ExchangeState:
    """One exchange and its bindings (queue, routing key)."""

    kind: str
    """direct | fanout | topic."""
    bindings: list[tuple[str, str]] = field(default_factory=list)
    """(queue name, binding key), no duplicates."""


@dataclass(slots=True)
class Waiting:
    """A publish held back because a target queue was full."""

    owner: object
    """The publishing transport."""
    exchange: str
    """Target exchange."""
    message: Message
    """The message (routing key inside)."""
    done: Done
    """Called with None once enqueued, or with the error."""


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic match: words split on '.', '*' = one word, '#' = zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] in ("*", k[0])) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))
