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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agentrl.environments._guard import reward_problem
from agentrl.environments._protocol import EnvError, Environment, Start, Status, Step, reward_range
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
    """One line per failed or unrunnable instance, with the reason (partial rewards aside)."""
    partial: list[float] = field(default_factory=list)
    """Rewards strictly between 0 and 1 of completed episodes: summarised, not listed."""
    violations: list[str] = field(default_factory=list)
    """Broken contract, one line each: a call that raised, a wrong type, a reward that is
    not a finite number in the task's range, a slow call (`agentrl-env check` exits 2)."""

    @property
    def success_rate(self) -> float:
        return self.successes / self.instances if self.instances else 0.0

    def format(self) -> str:
        lines = [
            f"task {self.task}, agent {self.agent}: {self.successes}/{self.instances} "
            f"succeeded ({self.success_rate:.3f})"
        ]
        if self.partial:
            lines.append(
                f"  partial rewards: {len(self.partial)} instance(s), mean "
                f"{sum(self.partial) / len(self.partial):.3f}, min {min(self.partial):g}, "
                f"max {max(self.partial):g}"
            )
        lines += [f"  contract: {line}" for line in self.violations[:SHOWN]]
        if len(self.violations) > SHOWN:
            lines.append(f"  contract: ... and {len(self.violations) - SHOWN} more")
        lines += [f"  {line}" for line in self.failures]
        return "\n".join(lines)


SHOWN = 20
"""Contract violations listed in `CheckReport.format`; the rest are counted."""
SLOW_CALL = 10.0
"""Seconds after which one ``start`` or ``interact`` call is reported as slow."""


def check(
    task: str, env: Environment, agent: str, *, seed: int = 0, slow: float = SLOW_CALL
) -> CheckReport:
    """Play every instance of ``env`` with the ``agent`` script; see the module doc. A task
    call that raises (other than `EnvError` at start, the task's word on a bad item),
    returns the wrong type, a reward that is not a finite number in the task's
    `reward_range`, or takes longer than ``slow`` seconds is a contract violation
    (`CheckReport.violations`), never an exception out of here."""
    scripts = scripts_for(task, env)
    if agent not in AGENTS:
        raise ValueError(f"agent must be one of {', '.join(AGENTS)}, got {agent!r}")
    rng = random.Random(seed)
    report = CheckReport(task=task, agent=agent)
    bounds = reward_range(env)
    for index in range(env.num_instances):
        report.instances += 1
        try:
            start = _timed(
                report, slow, f"instance {index}: start", lambda index=index: env.start(index)
            )
        except (ItemError, EnvError) as exc:
            report.failures.append(f"instance {index}: cannot start: {exc}")
            continue
        except Exception as exc:  # the task's code broke: a violation, named, not raised
            report.violations.append(f"instance {index}: start raised {_named(exc)}")
            continue
        if not isinstance(start, Start):
            report.violations.append(
                f"instance {index}: start returned {type(start).__name__}, not Start"
            )
            continue
        calls = (teacher_of(scripts) if agent == "teacher" else scripts[agent])(env, index, rng)
        outcome = _play(env, index, start, calls, report, slow)
        if outcome is None:
            continue
        status, reward, transcript = outcome
        problem = reward_problem(reward, bounds)
        if problem is not None:
            report.violations.append(f"instance {index}: {problem}")
        elif status == Status.COMPLETED and reward >= 1.0:
            report.successes += 1
        elif status == Status.COMPLETED and reward > 0.0:
            report.partial.append(float(reward))
        else:
            what = _describe(env, index)
            report.failures.append(
                f"instance {index}{what}: {status.value}, reward {reward:g}; "
                + " ".join(transcript)[:400]
            )
    return report


def _play(env, index, start, calls, report, slow):
    """Drive one scripted episode; ``(status, reward, transcript)``, or None after a
    violation (reported)."""
    status, reward, transcript = Status.RUNNING, 0.0, []
    for n, call in enumerate(calls):
        where = f"instance {index}, turn {n}"
        try:
            step = _timed(
                report, slow, f"{where}: interact",
                lambda call=call: env.interact(start.session, agent_message(call)),
            )  # fmt: skip
        except Exception as exc:  # the script is the oracle's: any exception is the task's
            report.violations.append(f"{where}: interact raised {_named(exc)}")
            _cancel(env, start, where, report)
            return None
        if not isinstance(step, Step) or not isinstance(step.status, Status):
            got = type(step).__name__ if not isinstance(step, Step) else repr(step.status)
            report.violations.append(f"{where}: interact returned {got}, not a Step with a Status")
            _cancel(env, start, where, report)
            return None
        said = repr(call) if isinstance(call, str) else _said(call)
        transcript.append(said)
        transcript += [f"-> {str(getattr(m, 'content', m))[:120]}" for m in step.messages]
        if step.finish:
            return step.status, step.reward, transcript
        if n > 50:
            report.violations.append(f"instance {index}: the {report.agent} script did not end it")
            break
    _cancel(env, start, f"instance {index}", report)
    return status, reward, transcript


def _timed(report: CheckReport, slow: float, what: str, fn):
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        took = time.monotonic() - t0
        if took > slow:
            report.violations.append(f"{what} took {took:.1f} s (more than {slow:g} s)")


def _cancel(env: Environment, start: Start, where: str, report: CheckReport) -> None:
    try:
        env.cancel(start.session)
    except Exception as exc:  # cancel must be quiet: name what it raised
        report.violations.append(f"{where}: cancel raised {_named(exc)}")


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


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
