"""Logging setup for entry points: readable console lines plus JSON-lines files.

Libraries only call `structlog.get_logger(__name__)`; this module is the one
place that configures where the lines go. Actors bind ``role`` and ``actor`` to
their loggers (and ``episode``, ``task``, ``version`` where known); with a
``log_dir`` every JSON line goes to ``<log_dir>/<role>.jsonl`` (lines without a
role, e.g. the supervisor's own, to ``supervisor.jsonl``), so one process that
runs several roles still writes one file per role. ``context`` (run, node) is
bound to every line. A line logged with ``console=False`` goes to the file only.

An actor's unhandled exception, which stops it, is said by pykka on the stdlib logger
``pykka``, which has no handler of its own: `configure_logging` routes its errors here, one
``actor failed`` console line naming the exception, the traceback in the file
(`_ActorFailures`). Without it the supervisor's ``actor stopped unexpectedly`` had no reason.

Progress bars: transformers' tqdm bars (loading weights, writing checkpoint shards) draw
nothing on the console, where they would cut the log lines in half; each leaves one
``progress bar`` line in the log file when it ends (`LoggedBar`). The model conversion's
own progress is said in log lines (`agentrl.trainer`'s ``converting the model``).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import structlog

__all__ = ["configure_logging"]

log = structlog.get_logger(__name__)


def _bars_to_log() -> None:
    """transformers' bars become `LoggedBar`s (unless its bars are switched off)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # no transformers here (an environment worker): no bars to route
        return
    from .bars import LoggedBar  # tqdm comes with transformers, not with every install

    def hook(factory, args, kwargs):
        if not hf_logging.is_progress_bar_enabled():
            return factory(*args, **kwargs)
        return LoggedBar(*args, **kwargs)

    hf_logging.set_tqdm_hook(hook)


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class _Tee:
    """A final processor: JSON to the role's file, a console rendering to stderr."""

    def __init__(self, log_dir: Path | None, console_level: int) -> None:
        self._lock = threading.Lock()
        self._dir = log_dir
        self._files: dict[str, Any] = {}
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        self._console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        self._level = console_level

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        level = _LEVELS.get(event.get("level", "info"), 20)
        console = event.pop("console", True)
        with self._lock:
            if self._dir is not None:
                self._file(str(event.get("role") or "supervisor")).write(
                    json.dumps(event, default=str) + "\n"
                )
            if console and level >= self._level:
                sys.stderr.write(self._console(logger, name, dict(event)) + "\n")
        raise structlog.DropEvent

    def _file(self, role: str):
        fh = self._files.get(role)
        if fh is None:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in role)
            fh = self._files[role] = (self._dir / f"{safe}.jsonl").open("a", buffering=1)
        return fh


class _ActorFailures(logging.Handler):
    """pykka's error records (an actor's unhandled exception) as structlog lines: the
    exception's type and message on the console, the traceback in the log file only."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        where = record.getMessage().removeprefix("Unhandled exception in ").rstrip(":")
        exc = record.exc_info
        if exc is None or exc[1] is None:
            log.error("actor failed", actor=where)
            return
        error = f"{exc[0].__name__}: {exc[1]}".splitlines()[0]
        log.error("actor failed", actor=where, error=error)
        log.error("actor failed: traceback", actor=where, exc_info=exc, console=False)


_PYKKA_HANDLER = _ActorFailures()


def configure_logging(level: str = "info", log_dir: Path | None = None, **context: str) -> None:
    """Configure structlog once per process: console at ``level``, JSON per role in ``log_dir``;
    transformers' progress bars to the log file only (module doc).

    ``context`` (e.g. run, node) is bound to every line.
    """
    _bars_to_log()
    logging.getLogger("pykka").addHandler(_PYKKA_HANDLER)  # adds this one handler once
    tee = _Tee(log_dir, _LEVELS.get(level, 20))
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
