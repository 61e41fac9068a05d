"""Scripted agents that validate a task's data: ``agentrl-env check``.

`check(task, env, agent)` plays every instance of ``env`` with a scripted agent
through the ordinary Environment API (tool calls in, observations out) and
returns a `CheckReport`: the success rate and every failure with its reason.
Agents:

- ``oracle`` uses the item's gold answer (for ``db``: commits the label of a
  query, runs the gold SQL of a change then commits; for ``calculator``: one
  ``calculate`` then the true value). On correct data it succeeds everywhere, so
  each failure points at an item (or an environment bug).
- ``random`` answers with something plausible but uninformed (a value picked
  from the table, no change made, a random number): a task whose random agent
  succeeds often is too easy or mis-judged.
- ``teacher`` is what the model is shown: SFT data (`agentrl sft`, the warm start) and
  the ``demo`` option play it. A task offers one where its oracle acts in a way no model
  should learn (the os oracle wraps each command in output marks and byte escapes to read
  the exact stdout); elsewhere the teacher is the oracle (`teacher_of`).

A task module outside this file offers its agents as a module-level
``CHECK_AGENTS = {"oracle": fn, "random": fn}`` (each ``fn(env, index, rng)``
yields one step per assistant turn: a `ToolCall`, a list of calls made in one turn
(BFCL's parallel calls), or a text, an assistant message without a call, for tasks
answered in text such as ``kg``), and may give its
environment a ``describe(index) -> str`` shown beside each failure.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agentrl.environments._protocol import EnvError, Environment, Status
from agentrl.environments._toolcalls import call_arguments, call_text
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.environments.tasks.db.task import DBTask, ItemError
from agentrl.messages import ChatMessage, ToolCall

__all__ = [
    "AGENTS",
    "Actions",
    "AgentStep",
    "CheckReport",
    "agent_message",
    "check",
    "scripted_agents",
    "scripts_for",
    "step_text",
    "teacher_of",
]

AGENTS = ("oracle", "teacher", "random")

AgentStep = ToolCall | list[ToolCall] | str
"""One assistant turn of a scripted agent: a call, several calls at once, or a text."""
Actions = Iterator[AgentStep]
"""A scripted agent's steps for one episode, one per assistant turn."""


def agent_message(step: AgentStep) -> ChatMessage:
    """The assistant message of one scripted step (a text is a message without a call)."""
    if isinstance(step, str):
        return ChatMessage("assistant", step)
    return ChatMessage("assistant", "", [step] if isinstance(step, ToolCall) else list(step))


def step_text(step: AgentStep) -> str:
    """A scripted step as the model would write it: each call in the first form
    `parse_assistant` reads (``<tool_call>...</tool_call>``), one per line; a text as is.
    Raises ValueError for a call whose arguments are not a JSON object."""
    if isinstance(step, str):
        return step
    texts = []
    for call in [step] if isinstance(step, ToolCall) else step:
        arguments = call_arguments(call)
        if arguments is None:
            raise ValueError(f"call {call.name!r}: arguments are not a JSON object")
        texts.append(call_text(call.name, arguments))
    return "\n".join(texts)


@dataclass
class CheckReport:
    task: str
    agent: str
    instances: int = 0
    successes: int = 0
    failures: list[str] = field(default_factory=list)
    """One line per failed or unrunnable instance, with the reason."""

    @property
    def success_rate(self) -> float:
        return self.successes / self.instances if self.instances else 0.0

    def format(self) -> str:
        lines = [
            f"task {self.task}, agent {self.agent}: {self.successes}/{self.instances} "
            f"succeeded ({self.success_rate:.3f})"
        ]
        lines += [f"  {line}" for line in self.failures]
        return "\n".join(lines)


def check(task: str, env: Environment, agent: str, *, seed: int = 0) -> CheckReport:
    """Play every instance of ``env`` with the ``agent`` script; see the module doc."""
    scripts = scripts_for(task, env)
    if agent not in AGENTS:
        raise ValueError(f"agent must be one of {', '.join(AGENTS)}, got {agent!r}")
    rng = random.Random(seed)
    report = CheckReport(task=task, agent=agent)
    for index in range(env.num_instances):
        report.instances += 1
        try:
            start = env.start(index)
        except (ItemError, EnvError) as exc:
            report.failures.append(f"instance {index}: cannot start: {exc}")
            continue
        calls = (teacher_of(scripts) if agent == "teacher" else scripts[agent])(env, index, rng)
        status, reward, transcript = Status.RUNNING, 0.0, []
        for n, call in enumerate(calls):
            step = env.interact(start.session, agent_message(call))
            said = repr(call) if isinstance(call, str) else _said(call)
            transcript.append(said)
            transcript += [f"-> {m.content[:120]}" for m in step.messages]
            if step.finish:
                status, reward = step.status, step.reward
                break
            if n > 50:
                raise RuntimeError(f"{task} {agent}: script did not end instance {index}")
        else:
            env.cancel(start.session)
        if status == Status.COMPLETED and reward >= 1.0:
            report.successes += 1
        else:
            what = _describe(env, index)
            report.failures.append(
                f"instance {index}{what}: {status.value}, reward {reward:g}; "
                + " ".join(transcript)[:400]
            )
    return report


def scripts_for(task: str, env: Environment) -> dict[str, Callable[..., Actions]]:
    """The scripted agents of ``task`` (built in here, or its module's ``CHECK_AGENTS``)."""
    task_env = getattr(env, "inner", env)  # a wrapper (`_demo.DemoPrompt`) names its task
    module = sys.modules[type(task_env).__module__]
    scripts = _SCRIPTS.get(task) or getattr(module, "CHECK_AGENTS", None)
    if scripts is None:
        raise ValueError(f"no scripted agents for task {task!r}")
    return scripts


def teacher_of(scripts: dict[str, Callable[..., Actions]]) -> Callable[..., Actions] | None:
    """The agent whose episodes the model is shown: ``teacher`` where the task has one,
    else its ``oracle`` (None with neither)."""
    return scripts.get("teacher") or scripts.get("oracle")


def scripted_agents(task: str, env: Environment) -> dict[str, Callable[..., Actions]]:
    """The scripted agents ``task`` offers (`scripts_for`), empty when it has none."""
    try:
        return scripts_for(task, env)
    except ValueError:
        return {}


def _said(step: ToolCall | list[ToolCall]) -> str:
    calls = [step] if isinstance(step, ToolCall) else step
    return " ".join(f"{c.name}({c.arguments})" for c in calls)


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _describe(env: Environment, index: int) -> str:
    describe = getattr(env, "describe", None)
    return f" {describe(index)}" if describe is not None else ""


# --- db -----------------------------------------------------------------------------


def _db_oracle(env: DBTask, index: int, rng: random.Random) -> Actions:
    """Changes: the gold statements, then an empty commit. Queries: the gold query when the
    item has one (every generated level does), then the label, so that a demo or an SFT
    episode shows the answer coming from the table, never from nowhere."""
    item = env.item(index)
    if item.mutation:
        for sql in item.label:
            yield _call("execute_sql", query=sql)
        yield _call("commit_final_answer", answers=[])
        return
    if item.query:
        yield _call("execute_sql", query=item.query)
    yield _call("commit_final_answer", answers=list(item.label))


def _db_random(env: DBTask, index: int, rng: random.Random) -> Actions:
    item = env.item(index)
    yield _call("execute_sql", query=f"SELECT * FROM `{item.table_name}` LIMIT 3")
    if item.mutation or not item.rows:
        yield _call("commit_final_answer", answers=[])
    else:
        row = rng.choice(item.rows)
        yield _call("commit_final_answer", answers=[str(rng.choice(row))])


# --- calculator -----------------------------------------------------------------------


def _calc_oracle(env: CalculatorTask, index: int, rng: random.Random) -> Actions:
    problem = env.problem(index)
    yield _call("calculate", expression=problem.expression)
    yield _call("answer", value=problem.value)


def _calc_random(env: CalculatorTask, index: int, rng: random.Random) -> Actions:
    yield _call("answer", value=rng.randint(-1000, 100_000))


_SCRIPTS: dict[str, dict[str, Callable[..., Actions]]] = {
    "db": {"oracle": _db_oracle, "random": _db_random},
    "calculator": {"oracle": _calc_oracle, "random": _calc_random},
}
