"""Who may call the endpoint, and how much: an ASGI layer in front of the app.

Every request, on every route, passes four checks before the app reads a byte of its
body, each refused in OpenAI's error shape (``{"error": {"message", "type", "param",
"code"}}``), so an OpenAI client reports it as it would OpenAI's:

0. the head's size: a request line and headers over ``max_head_bytes`` -> 431
   ``request_header_fields_too_large`` (an incomplete head that long never gets here: see
   `connections`).
1. the API key: ``Authorization: Bearer <key>``, compared in constant time; missing or
   wrong -> 401 ``invalid_api_key``, and the connection is closed (a caller without the
   key keeps no connection open).
2. the concurrency limit: at most ``max_concurrent`` requests in the app at once; one
   more -> 429 ``rate_limit_exceeded`` with ``Retry-After: 1`` (OpenAI's clients retry it
   with backoff).
3. the body limit: a ``Content-Length`` over ``max_body_bytes`` -> 413
   ``request_too_large`` at once; a body without one (chunked) is counted as it streams in
   and refused as soon as it passes the limit. The app gets the body only once it is whole
   and within the limit, so at most ``max_concurrent`` x ``max_body_bytes`` is held.

`resolve_api_key` finds the key: ``serve.api_key`` (``@PATH`` reads a file), else
``$AGENTRL_API_KEY``, else a generated one kept in ``<run dir>/serve/api_key`` (mode
0600, the same across restarts of the run).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

__all__ = ["API_KEY_ENV", "KEY_FILE", "Guard", "error_body", "resolve_api_key"]

API_KEY_ENV = "AGENTRL_API_KEY"
"""Environment variable holding the endpoint's API key (when the config sets none)."""
KEY_FILE = Path("serve") / "api_key"
"""Where a generated key is kept, under the run directory."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def resolve_api_key(value: str | None, run_dir: Path) -> tuple[str, str]:
    """The endpoint's key and where it came from (``config``, ``file``, ``env``,
    ``generated``). Raises ValueError for an unreadable or empty ``@PATH``."""
    if value is not None and value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            key = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"serve.api_key: cannot read {path}: {exc.strerror}") from exc
        if not key:
            raise ValueError(f"serve.api_key: {path} is empty")
        return key, "file"
    if value:
        return value, "config"
    if os.environ.get(API_KEY_ENV):
        return os.environ[API_KEY_ENV], "env"
    path = run_dir / KEY_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip(), "generated"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "sk-agentrl-" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key, "generated"


class _TooLarge(Exception):
    """The body passed the limit while it streamed in."""


class Guard:
    """The ASGI layer of the module doc around ``app``."""

    def __init__(
        self,
        app,
        *,
        api_key: str,
        max_body_bytes: int,
        max_concurrent: int,
        max_head_bytes: int = 16 << 10,
    ) -> None:
        self.app = app
        self._max_head = max_head_bytes
        self._key = f"Bearer {api_key}".encode()
        self._max_body = max_body_bytes
        self._max_concurrent = max_concurrent
        self.in_flight = 0
        """Requests past the checks and in the app now (one event loop: no lock)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
        head += sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if head > self._max_head:
            await _refuse(send, 431, f"The request head is over {self._max_head} bytes.",
                          "invalid_request_error", "request_header_fields_too_large")  # fmt: skip
            return
        headers = dict(scope["headers"])  # names are lower case in ASGI
        if not hmac.compare_digest(headers.get(b"authorization", b""), self._key):
            given = b"authorization" in headers
            why = "Incorrect API key provided." if given else "You didn't provide an API key."
            await _refuse(send, 401, f"{why} Send Authorization: Bearer <serve.api_key>.",
                          "invalid_request_error", "invalid_api_key")  # fmt: skip
            return
        if self.in_flight >= self._max_concurrent:
            await _refuse(send, 429, f"Too many requests in flight (serve.max_concurrent = "
                          f"{self._max_concurrent}); retry shortly.", "requests",
                          "rate_limit_exceeded", [(b"retry-after", b"1")])  # fmt: skip
            return
        self.in_flight += 1
        try:
            await self._within_body_limit(scope, receive, send, headers)
        finally:
            self.in_flight -= 1

    async def _within_body_limit(self, scope, receive, send, headers) -> None:
        too_large = f"The request body is over serve.max_body_bytes ({self._max_body} bytes)."
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self._max_body):
            await _refuse(send, 413, too_large, "invalid_request_error", "request_too_large")
            return
        try:
            body = await self._read_body(receive)
        except _TooLarge:
            await _refuse(send, 413, too_large, "invalid_request_error", "request_too_large")
            return
        if body is None:
            return  # the client went away
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if sent:
                return await receive()  # a disconnect, if one comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise _TooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


async def _refuse(send: Send, status: int, message: str, kind: str, code: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
    body = json.dumps(error_body(message, kind, code)).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *(extra or [])]  # fmt: skip
    if status in (401, 413, 431):
        headers.append((b"connection", b"close"))  # no key, or the rest is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
