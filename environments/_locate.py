"""Tasks from outside agentrl: entry points (group ``agentrl.tasks``) and import paths.

A package offers tasks by declaring entry points (``setup.cfg``:
``[options.entry_points] agentrl.tasks = guess = mypkg.envs:GuessTask``); a run config or a
command names any class or factory directly as ``package.module:attribute``
(``mypkg.envs:make_env``, the module found on ``sys.path``, so ``PYTHONPATH`` or the current
folder). Either is called with the task's options and returns an `Environment`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import threading
from collections.abc import Callable
from typing import Any

from agentrl.environments._protocol import UnknownTask

__all__ = [
    "ENTRY_POINT_GROUP",
    "TaskImportError",
    "entry_point_names",
    "find_entry_point",
    "is_import_path",
    "load_import_path",
]

ENTRY_POINT_GROUP = "agentrl.tasks"
"""The entry-point group whose names are task names."""

_lock = threading.Lock()
_points: dict[str, importlib.metadata.EntryPoint] | None = None


class TaskImportError(UnknownTask):
    """Raised when an import path or an entry point names a module or attribute that does not
    import; the message names the module and the missing name."""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by name, read once per process."""
    global _points
    with _lock:
        if _points is None:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            _points = {point.name: point for point in found}
        return _points


def entry_point_names() -> list[str]:
    """Names of the installed ``agentrl.tasks`` entry points."""
    return sorted(_entry_points())


def find_entry_point(name: str) -> Callable[..., Any] | None:
    """The factory of entry point ``name``, None when there is none by that name."""
    point = _entry_points().get(name)
    if point is None:
        return None
    return _import(name, point.module, point.attr or "", f"entry point {name!r} ({point.value})")


def is_import_path(name: str) -> bool:
    """True for ``package.module:attribute`` (dotted identifiers either side of one colon)."""
    module, sep, attr = name.partition(":")
    return bool(sep) and all(part.isidentifier() for part in [*module.split("."), *attr.split(".")])


def load_import_path(name: str) -> Callable[..., Any] | None:
    """The class or factory ``package.module:attribute`` names; None when ``name`` is not an
    import path; TaskImportError when it does not import."""
    if not is_import_path(name):
        return None
    module, _, attr = name.partition(":")
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:  # neither a registered task nor importable
        raise TaskImportError(
            f"unknown task {name!r}: not a registered task, and no module named {top!r} to "
            "import it from (put the folder that holds it on PYTHONPATH, or pip install its "
            "package)"
        )
    return _import(name, module, attr, f"task {name!r}")


def _import(name: str, module: str, attr: str, what: str) -> Callable[..., Any]:
    try:
        found: Any = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if module == missing or module.startswith(f"{missing}."):
            raise TaskImportError(
                f"{what}: no module named {missing!r} (importing {module!r}: put the folder "
                "that holds it on PYTHONPATH, or pip install its package)"
            ) from exc
        raise TaskImportError(
            f"{what}: importing {module!r} failed: it imports {missing!r}, which is not installed"
        ) from exc
    except Exception as exc:  # the user's module raised while importing: say which and why
        raise TaskImportError(
            f"{what}: importing {module!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split(".") if attr else []:
        if not hasattr(found, part):
            raise TaskImportError(f"{what}: module {module!r} has no attribute {attr!r}")
        found = getattr(found, part)
    if not callable(found):
        raise TaskImportError(f"{what}: {module}:{attr} is not a class or function")
    return found
