"""Connections to the endpoint, bounded before a request reaches the `Guard`.

Whoever can reach the port can open connections without the key: the key is in a header,
so it is checked only once a request head has arrived. `bounded_protocol` gives uvicorn an
HTTP/1.1 protocol (its h11 one) with these bounds, each ahead of the key:

- a head timeout: a connection waiting for a request head (a new one, or a kept-alive one
  after its response) has ``head_timeout`` seconds to complete it, however slowly its bytes
  come (one byte every few seconds does not keep it open); then it is closed, with a 408
  when part of a head had come;
- an idle timeout: a kept-alive connection with no byte for ``idle_timeout`` seconds is
  closed (uvicorn's keep-alive timeout);
- a head size limit: an incomplete head over ``max_head_bytes`` is refused by h11 (400,
  closed); a complete one over it by the `Guard` (431, closed);
- a connection cap: at most ``max_connections`` open at once. One more makes room by
  closing the oldest connection still waiting for a head (a half-open one, or an idle
  kept-alive one); a connection whose request is being answered is never closed for it.
  When every connection is answering, the new one gets 503 and is closed. So half-open
  connections cannot exhaust the process's file descriptors, and a caller that sends its
  head at once is served while they are held.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger(__name__)

__all__ = ["ConnectionLimits", "bounded_protocol"]

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n"
    b"content-length: 0\r\n\r\n"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of the module doc."""

    max_connections: int = 512
    """Connections open at once (clamped to half the process's file descriptor limit)."""
    head_timeout: float = 10.0
    """Seconds a connection may take to send a complete request head."""
    idle_timeout: float = 5.0
    """Seconds a kept-alive connection may stay silent after a response."""
    max_head_bytes: int = 16 << 10
    """The largest request head (request line and headers) read."""

    def within_fd_limit(self) -> ConnectionLimits:
        """These limits with ``max_connections`` at most half the soft file descriptor
        limit (the rest is the process's own: engines, the broker, files)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or self.max_connections <= soft // 2:
            return self
        log.warning("endpoint connection cap lowered to half the file limit",
                    asked=self.max_connections, fd_limit=soft)  # fmt: skip
        return ConnectionLimits(max(1, soft // 2), self.head_timeout, self.idle_timeout,
                                self.max_head_bytes)  # fmt: skip


def bounded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits`` (module doc); one class per server, since
    the connections waiting for a head are counted per server."""
    waiting: dict[H11Protocol, None] = {}
    """Connections waiting for a request head, oldest first (a dict keeps its order)."""

    class BoundedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0
        _cycle_waited: object = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:  # every connection is answering a request
                    transport.write(_BUSY)
                    transport.close()
                    return
                oldest._close(b"")
            self._await_head()

        def _await_head(self) -> None:
            self._cancel_head_timer()
            waiting[self] = None
            self._head_bytes = 0
            self._cycle_waited = self.cycle
            self._head_timer = self.loop.call_later(limits.head_timeout, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            waiting.pop(self, None)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            self._close(_TIMEOUT if self._head_bytes else b"")

        def _close(self, answer: bytes) -> None:
            self._cancel_head_timer()
            if not self.transport.is_closing():
                if answer:
                    self.transport.write(answer)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self in waiting:
                self._head_bytes += len(data)
            super().data_received(data)
            if self in waiting and self.cycle is not self._cycle_waited:
                self._cancel_head_timer()  # a request head arrived: its request is answered

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # kept alive, and not already answering a pipelined request: wait for a head
            if not self.transport.is_closing() and self.cycle.response_complete:
                self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

    return BoundedH11Protocol
