"""An OpenEnv server to play: one at a URL, or one the task starts from its ASGI app.

OpenEnv serves an environment over HTTP (``/health``, ``/schema``) and a WebSocket session
per client (``/ws``: reset, step, state), which OpenEnv's ``EnvClient`` drives. `Server`
either takes a running server's ``url`` or starts ``python -m uvicorn <app>`` on a free
loopback port (its output in a log file, its ``PYTHONPATH`` this process's ``sys.path`` so
the app imports as it would here), waits for ``/health``, and stops it at `close` or when
this process exits.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import structlog

__all__ = ["Server", "ServerError"]

log = structlog.get_logger(__name__)


class ServerError(ValueError):
    """Raised when the server cannot be started or reached (one line, the reason)."""


class Server:
    """A reachable OpenEnv server (module doc): ``url`` and its ``/schema``."""

    def __init__(self, *, url: str | None, app: str | None, start_timeout: float, task: str):
        if (url is None) == (app is None):
            raise ServerError(f"{task}: give one of url (a running server) or app (module:app)")
        self._process: subprocess.Popen | None = None
        self._log_path: str | None = None
        if app is not None:
            if ":" not in app:
                raise ServerError(f"{task}: app must be module:attribute, got {app!r}")
            url = self._start(app, start_timeout, task)
        assert url is not None
        self.url = url.rstrip("/")
        if app is None:
            self._wait(start_timeout, task)
        try:
            self.schema: dict[str, Any] = json.loads(self._get("/schema", 10.0))
        except (OSError, ValueError) as exc:
            self.close()
            raise ServerError(f"{task}: {self.url}/schema did not answer: {exc}") from exc

    def _start(self, app: str, timeout: float, task: str) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        handle, self._log_path = tempfile.mkstemp(prefix="agentrl-openenv-", suffix=".log")
        path = os.pathsep.join(p for p in sys.path if p)
        env = {**os.environ, "PYTHONPATH": path}
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--log-level", "warning"]
        with os.fdopen(handle, "w") as out:
            self._process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        atexit.register(self.close)
        self.url = f"http://127.0.0.1:{port}"
        self._wait(timeout, task)
        log.info("openenv server started", app=app, url=self.url, log=self._log_path)
        return self.url

    def _wait(self, timeout: float, task: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise ServerError(f"{task}: the server exited at start: {self._tail()}")
            try:
                self._get("/health", 2.0)
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    self.close()
                    raise ServerError(
                        f"{task}: no answer from {self.url}/health in {timeout:g} s ({exc})"
                    ) from exc
                time.sleep(0.1)

    def _get(self, path: str, timeout: float) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as reply:
            return reply.read()

    def _tail(self) -> str:
        if self._log_path is None:
            return ""
        with open(self._log_path, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-400:] or "no output"

    def close(self) -> None:
        """Stop the server this task started (none for a URL); idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
