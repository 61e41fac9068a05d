"""Hostile callers against `agentrl serve`: the real app behind its guard on uvicorn, with
a fake service (no model: what reaches the service is what is asserted). Classes: calls
without the key or with a wrong one on every route, bodies over the limit (a lying
Content-Length, a chunked body without end, deep JSON), and a flood of concurrent calls.
Each asserts the caller is refused in OpenAI's error shape, the service never sees the
request, and the endpoint still answers a good call afterwards."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest

from agentrl.ops.serve import EpisodeError, ServeServer
from agentrl.ops.serve.service import Completion

KEY = "sk-test-" + "k" * 24
MAX_BODY = 64 << 10
MAX_CONCURRENT = 4

HELLO = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

ROUTES = [
    ("GET", "/v1/models", None),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("POST", "/v1/episodes", {"task": "calculator"}),
    ("POST", "/v1/episodes/e1/step", {}),
    ("POST", "/v1/episodes/e1/end", {"reward": 1.0}),
    ("GET", "/v1/nosuch", None),
    ("GET", "/docs", None),
]
"""Every route the app serves, one it does not, and FastAPI's docs."""


class FakeBook:
    def get(self, episode_id):
        raise EpisodeError(f"no episode {episode_id!r}", 404)

    def open(self, task, **_):
        raise EpisodeError(f"no task {task!r}", 404)


class FakeService:
    """What the app calls; records every completion asked for; ``hold`` makes them wait."""

    model, version = "fake", 0

    def __init__(self) -> None:
        self.book = FakeBook()
        self.calls: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Condition()

    def complete(self, messages, tools, **_):
        with self.entered:
            self.calls.append(sum(len(m.content) for m in messages))
            self.entered.notify_all()
        assert self.hold.wait(30)
        from agentrl.messages import ChatMessage, GenerateResult

        result = GenerateResult(
            request_id="r", token_ids=[1], logprobs=[0.0], version=0, pool="p", finish_reason="stop"
        )
        return [1, 2], [Completion(result, ChatMessage("assistant", "ok"), "ok", "stop")]

    def close(self) -> None:
        self.hold.set()


@pytest.fixture
def served():
    service = FakeService()
    server = ServeServer(service, "127.0.0.1", 0, api_key=KEY, max_body_bytes=MAX_BODY,
                         max_concurrent=MAX_CONCURRENT)  # fmt: skip
    yield server, service
    server.close()


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self):
        return json.loads(self.text)


def _request(server, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
    """One call with the standard library's client (``path`` from the root)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=sent)
        got = conn.getresponse()
        return Response(got.status, {k.lower(): v for k, v in got.getheaders()},
                        got.read().decode())  # fmt: skip
    finally:
        conn.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def _good(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def _still_answers(server) -> None:
    assert [m.id for m in _good(server).models.list().data] == ["fake"]
    reply = _good(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "ok"


def _openai_error(response: Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert error["message"] and error["param"] is None


@pytest.mark.parametrize("method,path,body", ROUTES)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
     {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"bearer {KEY[:-1]}"},
     {"X-Api-Key": KEY}, {"Authorization": f"Basic {KEY}"}],
    ids=["none", "wrong", "no-bearer", "longer", "shorter", "other-header", "basic"],
)  # fmt: skip
def test_every_route_refuses_a_caller_without_the_key(served, method, path, body, headers):
    server, service = served
    response = _request(server, method, path, body, headers)
    _openai_error(response, 401, "invalid_api_key")
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert service.calls == []


def test_the_openai_client_with_a_wrong_key_gets_its_authentication_error(served):
    server, service = served
    client = openai.OpenAI(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert service.calls == []
    _still_answers(server)


def _raw(server, head: bytes, body_chunks, read: bool = True) -> bytes:
    """Send a raw request; the response's bytes (what came back before the server closed)."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        try:
            sock.sendall(head)
            for chunk in body_chunks:
                sock.sendall(chunk)
        except OSError:
            pass  # the server stopped reading and closed: what it answered is below
        if not read:
            return b""
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass  # reset after the answer
        return data


def _head(server, extra: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n{extra}\r\n"
            ).encode()  # fmt: skip


def test_a_body_over_the_limit_is_refused_before_it_is_read_or_parsed(served):
    server, service = served
    big = {"model": "m", "messages": [{"role": "user", "content": "a" * (4 * MAX_BODY)}]}
    response = _request(server, "POST", "/v1/chat/completions", big, AUTH)
    _openai_error(response, 413, "request_too_large")
    # a Content-Length that claims 10 GB: refused on the header, nothing read
    started = time.monotonic()
    answer = _raw(server, _head(server, "Content-Length: 10000000000\r\n"), [b"{}"])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - started < 5
    # a chunked body without end: refused once it passes the limit, the rest never read
    chunk = b"a" * 65536
    endless = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(2000))  # 128 MB
    started = time.monotonic()
    answer = _raw(server, _head(server, "Transfer-Encoding: chunked\r\n"), endless)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - started < 20
    # a Content-Length smaller than what is sent: the body is what it says, the rest is junk
    answer = _raw(server, _head(server, "Content-Length: 20\r\n"), [b"x" * (4 * MAX_BODY)])
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
    assert service.calls == []  # nothing reached the tokenizer
    _still_answers(server)


@pytest.mark.parametrize("depth", [100, 5000, 30000])
def test_deeply_nested_json_is_a_client_error(served, depth):
    server, service = served
    nested = "[" * depth + "]" * depth
    body = '{"model": "m", "messages": [{"role": "user", "content": ' + nested + "}]}"
    response = _request(server, "POST", "/v1/chat/completions", headers=AUTH, raw=body.encode())
    assert 400 <= response.status_code < 500, response.text[:300]
    assert "error" in response.json()
    assert service.calls == []
    _still_answers(server)


def test_a_flood_of_calls_is_refused_past_the_concurrency_limit_and_served_after(served):
    server, service = served
    service.hold.clear()
    flood = 3 * MAX_CONCURRENT
    with ThreadPoolExecutor(flood) as pool:
        held = [pool.submit(_ask, server) for _ in range(MAX_CONCURRENT)]
        with service.entered:  # the first MAX_CONCURRENT are in the service, waiting
            assert service.entered.wait_for(lambda: len(service.calls) == MAX_CONCURRENT, 30)
        refused = [pool.submit(_ask, server) for _ in range(flood - MAX_CONCURRENT)]
        for future in refused:
            response = future.result(30)
            _openai_error(response, 429, "rate_limit_exceeded")
            assert response.headers["retry-after"] == "1"
        service.hold.set()
        assert [f.result(30).status_code for f in held] == [200] * MAX_CONCURRENT
    assert len(service.calls) == MAX_CONCURRENT
    # a request leaves the count when the app returns, which may be just after its caller
    # has read the whole response
    deadline = time.monotonic() + 10
    while server.guard.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.guard.in_flight == 0
    _still_answers(server)


def _ask(server) -> Response:
    return _request(server, "POST", "/v1/chat/completions", HELLO, AUTH)


def test_a_refused_flood_is_not_counted_against_good_callers(served):
    server, _ = served
    with ThreadPoolExecutor(16) as pool:
        bad = list(pool.map(lambda _: _request(server, "GET", "/v1/models"), range(64)))
    assert {r.status_code for r in bad} == {401}
    assert server.guard.in_flight == 0
    _still_answers(server)
    assert json.loads(bad[0].text)["error"]["code"] == "invalid_api_key"


def test_the_limits_are_checked_with_the_config_and_the_key_is_found_in_order(
    tmp_path, monkeypatch
):
    from agentrl.ops import ConfigError, parse_config
    from agentrl.ops.serve import API_KEY_ENV, resolve_api_key

    bad = {"api_key": " ", "max_body_bytes": 10, "max_concurrent": 0}
    with pytest.raises(ConfigError) as info:
        parse_config({"run": "r", "serve": bad})
    for name in bad:
        assert f"serve.{name}" in str(info.value)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key, source = resolve_api_key(None, tmp_path)  # generated, kept for the owner only
    assert source == "generated" and len(key) > 32
    assert (tmp_path / "serve" / "api_key").stat().st_mode & 0o777 == 0o600
    assert resolve_api_key(None, tmp_path) == (key, "generated")  # the same after a restart
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None, tmp_path) == ("from-env", "env")
    (tmp_path / "secret").write_text("from-file\n")
    assert resolve_api_key(f"@{tmp_path}/secret", tmp_path) == ("from-file", "file")
    assert resolve_api_key("in-config", tmp_path) == ("in-config", "config")
    with pytest.raises(ValueError, match="cannot read"):
        resolve_api_key(f"@{tmp_path}/absent", tmp_path)
