"""Hostile clients against `agentrl trace`'s server, with real sockets (the real
`TraceServer`, a site that answers every page with a fixed body). Classes: a half-open
connection (nothing sent), a head sent one byte at a time, more connections than the cap.
Before, the server answered one connection at a time: one half-open connection kept every
other caller waiting. After each, another caller is answered promptly."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from agentrl.ops.trace import TraceServer

HEAD_TIMEOUT = 1.0


class FixedSite:
    """What `TraceServer` asks of a `TraceSite`: a page per path and query."""

    def respond(self, path: str, query: str) -> tuple[int, str, bytes]:
        return 200, "text/plain; charset=utf-8", f"page {path}".encode()


@pytest.fixture
def server():
    served = TraceServer(FixedSite(), "127.0.0.1", 0, head_timeout=HEAD_TIMEOUT, max_connections=8)
    served.start()
    yield served
    served.close()


def _page(server, within: float = 2.0) -> str:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=within)
    try:
        conn.request("GET", "/", headers={"Host": f"127.0.0.1:{server.port}"})
        got = conn.getresponse()
        body = got.read().decode()
    finally:
        conn.close()
    assert got.status == 200 and time.monotonic() - started < within
    return body


def test_a_half_open_connection_does_not_block_another_caller(server):
    with socket.create_connection(("127.0.0.1", server.port)) as held:
        held.sendall(b"GET / HTTP/1.1\r\n")  # a head begun, never finished
        for _ in range(3):
            assert _page(server) == "page /"


def test_a_head_sent_one_byte_at_a_time_is_cut_at_the_head_timeout(server):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        try:
            for byte in b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 200:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - started > 6 * HEAD_TIMEOUT:
                    break
            assert sock.recv(100) == b""  # closed by the server
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed while bytes were still coming
    assert time.monotonic() - started < 3 * HEAD_TIMEOUT
    assert _page(server) == "page /"


def test_connections_past_the_cap_are_refused_and_freed_slots_serve_again():
    server = TraceServer(FixedSite(), "127.0.0.1", 0, head_timeout=60, max_connections=8)
    server.start()
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
    try:
        _wait_for(lambda: server.connections == 8)  # each one has its thread
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            assert extra.recv(100).startswith(b"HTTP/1.0 503")
        assert server.connections == 8
    finally:
        for sock in held:
            sock.close()
    _wait_for(lambda: server.connections == 0)  # their threads end as they see them closed
    try:
        assert _page(server) == "page /"
    finally:
        server.close()


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.02)
