"""A verifiers taskset's tasks on one side of agentrl's train/test split, and its Env.

verifiers 0.4.0 resolves an environment by the id of its *taskset*: an installed module
(``verifiers.v1.tasksets.<id>`` first, else ``<id>``) that exports one ``vf.Taskset``
subclass, and optionally one ``vf.Env`` subclass (else ``SingleAgentEnv``: one seat
playing each task once). `TasksetSource` builds both through verifiers' own loaders
(``resolve_env_config`` then ``load_environment``), so a taskset loads here exactly as it
loads for ``vf-eval``: its config class validates the ``taskset`` option and its
``load()`` yields the tasks.

**Loading.** A taskset whose ``load()`` raises (one that downloads a data set, offline; bad
data) is refused in one line naming the error (`TasksetLoadError`), as is one whose module
does not import (its extra missing: verifiers' ``textarena`` says which to install).

**Split.** Tasks are read from ``taskset.load()`` in order and kept when their
``task.key`` (verifiers' durable identity: the content hash of the task's data unless the
taskset names one) belongs to the split asked for (`tasks.toolkit.split.in_split` on
``<taskset id>:<key>``, a quarter to ``test``); ``split: all`` keeps every task, so
instance ``i`` is ``load()``'s task ``i``. ``size`` caps the instances; an infinite
taskset (``Taskset.INFINITE``) needs it. Tasks are read on first use and kept, under a
lock, so two starts of one instance are the same task.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import ValidationError

from agentrl.environments._protocol import SampleError
from agentrl.environments.tasks.toolkit.split import in_split
from agentrl.environments.tasks.verifiers.library import load

__all__ = ["TasksetLoadError", "TasksetSource", "one_line"]

_WALK_PER_ITEM = 50
"""How many tasks of an infinite taskset the walk may read per instance it needs."""


class TasksetLoadError(SampleError, ValueError):
    """Raised when the taskset's own ``load()`` fails (a download that cannot be made
    offline, bad data): a ValueError when the task is built, a SampleError at a start."""


def one_line(exc: Exception) -> str:
    """An exception as one line: a pydantic error as ``field: message; ...``."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
    return " ".join(str(exc).split())


class TasksetSource:
    """The taskset ``taskset_id`` with ``options`` (fields of its config class), its Env,
    and the tasks of one split (module doc). Refuses, one line each, what agentrl cannot
    play: an Env with more than one seat (another model would play the others), a task
    type that needs a container, and a taskset that is not installed."""

    def __init__(
        self,
        taskset_id: str,
        options: dict[str, Any],
        *,
        split: str,
        seed: int,
        size: int | None,
        task: str,
    ) -> None:
        m = load()
        self.id, self.split, self.seed, self._task = taskset_id, split, seed, task
        if "id" in options:
            raise ValueError(f"{task}: name the taskset in the task name, not as taskset.id")
        raw = {"taskset": {**options, "id": taskset_id}}
        try:
            config = m.loaders.resolve_env_config(raw)
            roles = list(m.agent_config.agent_config_fields(config))
            if len(roles) != 1:
                raise ValueError(
                    f"its Env seats {len(roles)} agents ({', '.join(roles)}); agentrl plays "
                    "one policy, so only single-seat Envs are supported"
                )
            # the seat's harness is agentrl's rollout: verifiers' tool-less chat loop
            # (`null`) stands in for it, so no program is prepared or launched
            seat = {**config.model_dump(exclude_unset=True).get(roles[0], {})}
            raw[roles[0]] = {**seat, "harness": {"id": "null"}}
            config = m.loaders.resolve_env_config(raw)
            self.env = m.loaders.load_environment(config)
        except ImportError as exc:  # not installed, or its own imports missing (an extra)
            raise ValueError(f"{task}: {one_line(exc)}") from exc
        except (ValidationError, ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{task}: taskset {taskset_id!r}: {one_line(exc)}") from exc
        self.role = roles[0]
        self.seat = getattr(config, self.role)
        self.taskset = self.env.taskset
        task_type = type(self.taskset).task_type()
        if task_type.NEEDS_CONTAINER:
            raise ValueError(
                f"{task}: {task_type.__name__} needs a container (NEEDS_CONTAINER); agentrl "
                "plays verifiers tasks without a sandbox runtime"
            )
        if size is None and self.taskset.INFINITE:
            raise ValueError(f"{task}: taskset {taskset_id!r} is infinite: give size")
        self.size = size
        self._tasks: list[Any] = []
        self._walk = iter(self.taskset)
        self._read = 0
        self._exhausted = False
        self._lock = threading.Lock()

    def count(self) -> int:
        """The number of instances: ``size``, or every task of the split (read all)."""
        if self.size is not None:
            return self.size
        with self._lock:
            self._fill(None)
            return len(self._tasks)

    def task(self, k: int) -> Any:
        """The split's ``k``-th task (read up to it on first use); SampleError when the
        taskset has fewer."""
        with self._lock:
            self._fill(k + 1)
            if k >= len(self._tasks):
                raise SampleError(
                    f"{self._task}: only {len(self._tasks)} {self.split} task(s) in "
                    f"{self._read} read from taskset {self.id!r}: lower size"
                )
            return self._tasks[k]

    def _fill(self, want: int | None) -> None:
        limit = None if self.size is None else self.size * _WALK_PER_ITEM
        while not self._exhausted and (want is None or len(self._tasks) < want):
            if limit is not None and self._read >= limit:
                return
            try:
                found = next(self._walk)
            except StopIteration:
                self._exhausted = True
                return
            except Exception as exc:  # the taskset's own load(): a download offline, bad data
                raise TasksetLoadError(
                    f"{self._task}: taskset {self.id!r} could not load its tasks "
                    f"(task {self._read}): {type(exc).__name__}: {one_line(exc)}"
                ) from exc
            self._read += 1
            if in_split(f"{self.id}:{found.key}", self.split, self.seed):
                self._tasks.append(found)
