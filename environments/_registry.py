"""Task registry: task names to environment factories.

Built-in tasks are listed as ``"module:attribute"`` strings and imported on
first use, so importing agentrl.environments stays cheap and side-effect free
and a task with heavy dependencies costs nothing until it is made.

A name is looked up in this order: a registered name (``calculator``), a registered base
with a variant (``bfcl:simple``), an entry point of group ``agentrl.tasks`` (a package's
own tasks, by name or as a base with a variant), and last an import path
``package.module:attribute`` (a class or factory of the user's own, see `_locate`).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from agentrl.environments._locate import (
    TaskImportError,
    entry_point_names,
    find_entry_point,
    load_import_path,
)
from agentrl.environments._protocol import (
    Environment,
    TaskOptionsError,
    UnknownTask,
    reward_range,
    tool_schema_problems,
)

__all__ = [
    "check_task",
    "expand_task_name",
    "make_task",
    "register_task",
    "task_names",
    "task_problems",
]

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
    "reasoning_gym": "agentrl.environments.tasks.reasoning_gym.task:reasoning_gym",
    "verifiers": "agentrl.environments.tasks.verifiers.task:verifiers",
    "openenv": "agentrl.environments.tasks.openenv.task:openenv",
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
    """Names of every registered task and entry point (group ``agentrl.tasks``), sorted."""
    with _lock:
        names = set(_factories)
    return sorted(names | set(entry_point_names()))


def make_task(name: str, **options: Any) -> Environment:
    """Build the environment of task ``name`` with ``options``.

    Raises UnknownTask (listing the known names) for a name that is neither registered nor
    an entry point nor an import path, TaskImportError (an UnknownTask) for an import path
    that does not import, and TaskOptionsError when the options do not fit the factory's
    signature. A name ``base:variant`` builds task ``base`` with its ``variant_option`` set
    to ``variant`` (``bfcl:multiple`` is ``bfcl`` with ``category="multiple"``). Every task
    with an oracle check agent also takes ``demo: true|N`` (a solved example of N oracle
    steps on another instance in front of each prompt, see `_demo`).

    The built environment's ``tools`` must be OpenAI function schemas
    (`tool_schema_problems`) and its ``reward_range``, where it declares one, two finite
    numbers: else TaskOptionsError, one line naming the task and the first problem.
    """
    factory, options, demo = _bind(name, options)
    env = factory(**options)
    _check_built(name, env)
    if demo:
        from agentrl.environments._demo import with_demo

        try:
            env = with_demo(env, name, demo)
        except ValueError as exc:
            raise TaskOptionsError(f"task {name!r}: {exc}") from exc
    return env


def _check_built(name: str, env: Environment) -> None:
    """Refuse a built task whose tool schemas or declared reward range are unusable."""
    problems = tool_schema_problems(env.tools)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TaskOptionsError(f"task {name!r}: invalid tool schema: {problems[0]}{more}")
    try:
        reward_range(env)
    except TaskOptionsError as exc:
        raise TaskOptionsError(f"task {name!r}: {exc}") from None


def check_task(name: str, options: dict[str, Any]) -> None:
    """What `make_task` would refuse before building anything: the name (importing an
    import path's module) and the options against the factory's signature. Raises
    UnknownTask or TaskOptionsError."""
    _bind(name, options)


def task_problems(name: str, options: dict[str, Any]) -> list[str]:
    """`check_task`'s refusal as a list of one line (empty when none), for a run config's
    checks at start: an unknown name lists the known ones. A factory with an
    ``option_problems(**options) -> list[str]`` is then asked what it refuses in options
    that fit its signature, a line each in its own words (kg: Freebase data without an
    endpoint)."""
    try:
        resolved = _resolve(name)
    except TaskImportError as exc:
        return [str(exc)]
    except UnknownTask:
        return [f"unknown task {name!r} (known: {', '.join(task_names())})"]
    try:
        factory, options, _ = _bind(name, options, resolved)
    except (UnknownTask, TaskOptionsError) as exc:
        return [str(exc)]
    own_check = getattr(factory, "option_problems", None)
    return list(own_check(**options)) if own_check else []


def _bind(
    name: str,
    options: dict[str, Any],
    resolved: tuple[TaskFactory, str, str | None] | None = None,
) -> tuple[TaskFactory, dict[str, Any], Any]:
    """The factory of ``name``, the options it is called with, and the ``demo`` option
    taken out for `_demo` (None when the factory takes ``demo`` itself or none was given)."""
    factory, base, variant = resolved or _resolve(name)
    if variant is not None:
        options = _with_variant(base, factory, variant, options)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError) as exc:
        raise TaskOptionsError(f"task {name!r}: {factory!r} has no signature: {exc}") from exc
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
    return factory, options, demo


def _resolve(name: str) -> tuple[TaskFactory, str, str | None]:
    """``(factory, base, variant)`` of a task name, in the order the module doc gives."""
    base, sep, rest = name.partition(":")
    variant: str | None = rest if sep else None
    with _lock:
        entry = _factories.get(name)
        if entry is not None:
            base, variant = name, None
        elif sep:
            entry = _factories.get(base)
    if entry is not None:
        return (_load(entry) if isinstance(entry, str) else entry), base, variant
    point = find_entry_point(name)
    if point is not None:
        return point, name, None
    if sep:
        point = find_entry_point(base)
        if point is not None:
            return point, base, variant
    factory = load_import_path(name)
    if factory is None:
        raise UnknownTask(
            f"unknown task {name!r}; known tasks: {', '.join(task_names())}; "
            "or name your own as package.module:attribute"
        )
    return factory, name, None


def expand_task_name(name: str) -> list[str]:
    """The task names ``name`` stands for: ``base:v`` for each ``v`` of
    ``factory.variants(variant)`` when ``name`` is ``base:variant`` and the factory has
    ``variants`` (``bfcl:non_live`` is BFCL's non-live categories), else ``[name]``.
    An unknown name stands for itself (`make_task` then says why it is unknown); raises
    ValueError for an unknown variant."""
    if ":" not in name:
        return [name]
    try:
        factory, base, variant = _resolve(name)
    except UnknownTask:
        return [name]  # reported once, by make_task, with the rest of the task's problems
    variants = getattr(factory, "variants", None)
    if variant is None or variants is None:
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
