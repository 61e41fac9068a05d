"""verifiers environments as agentrl tasks: ``verifiers:<taskset id>``.

A verifiers 0.4.0 environment is a taskset package (``vf.Taskset`` of ``vf.Task``s, each
with a prompt, ``@vf.reward``/``@vf.metric`` scoring, ``@vf.stop`` hooks and ``vf.Toolset``
tool servers) and, for multi-turn play, the package's ``vf.Env`` whose ``run()`` answers the
model's replies (`items`). agentrl plays each task through the Env's own ``run()`` with its
model in the agent's seat (`seat`, `episode`); nothing of the environment is re-implemented.

**What maps to what.** Instance ``i``: the split's ``i``-th task of ``taskset.load()``
(`items`). Opening messages: the task's ``system_prompt`` and ``prompt``. Tools: the
taskset's and task's toolsets, ``<server>_<tool>``. A reply without a tool call ends the
agent's segment: a plain taskset (``SingleAgentEnv``) is then scored; a multi-turn Env's
``run()`` answers it with its next user turn (a RUNNING step) or ends the episode.

**Reward and statuses.** The episode ends ``completed`` with reward verifiers' own
``trace.reward`` (the weighted sum of the task's rewards and what the Env recorded),
clamped to [0, 1]; success (``env/success``) is a reward of 1.0. The turn limit
(``max_turns``: the option, else the seat's own ``max_turns``, else 10) ends it
``task_limit_reached``, *scored* as verifiers scores a truncated trace. A verifiers error
(setup, ``run()``, scoring raising) is ``task_error``, reward 0, logged; a task that cannot
be opened (its setup raising, a feature agentrl does not play) is a SampleError.

**Not supported** (refused in one line): Envs with more than one seat, task types that need
a container (``NEEDS_CONTAINER``: a sandbox runtime), ``@vf.intercept`` hooks and
``@vf.stop`` hooks on a Request or Response. Task hooks get ``runtime=None``: a reward that
requires a runtime is skipped by verifiers' own ``Task.score`` (it logs the names).

**Oracle.** The task data's ``answer`` field, said as the reply (``CHECK_AGENTS``), for
tasksets whose data has one.

Metrics on the finishing step: ``env/turns``, ``env/bad_calls`` (tool calls answered with
an error), ``env/level`` (0), ``env/success``, ``env/vf_reward`` (``trace.reward`` before
the clamp), ``env/reward/<name>`` (each reward's score) and ``env/metric/<name>`` (each
``@vf.metric``), finite values only.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import SampleError, Start, Status, Step
from agentrl.environments.tasks.toolkit.episode import begin_turn, end_episode
from agentrl.environments.tasks.toolkit.split import check_split
from agentrl.environments.tasks.verifiers.episode import Ended, Episode
from agentrl.environments.tasks.verifiers.items import TasksetSource
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "VerifiersTask", "verifiers"]

log = structlog.get_logger(__name__)

DEFAULT_MAX_TURNS = 10
"""The turn limit when neither the option nor the Env's seat sets one."""


def verifiers(
    *,
    taskset: str | None = None,
    config: dict[str, Any] | None = None,
    split: str = "train",
    seed: int = 0,
    size: int | None = None,
    max_turns: int | None = None,
    timeout: float = 300.0,
) -> VerifiersTask:
    """The ``verifiers`` task: the tasks of verifiers taskset ``taskset``
    (``verifiers:<taskset>`` in task lists) built with ``config`` (fields of the taskset's
    config class) on ``split``, at most ``size`` of them; ``timeout`` seconds for the
    environment's own work between two model messages."""
    return VerifiersTask(
        taskset,
        config=config,
        split=split,
        seed=seed,
        size=size,
        max_turns=max_turns,
        timeout=timeout,
    )


verifiers.variant_option = "taskset"  # type: ignore[attr-defined]  # verifiers:<taskset>


@dataclass
class _Session:
    episode: Episode
    max_turns: int
    turns: int = 0
    bad_calls: int = 0
    done: bool = False


class VerifiersTask:
    """A verifiers taskset's tasks as an agentrl environment (module doc)."""

    def __init__(
        self,
        taskset: str | None,
        *,
        config: dict[str, Any] | None = None,
        split: str = "train",
        seed: int = 0,
        size: int | None = None,
        max_turns: int | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.name = f"verifiers:{taskset}"
        if not taskset:
            raise ValueError("verifiers: name a taskset, verifiers:<taskset id>")
        check_split(split, self.name)
        for option, value in (("size", size), ("max_turns", max_turns)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{self.name}: {option} must be an integer >= 1, got {value!r}")
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"{self.name}: timeout must be a number of seconds > 0")
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"{self.name}: config must be a mapping of the taskset's fields")
        self.split, self.seed, self._timeout = split, seed, float(timeout)
        self.source = TasksetSource(
            taskset, dict(config or {}), split=split, seed=seed, size=size, task=self.name
        )
        self.max_turns = max_turns or self.source.seat.max_turns or DEFAULT_MAX_TURNS
        self._count = self.source.count()
        if self._count < 1:
            raise ValueError(f"{self.name}: the taskset has no {split} task")

    @property
    def tools(self) -> list[dict]:
        return []  # each task's own, in its Start (verifiers builds toolsets per task)

    @property
    def num_instances(self) -> int:
        return self._count

    def task(self, index: int) -> Any:
        """Instance ``index``'s ``vf.Task``; IndexError out of range."""
        if not 0 <= index < self._count:
            raise IndexError(f"{self.name}: index {index} not in [0, {self._count})")
        return self.source.task(index)

    def describe(self, index: int) -> str:
        """The task's name (or prompt start) and its key: equal tasks, equal descriptions."""
        task = self.task(index)
        label = task.data.name or task.data.prompt_text[:60]
        return f"({label!r} key {task.key[:12]})"

    def start(self, index: int) -> Start:
        task = self.task(index)
        episode = Episode(self.source, task, max_turns=self.max_turns, timeout=self._timeout)
        opened = episode.open()
        if isinstance(opened, Ended):
            why = opened.unsupported or opened.error or "its Env ended it before the model spoke"
            if opened.unsupported:
                why = f"uses {why}, which agentrl does not play"
            raise SampleError(f"{self.name}: instance {index} cannot start: {why}")
        tools = episode.tools()
        return Start(_Session(episode, self.max_turns), opened.messages, tools=tools)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn(self.name, session)
        outcome = session.episode.reply(message)
        if not isinstance(outcome, Ended):
            return Step(outcome.messages, Status.RUNNING, 0.0, False)
        session.bad_calls = outcome.bad_calls
        if outcome.error or outcome.unsupported:
            why = outcome.error or f"uses {outcome.unsupported}"
            return self._end(session, Status.TASK_ERROR, why, outcome.messages, None, [])
        traces = outcome.traces
        raw = sum(t.reward for t in traces)
        if not math.isfinite(raw):
            log.warning("verifiers reward is not finite", task=self.name, reward=raw)
            why = f"reward {raw}"
            return self._end(session, Status.TASK_ERROR, why, outcome.messages, None, [])
        limited = any(t.stop_condition == "max_turns" for t in traces)
        status = Status.TASK_LIMIT_REACHED if limited else Status.COMPLETED
        why = ", ".join(str(t.stop_condition) for t in traces)
        return self._end(session, status, why, outcome.messages, raw, traces)

    def cancel(self, session: _Session) -> None:
        session.done = True
        session.episode.cancel()

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage],
        raw: float | None,
        traces: list[Any],
    ) -> Step:
        reward = min(max(raw or 0.0, 0.0), 1.0)
        metrics = {"env/vf_reward": raw or 0.0}
        for trace in traces:
            for name, value in trace.rewards.items():
                if value is not None and math.isfinite(value.score):
                    metrics[f"env/reward/{name}"] = float(value.score)
            for name, value in trace.metrics.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    metrics[f"env/metric/{name}"] = float(value)
        return end_episode(
            self.name,
            session,
            status,
            why,
            replies,
            level=0,
            success=status == Status.COMPLETED and reward >= 1.0,
            reward=reward,
            metrics=metrics,
        )


def _oracle(env: VerifiersTask, index: int, rng: random.Random):
    """The task data's ``answer``, said as the reply (every turn, for a multi-turn Env)."""
    data = env.task(index).data
    answer = getattr(data, "answer", None)
    if answer is None:
        raise ValueError(f"{env.name}: the task data has no answer field for the oracle")
    text = answer if isinstance(answer, str) else json.dumps(answer)
    while True:
        yield text


def _random(env: VerifiersTask, index: int, rng: random.Random):
    """Prose, a random number, or a call of an unknown tool."""
    while True:
        roll = rng.random()
        if roll < 0.2:
            yield "I am not sure."
        elif roll < 0.3:
            yield ToolCall(id="call_0", name="no_such_tool", arguments="{}")
        else:
            yield str(rng.randint(-20, 200))


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
"""Scripted agents for agentrl-env check (--agent oracle|random), the demo option and SFT."""
