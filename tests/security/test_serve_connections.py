"""Denial of service against `agentrl serve` before its key is checked, with real sockets
against the real server (uvicorn, its bounded protocol, the guard, a fake service).
Classes: a head sent one byte at a time (slowloris), a kept-alive connection that stays
silent, a head of 100 KB (whole, or never finished), half-open connections past the cap
(in-process, and 1,100 of them against a server limited to 1,024 file descriptors), a cap
full of requests being answered, a caller without the key keeping its connection. After
each, a keyed call is answered promptly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.ops.serve import ServeServer
from agentrl.ops.serve.connections import ConnectionLimits
from tests.security.test_serve_attacks import KEY, FakeService, _still_answers

ROOT = Path(__file__).resolve().parents[2]
LIMITS = ConnectionLimits(max_connections=32, head_timeout=1.0, idle_timeout=0.5,
                          max_head_bytes=8 << 10)  # fmt: skip
KEYED = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()


@pytest.fixture
def served():
    service = FakeService()
    server = ServeServer(service, "127.0.0.1", 0, api_key=KEY, max_body_bytes=64 << 10,
                         max_concurrent=4, limits=LIMITS)  # fmt: skip
    yield server, service
    server.close()


def _connect(server, timeout: float = 10) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=timeout)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``seconds``; what it sent before."""
    sock.settimeout(seconds)
    got = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except ConnectionResetError:
        return True, got
    except TimeoutError:
        pass
    return False, got


def _keyed_call(server, within: float = 3.0) -> bytes:
    started = time.monotonic()
    with _connect(server, timeout=within) as sock:
        sock.sendall(KEYED)
        answer = sock.recv(200)
    assert time.monotonic() - started < within
    return answer


def test_a_head_sent_one_byte_at_a_time_is_cut_at_the_head_timeout(served):
    server, service = served
    sock = _connect(server)
    started, sent = time.monotonic(), 0
    head = f"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nX-Pad: {'a' * 200}"
    with sock:
        try:
            for byte in head.encode():  # the attack: a byte every 0.1 s, never the end
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
                if time.monotonic() - started > 6 * LIMITS.head_timeout:
                    break
        except OSError:
            pass  # closed by the server mid-drip
        closed, answer = _closed_within(sock, 1.0)
    assert closed and answer.startswith(b"HTTP/1.1 408"), (answer, sent)
    assert time.monotonic() - started < 3 * LIMITS.head_timeout
    assert service.calls == []
    _still_answers(server)


def test_a_silent_connection_is_closed_new_or_kept_alive(served):
    server, _ = served
    with _connect(server) as sock:  # never sends a byte
        closed, answer = _closed_within(sock, 3 * LIMITS.head_timeout)
        assert closed and answer == b""
    with _connect(server) as sock:  # one answered request, then silence
        sock.sendall(KEYED)
        closed, answer = _closed_within(sock, 3 * LIMITS.head_timeout)
        assert closed and answer.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("pad", [12_000, 100_000])
def test_a_head_over_the_limit_is_refused_and_closed(served, pad):
    """12 KB: over this server's 8 KiB, under h11's own 16 KiB (uvicorn answered it 200)."""
    server, service = served
    head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    with _connect(server) as sock:
        sock.sendall(f"{head}X-Pad: {'a' * pad}\r\n\r\n".encode())
        closed, answer = _closed_within(sock, 5)
    assert closed and answer[:12] in (b"HTTP/1.1 431", b"HTTP/1.1 400"), answer[:100]
    with _connect(server) as sock:  # a head that grows past the limit and never ends
        try:
            sock.sendall(head.encode())
            for _ in range(pad // 4000):
                sock.sendall(b"X-Pad: " + b"a" * 4000 + b"\r\n")
                time.sleep(0.01)
        except OSError:
            pass
        closed, answer = _closed_within(sock, 5)
    assert closed and answer[:10] == b"HTTP/1.1 4", answer[:100]
    assert service.calls == []
    _still_answers(server)


def test_half_open_connections_past_the_cap_do_not_grow_and_a_keyed_call_is_served(served):
    server, service = served
    held = [_connect(server) for _ in range(8 * LIMITS.max_connections)]
    try:
        assert _keyed_call(server).startswith(b"HTTP/1.1 200")
        # the oldest ones were closed to make room; the server holds at most the cap (plus
        # the connections of one accept burst not yet seen)
        assert _closed_within(held[0], 2)[0]
        open_now = len(server._server.server_state.connections)
        assert open_now <= LIMITS.max_connections, open_now
    finally:
        for sock in held:
            sock.close()
    assert service.calls == []
    _still_answers(server)


def test_a_cap_full_of_requests_being_answered_refuses_the_next_connection_cleanly():
    service = FakeService()
    limits = ConnectionLimits(max_connections=2, head_timeout=5.0, idle_timeout=5.0)
    server = ServeServer(service, "127.0.0.1", 0, api_key=KEY, max_body_bytes=64 << 10,
                         max_concurrent=4, limits=limits)  # fmt: skip
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    call = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    service.hold.clear()
    busy = []
    try:
        for _ in range(2):  # two requests being answered: the cap is full of work
            sock = _connect(server)
            sock.sendall(call + body)
            busy.append(sock)
        with service.entered:
            assert service.entered.wait_for(lambda: len(service.calls) == 2, 30)
        with _connect(server) as sock:
            closed, answer = _closed_within(sock, 5)
        assert closed and answer.startswith(b"HTTP/1.1 503"), answer
        service.hold.set()
        for sock in busy:  # the requests being answered were not cut
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        service.hold.set()
        for sock in busy:
            sock.close()
        server.close()


def test_a_caller_without_the_key_keeps_no_connection(served):
    server, _ = served
    with _connect(server) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        closed, answer = _closed_within(sock, 0.8 * LIMITS.idle_timeout)
    assert closed and answer.startswith(b"HTTP/1.1 401"), answer[:100]


SERVER = """
import sys, time
from agentrl.ops.serve import ServeServer
from tests.security.test_serve_attacks import FakeService, KEY
server = ServeServer(FakeService(), "127.0.0.1", 0, api_key=KEY, max_body_bytes=65536,
                     max_concurrent=4)
print("PORT", server.port, flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_1100_half_open_connections_do_not_exhaust_a_server_with_1024_file_descriptors():
    """The attack as played: the server in its own process at ``ulimit -n 1024`` with the
    default limits; before, accept failed with EMFILE and the keyed call timed out."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import resource; resource.setrlimit("
         f"resource.RLIMIT_NOFILE, (1024, 1024))\n{SERVER}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    held = []
    try:
        line = ""
        while not line.startswith("PORT "):  # the server's log lines come first
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-2000:]
        port = int(line.split()[1])
        for _ in range(1100):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)  # the server accepts its backlog
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(KEYED)
            answer = sock.recv(200)
        assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - started < 3
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "Too many open files" not in err, err[-2000:]


def test_the_cap_is_at_most_half_the_file_descriptor_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    assert ConnectionLimits(max_connections=5000).within_fd_limit().max_connections == 512
    assert ConnectionLimits(max_connections=100).within_fd_limit().max_connections == 100
