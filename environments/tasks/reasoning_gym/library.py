"""The ``reasoning-gym`` package, imported on first use (importing agentrl never needs it)."""

from __future__ import annotations

import importlib
import threading
import types

from agentrl.environments._protocol import EnvError

__all__ = ["INSTALL", "REASONING_GYM_VERSION", "ReasoningGymMissing", "load"]

REASONING_GYM_VERSION = "0.1.25"
"""The reasoning-gym release agentrl is tested with."""

INSTALL = "pip install -e '.[reasoning-gym]'"
"""How to install it (from the agentrl checkout)."""

_lock = threading.Lock()
_modules: types.SimpleNamespace | None = None


class ReasoningGymMissing(EnvError, ImportError):
    """Raised when a reasoning_gym task is built and reasoning-gym is not installed."""


def load() -> types.SimpleNamespace:
    """reasoning-gym's parts the tasks use, imported once (thread-safe): ``factory``
    (``create_dataset``, ``create_curriculum``, ``has_curriculum``, ``DATASETS``) and
    ``utils`` (``extract_answer``, ``SYSTEM_PROMPTS``).

    Raises ReasoningGymMissing, one line with the install command, when it is missing."""
    global _modules
    with _lock:
        if _modules is None:
            try:
                _modules = types.SimpleNamespace(
                    factory=importlib.import_module("reasoning_gym.factory"),
                    utils=importlib.import_module("reasoning_gym.utils"),
                )
            except ImportError as exc:
                raise ReasoningGymMissing(
                    f"the reasoning_gym tasks need reasoning-gym ({exc}); install it: {INSTALL}"
                ) from exc
        return _modules
