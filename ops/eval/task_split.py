"""Which split a command builds a task on when the user did not say (`split` option)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.environments import Environment, TaskOptionsError, make_task

__all__ = ["NO_SPLIT", "make_on_split"]

NO_SPLIT = "all (no split option)"
"""The split reported for a task whose factory takes no ``split`` option."""


def make_on_split(
    name: str, options: Mapping[str, Any], default: str
) -> tuple[Environment, dict[str, Any], str]:
    """Build task ``name`` with ``split=default`` unless ``options`` name a split or the
    factory takes none; returns the environment, the options used and the split.

    Raises what `make_task` raises for the options themselves.
    """
    if "split" in options:
        return make_task(name, **options), dict(options), str(options["split"])
    with_split = {**options, "split": default}
    try:
        return make_task(name, **with_split), with_split, default
    except TaskOptionsError:
        env = make_task(name, **options)  # raises the options' own problem, if any
    return env, dict(options), NO_SPLIT
