"""The ``openenv-core`` package, imported on first use (importing agentrl never needs it)."""

from __future__ import annotations

import importlib
import threading
import types

from agentrl.environments._protocol import EnvError

__all__ = ["INSTALL", "OPENENV_VERSION", "OpenEnvMissing", "load"]

OPENENV_VERSION = "0.3.0"
"""The openenv-core release agentrl is tested with."""

INSTALL = "pip install -e '.[openenv]'"
"""How to install it (from the agentrl checkout)."""

_lock = threading.Lock()
_modules: types.SimpleNamespace | None = None


class OpenEnvMissing(EnvError, ImportError):
    """Raised when an openenv task is built and openenv-core is not installed."""


def load() -> types.SimpleNamespace:
    """openenv-core's parts the task uses, imported once (thread-safe): ``GenericEnvClient``
    (the WebSocket session client that works with plain dicts) and ``lost`` (the exceptions
    of a connection lost: socket errors, timeouts, the WebSocket closed).

    Raises OpenEnvMissing, one line with the install command, when it is missing."""
    global _modules
    with _lock:
        if _modules is None:
            try:
                client = importlib.import_module("openenv.core.generic_client")
                closed = importlib.import_module("websockets.exceptions").ConnectionClosed
                _modules = types.SimpleNamespace(
                    GenericEnvClient=client.GenericEnvClient,
                    lost=(ConnectionError, OSError, TimeoutError, closed),
                )
            except ImportError as exc:
                raise OpenEnvMissing(
                    f"the openenv task needs openenv-core ({exc}); install it: {INSTALL}"
                ) from exc
        return _modules
