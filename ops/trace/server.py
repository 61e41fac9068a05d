"""`agentrl trace`'s web server: the standard library's, read-only, a thread per connection.

`TraceSite` answers a path and query with a page (no socket: the tests call it directly);
`TraceServer` puts it on ``host:port``. Each request reads the store afresh, so a page
reloaded during a run shows the updates trained since. Every response forbids inline
script and anything not from the server itself (Content-Security-Policy), and a request
whose ``Host`` is not the server's own is refused (a DNS-rebinding page cannot read the
run), unless the server listens on every address.

Connections are served at once, each on its own daemon thread, so one that is slow or
silent holds up no other. Each has ``HEAD_TIMEOUT`` seconds to send its request head
(however slowly its bytes come) and ``IO_TIMEOUT`` seconds for each later read or write;
at most ``MAX_CONNECTIONS`` are open at once, and one more is answered 503 and closed.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import structlog

from agentrl.actors._trace_store import TRACE_FILE, EpisodeFilter, TraceError, TraceReader
from agentrl.environments import ChatFormat

from .page import ListView, compare_page, episode_page, error_page, list_page
from .text import episode_turns

log = structlog.get_logger(__name__)

__all__ = ["TraceServer", "TraceSite", "find_tokenizer", "parse_query"]

LIST_LIMIT = 100
"""Episodes per list page (``limit`` overrides, up to `MAX_LIMIT`)."""
COMPARE_LIMIT = 6
"""Episodes shown in full per column of the side-by-side page."""
MAX_LIMIT = 1000

HEAD_TIMEOUT = 10.0
"""Seconds a connection has to send its whole request head."""
IO_TIMEOUT = 30.0
"""Seconds any one read or write of a connection may wait."""
MAX_CONNECTIONS = 64
"""Connections served at once; one more is answered 503."""
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nContent-Length: 28\r\n\r\ntoo many connections; retry\n"
)

STATIC = Path(__file__).parent / "static"
_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class BadQuery(ValueError):
    """Raised when a query parameter is not what its filter takes."""


def parse_query(query: str) -> tuple[EpisodeFilter, int | None, int, int | None]:
    """The filter, the version to show beside it, the offset and the limit of ``query``;
    an empty value means "any"."""
    q = {k: v[-1] for k, v in parse_qs(query).items()}

    def integer(name: str) -> int | None:
        raw = q.get(name)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise BadQuery(f"{name}: not an integer: {raw!r}") from None

    def number(name: str) -> float | None:
        raw = q.get(name)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise BadQuery(f"{name}: not a number: {raw!r}") from None
        if not math.isfinite(value):
            raise BadQuery(f"{name}: not a finite number: {raw!r}")
        return value

    where = EpisodeFilter(
        task=q.get("task"),
        group=q.get("group"),
        status=q.get("status"),
        outcome=q.get("outcome"),
        version=integer("version"),
        min_reward=number("min_reward"),
        max_reward=number("max_reward"),
    )
    compare, offset, limit = integer("compare"), integer("offset") or 0, integer("limit")
    if compare is not None and where.version is None:
        raise BadQuery("compare: a version beside which? choose a version too")
    if offset < 0 or (limit is not None and not 1 <= limit <= MAX_LIMIT):
        raise BadQuery(f"offset must be >= 0 and limit in [1, {MAX_LIMIT}]")
    return where, compare, offset, limit


def find_tokenizer(run_dir: Path, recorded: str | None) -> str:
    """The tokenizer to decode with: the one the learner recorded where it still exists,
    else the newest checkpoint's copy; raises `TraceError` when there is neither."""
    if recorded and Path(recorded).exists():
        return recorded
    ckpts = sorted((run_dir / "checkpoints").glob("v[0-9]*/tokenizer_config.json"), reverse=True)
    if ckpts:
        return str(ckpts[0].parent)
    raise TraceError(
        f"no tokenizer to decode with: {recorded or 'none'} recorded by the learner is not "
        f"there and no checkpoint in {run_dir / 'checkpoints'} holds one; pass --tokenizer"
    )


class TraceSite:
    """The pages of one run directory's trace store."""

    def __init__(self, run_dir: Path, tokenizer: Any) -> None:
        self.run_dir = Path(run_dir)
        self.name = str(run_dir)
        self._tok = tokenizer
        self._fmt = ChatFormat(tokenizer)
        TraceReader(self.run_dir / TRACE_FILE).close()  # there, and of this schema

    def respond(self, path: str, query: str) -> tuple[int, str, bytes]:
        """``(status, content type, body)`` for a GET of ``path?query``."""
        if path.startswith("/static/"):
            file = STATIC / path.removeprefix("/static/")
            if file.parent != STATIC or file.suffix not in _TYPES or not file.is_file():
                return self._error(404, f"no such file: {path}")
            return 200, _TYPES[file.suffix], file.read_bytes()
        if path not in ("/", "/episode"):
            return self._error(404, f"no such page: {path}")
        try:
            reader = TraceReader(self.run_dir / TRACE_FILE)
        except TraceError as exc:
            return self._error(500, str(exc))
        try:
            if path == "/episode":
                return self._episode(reader, parse_qs(query).get("id", [""])[-1])
            try:
                where, compare, offset, limit = parse_query(query)
            except BadQuery as exc:
                return self._error(400, str(exc))
            if compare is not None:
                return self._compare(reader, where, compare, limit or COMPARE_LIMIT)
            limit = limit or LIST_LIMIT
            view = ListView(
                where=where,
                rows=reader.episodes(where, limit=limit, offset=offset),
                total=reader.count(where),
                offset=offset,
                limit=limit,
                facets=reader.facets(),
            )
            return self._html(200, list_page(self.name, view))
        finally:
            reader.close()

    def _episode(self, reader: TraceReader, episode_id: str) -> tuple[int, str, bytes]:
        trace = reader.episode(episode_id)
        if trace is None:
            return self._error(404, f"no episode {episode_id!r} in this run")
        turns, tail = episode_turns(trace, self._tok, self._fmt)
        return self._html(200, episode_page(self.name, trace, turns, tail))

    def _compare(
        self, reader: TraceReader, where: EpisodeFilter, other: int, limit: int
    ) -> tuple[int, str, bytes]:
        sides = []
        for version in (where.version, other):
            side = dataclasses.replace(where, version=version)
            shown = []
            for row in reader.episodes(side, limit=limit):
                trace = reader.episode(row.episode_id)
                if trace is not None:  # a row is never deleted: always there
                    shown.append((trace, *episode_turns(trace, self._tok, self._fmt)))
            sides.append((shown, reader.count(side)))
        view = ListView(where, [], 0, 0, limit, reader.facets(), compare=other)
        (left, left_total), (right, right_total) = sides
        page = compare_page(self.name, view, left, right, (left_total, right_total))
        return self._html(200, page)

    def _html(self, status: int, page: str) -> tuple[int, str, bytes]:
        return status, "text/html; charset=utf-8", page.encode()

    def _error(self, status: int, message: str) -> tuple[int, str, bytes]:
        return self._html(status, error_page(self.name, status, message))


class TraceServer:
    """`TraceSite` on ``host:port`` (port 0: any free one; `url` says which)."""

    def __init__(
        self,
        site: TraceSite,
        host: str = "127.0.0.1",
        port: int = 8765,
        *,
        head_timeout: float = HEAD_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.site = site
        self.head_timeout = head_timeout
        self._httpd = _Server((host, port), _handler(self), max_connections)
        self.host, self.port = host, self._httpd.server_address[1]
        self.allowed_hosts: set[str] | None = (
            None
            if host in ("", "0.0.0.0", "::")
            else {f"{h}:{self.port}" for h in (host, "127.0.0.1", "localhost", "[::1]")}
        )
        """``Host`` headers answered (None: any, the server listens on every address)."""
        self._thread: threading.Thread | None = None

    @property
    def connections(self) -> int:
        """Connections being served now (at most ``max_connections``)."""
        return self._httpd.connections

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.allowed_hosts is None else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def start(self) -> None:
        """Serve on a background thread (tests); `close` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="trace", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


class _Server(ThreadingHTTPServer):
    """A thread per connection (daemon: none keeps the process alive), at most ``cap``."""

    daemon_threads = True

    def __init__(self, address, handler, cap: int) -> None:
        self._cap = cap
        self._lock = threading.Lock()
        self.connections = 0
        """Connections being served now."""
        super().__init__(address, handler)

    def _take(self) -> bool:
        with self._lock:
            if self.connections >= self._cap:
                return False
            self.connections += 1
            return True

    def _release(self) -> None:
        with self._lock:
            self.connections -= 1

    def process_request(self, request, client_address) -> None:
        if not self._take():
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)  # small: fits the socket's buffer
            except OSError:
                pass  # the client is gone: nothing to tell it
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its slot is free
            self._release()
            raise

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):  # the client left before its answer: its own
            log.debug("client left", client=client_address[0], error=repr(error))
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()


class _HeadReader:
    """A connection's ``rfile`` whose reads end by ``deadline`` (`time.monotonic`)."""

    def __init__(self, raw, sock: socket.socket, deadline: float) -> None:
        self._raw, self._sock, self.deadline = raw, sock, deadline

    def _left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request head took too long")
        self._sock.settimeout(min(left, IO_TIMEOUT))

    def readline(self, limit: int = -1) -> bytes:
        self._left()
        return self._raw.readline(limit)

    def read(self, size: int = -1) -> bytes:
        self._left()
        return self._raw.read(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _handler(server: TraceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = IO_TIMEOUT

        def setup(self) -> None:
            super().setup()
            deadline = time.monotonic() + server.head_timeout
            self.rfile = _HeadReader(self.rfile, self.connection, deadline)  # type: ignore[assignment]

        def do_GET(self) -> None:
            self.connection.settimeout(IO_TIMEOUT)  # the head is in: the answer's own time
            allowed = server.allowed_hosts
            if allowed is not None and self.headers.get("Host") not in allowed:
                status, kind, body = 400, "text/plain; charset=utf-8", b"unexpected Host\n"
            else:
                url = urlsplit(self.path)
                status, kind, body = server.site.respond(url.path, url.query)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("request", line=format % args)

    return Handler
