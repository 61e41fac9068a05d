"""Logging setup for entry points: readable console lines plus a JSON-lines file.

Libraries only call `structlog.get_logger(__name__)`; this module is the one
place that configures where the lines go.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import structlog

__all__ = ["configure_logging"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class _Tee:
    """A final processor: JSON to a file, a console rendering to stderr."""

    def __init__(self, json_path: Path | None, console_level: int) -> None:
        self._lock = threading.Lock()
        self._file = None
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = json_path.open("a", buffering=1)
        self._console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        self._level = console_level

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        level = _LEVELS.get(event.get("level", "info"), 20)
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(event, default=str) + "\n")
            if level >= self._level:
                sys.stderr.write(self._console(logger, name, dict(event)) + "\n")
        raise structlog.DropEvent


def configure_logging(level: str = "info", json_path: Path | None = None, **context: str) -> None:
    """Configure structlog once per process; `context` is bound to every line."""
    tee = _Tee(json_path, _LEVELS.get(level, 20))
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _bind(context),
            tee,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(_LEVELS.get(level, 20), 20)),
        cache_logger_on_first_use=False,
    )


def _bind(context: dict[str, str]):
    def processor(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
        for key, value in context.items():
            event.setdefault(key, value)
        return event

    return processor
