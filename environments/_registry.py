"""Task registry: task names to environment factories.

Built-in tasks are listed as ``"module:attribute"`` strings and imported on
first use, so importing agentrl.environments stays cheap and side-effect free
and a task with heavy dependencies costs nothing until it is made.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from agentrl.environments._protocol import Environment, TaskOptionsError, UnknownTask

__all__ = ["expand_task_name", "make_task", "register_task", "task_names"]

TaskFactory = Callable[..., Environment]

_BUILTIN: dict[str, str] = {
    "calculator": "agentrl.environments.tasks.calculator.task:CalculatorTask",
    "db": "agentrl.environments.tasks.db.task:DBTask",
    "os": "agentrl.environments.tasks.os.task:OSTask",
    "kg": "agentrl.environments.tasks.kg.task:KGTask",
    "alfworld": "agentrl.environments.tasks.alfworld.task:AlfworldTask",
    "webshop": "agentrl.environments.tasks.webshop.task:WebShopTask",
    "bfcl": "agentrl.environments.tasks.bfcl.task:bfcl",
    "bfcl_multi_turn": "agentrl.environments.tasks.bfcl.task:bfcl_multi_turn",
}

_lock = threading.Lock()
_factories: dict[str, TaskFactory | str] = dict(_BUILTIN)


def register_task(name: str, factory: TaskFactory, *, replace: bool = False) -> None:
    """Register ``factory`` (called with the task options) under ``name``.

    Raises ValueError if the name is taken and ``replace`` is False.
    """
    with _lock:
        if name in _factories and not replace:
            raise ValueError(f"task {name!r} is already registered")
        _factories[name] = factory


def task_names() -> list[str]:
    """Names of every registered task, sorted."""
    with _lock:
        return sorted(_factories)


def make_task(name: str, **options: Any) -> Environment:
    """Build the environment of task ``name`` with ``options``.

    Raises UnknownTask (listing the known names) for an unregistered name and
    TaskOptionsError when the options do not fit the factory's signature. A name
    ``base:variant`` builds task ``base`` with its ``variant_option`` set to ``variant``
    (``bfcl:multiple`` is ``bfcl`` with ``category="multiple"``). Every task
    with an oracle check agent also takes ``demo: true|N`` (a solved example of N
    oracle steps on another instance in front of each prompt, see `_demo`).
    """
    base, variant = name, None
    with _lock:
        entry = _factories.get(name)
        if entry is None and ":" in name:
            base, _, variant = name.partition(":")
            entry = _factories.get(base)
    if entry is None:
        raise UnknownTask(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
    factory = _load(entry) if isinstance(entry, str) else entry
    if variant is not None:
        options = _with_variant(base, factory, variant, options)
    signature = inspect.signature(factory)
    demo = None
    if "demo" in options and "demo" not in signature.parameters:
        options = dict(options)
        demo = options.pop("demo")  # an oracle demo in the prompt, for any task (`_demo`)
        if not isinstance(demo, bool | int) or demo < 0:
            raise TaskOptionsError(f"task {name!r}: demo must be true, false or a step count")
    try:
        signature.bind(**options)
    except TypeError as exc:
        raise TaskOptionsError(f"task {name!r}: bad options {sorted(options)}: {exc}") from exc
    env = factory(**options)
    if demo:
        from agentrl.environments._demo import with_demo

        try:
            env = with_demo(env, name, demo)
        except ValueError as exc:
            raise TaskOptionsError(f"task {name!r}: {exc}") from exc
    return env


def expand_task_name(name: str) -> list[str]:
    """The task names ``name`` stands for: ``base:v`` for each ``v`` of
    ``factory.variants(variant)`` when ``name`` is ``base:variant`` and the factory has
    ``variants`` (``bfcl:non_live`` is BFCL's non-live categories), else ``[name]``.
    Raises UnknownTask for an unregistered base, ValueError for an unknown variant."""
    base, sep, variant = name.partition(":")
    if not sep:
        return [name]
    with _lock:
        entry = _factories.get(name) or _factories.get(base)
    if entry is None:
        raise UnknownTask(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
    factory = _load(entry) if isinstance(entry, str) else entry
    variants = getattr(factory, "variants", None)
    if variants is None:
        return [name]
    return [f"{base}:{v}" for v in variants(variant)]


def _with_variant(
    base: str, factory: TaskFactory, variant: str, options: dict[str, Any]
) -> dict[str, Any]:
    """``options`` with the variant of ``base:variant`` as the option the factory names in
    its ``variant_option`` (``bfcl:simple_python`` is ``bfcl`` with category simple_python)."""
    option = getattr(factory, "variant_option", None)
    if option is None:
        raise UnknownTask(f"task {base!r} takes no variant (got {base}:{variant})")
    if option in options and options[option] != variant:
        raise TaskOptionsError(
            f"task {base}:{variant}: option {option}={options[option]!r} contradicts the name"
        )
    return {**options, option: variant}


def _load(ref: str) -> TaskFactory:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
