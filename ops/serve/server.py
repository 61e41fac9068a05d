"""uvicorn serving the endpoint's app, behind its `Guard` (API key, body and concurrency
limits) and its connection bounds (`connections`: head and idle timeouts, head size, a
connection cap), in a thread of the process that holds the `serve` role."""

from __future__ import annotations

import threading
import time

import structlog
import uvicorn

from .app import make_app
from .connections import ConnectionLimits, bounded_protocol
from .guard import Guard

log = structlog.get_logger(__name__)

__all__ = ["ServeServer"]

ACCEPT_BURST = 64
"""The listen backlog, which is also how many connections asyncio accepts at once before
any of them is served: the connection cap makes room only between bursts, so a burst is
how far the open connections may pass the cap."""


class ServeServer:
    """`make_app(service)` behind a `Guard` on uvicorn at ``host:port`` (port 0: a free
    one, see ``port``), its connections bounded by ``limits`` (None: the defaults). ``service``: a
    `ServeService`, or a fake with its attributes."""

    def __init__(
        self,
        service,
        host: str,
        port: int,
        *,
        api_key: str,
        max_body_bytes: int,
        max_concurrent: int,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.service = service
        self.api_key = api_key
        self.limits = (limits or ConnectionLimits()).within_fd_limit()
        self.guard = Guard(
            make_app(service),
            api_key=api_key,
            max_body_bytes=max_body_bytes,
            max_concurrent=max_concurrent,
            max_head_bytes=self.limits.max_head_bytes,
        )
        config = uvicorn.Config(
            self.guard,
            host=host,
            port=port,
            http=bounded_protocol(self.limits),
            ws="none",  # no WebSocket route: an upgrade is not taken
            backlog=ACCEPT_BURST,
            timeout_keep_alive=self.limits.idle_timeout,  # type: ignore[arg-type]
            h11_max_incomplete_event_size=self.limits.max_head_bytes,
            log_level="warning",
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start on {host}:{port}")
            time.sleep(0.02)
        sockets = self._server.servers[0].sockets
        self.host, self.port = sockets[0].getsockname()[:2]
        log.info("endpoint serving", url=self.url)

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.service.close()
