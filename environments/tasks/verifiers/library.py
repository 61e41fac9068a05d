"""The ``verifiers`` package (its ``verifiers.v1`` stack), imported on first use (importing
agentrl never needs it)."""

from __future__ import annotations

import importlib
import threading
import types

from agentrl.environments._protocol import EnvError

__all__ = ["INSTALL", "VERIFIERS_VERSION", "VerifiersMissing", "load"]

VERIFIERS_VERSION = "0.4.0"
"""The verifiers release agentrl is tested with."""

INSTALL = "pip install -e '.[verifiers]'"
"""How to install it (from the agentrl checkout)."""

_lock = threading.Lock()
_modules: types.SimpleNamespace | None = None


class VerifiersMissing(EnvError, ImportError):
    """Raised when a verifiers task is built and verifiers is not installed."""


def load() -> types.SimpleNamespace:
    """verifiers' parts the adapter uses, imported once (thread-safe): ``vf``
    (``verifiers.v1``), ``loaders`` (taskset and env lookup by id), ``agent_config`` (an
    Env's seats), ``graph`` (the trace's message graph), ``session`` (``hook_boundary``,
    ``call_hook``), ``dialects`` (``parse_message``), ``decorators``
    (``discover_decorated``, ``invoke``), ``mcp_server`` (tool state) and ``MCPServer``.

    Raises VerifiersMissing, one line with the install command, when it is missing."""
    global _modules
    with _lock:
        if _modules is None:
            try:
                _modules = types.SimpleNamespace(
                    vf=importlib.import_module("verifiers.v1"),
                    loaders=importlib.import_module("verifiers.v1.utils.loaders"),
                    agent_config=importlib.import_module("verifiers.v1.configs.agent"),
                    graph=importlib.import_module("verifiers.v1.graph"),
                    session=importlib.import_module("verifiers.v1.session"),
                    dialects=importlib.import_module("verifiers.v1.dialects"),
                    decorators=importlib.import_module("verifiers.v1.utils.decorators"),
                    mcp_server=importlib.import_module("verifiers.v1.mcp.server"),
                    MCPServer=importlib.import_module("mcp.server.mcpserver").MCPServer,
                )
            except ImportError as exc:
                raise VerifiersMissing(
                    f"the verifiers tasks need verifiers ({exc}); install it: {INSTALL}"
                ) from exc
        return _modules
