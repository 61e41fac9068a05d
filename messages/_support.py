"""Helpers shared by the Transport implementations (not part of the public API)."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import structlog

from ._transport import Delivery, TransportError, dead_letter_exchange_for

log = structlog.get_logger(__name__)

EXCHANGE_KINDS = frozenset({"direct", "fanout", "topic"})

NOT_FOUND, RESOURCE_LOCKED, PRECONDITION_FAILED, ACCESS_REFUSED = 404, 405, 406, 403
"""AMQP reply codes (the memory broker uses the same ones)."""


class BrokerRefused(TransportError):
    """Raised when the broker refused an operation with an AMQP reply code
    (404 not found, 405 exclusive elsewhere, 406 declared differently, 403 reserved)."""

    def __init__(self, message: str, reply_code: int) -> None:
        super().__init__(f"{reply_code} {message}")
        self.reply_code = reply_code


def queue_arguments(name: str, *, max_length: int | None, dead_letter: bool) -> dict[str, Any]:
    """The x-arguments a queue is declared with (shared by both implementations)."""
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    arguments: dict[str, Any] = {}
    if max_length is not None:
        arguments["x-max-length"] = max_length
        arguments["x-overflow"] = "reject-publish"
    dlx = dead_letter_exchange_for(name) if dead_letter else None
    if dlx is not None:
        arguments["x-dead-letter-exchange"] = dlx
    return arguments


def generated_queue_name(transport_name: str, kind: str = "excl") -> str:
    """A unique queue name for '' declarations (stable across reconnects)."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", transport_name)[:40]
    return f"agentrl-{kind}-{safe}-{uuid.uuid4().hex[:12]}"


def check_exchange_kind(kind: str) -> None:
    """Raise ValueError for an exchange kind we do not support."""
    if kind not in EXCHANGE_KINDS:
        raise ValueError(f"exchange kind must be one of {sorted(EXCHANGE_KINDS)}, got {kind!r}")


def redact_url(url: str) -> str:
    """The URL with any password replaced by '***' (safe to log)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class Backoff:
    """Capped exponential delays: initial, 2*initial, ... up to maximum."""

    def __init__(self, initial: float = 0.05, maximum: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        """The delay to wait now; doubles the following one."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        """Start again from the initial delay."""
        self._next = self.initial


def run_consumer_callback(on_message: Callable[[Delivery], None], delivery: Delivery) -> None:
    """Call a consumer callback; if it raises, log and dead-letter the message.

    Used by both implementations so a failing callback behaves the same
    everywhere: the error is logged with its traceback and the message goes to
    the DLX (or is rejected when its queue has none), never silently lost.
    """
    try:
        on_message(delivery)
    except Exception as error:
        log.exception("consumer callback raised", queue=delivery.queue)
        if delivery.settled:
            return
        if delivery.dead_letter_exchange is None:
            delivery.nack(requeue=False)
        else:
            delivery.dead_letter(f"consumer callback raised {type(error).__name__}: {error}")


def resolve(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Set a future's result or exception unless it is already done (races are benign)."""
    if future.done():
        return
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError as race:  # another thread resolved it in between
        log.debug("future already resolved", error=race)
