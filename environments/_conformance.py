"""The Environment protocol as a contract, checked against any task: `conformance`.

`agentrl-env check --task NAME --agent random` runs it before the task's own scripted
agent (if it has one). Each rule below is one `Violation.rule`; the report lists each
violation once per rule and instance, in words a task author can act on:

- ``tools``: every schema is ``{"type": "function", "function": {name, description,
  parameters}}``, names unique, ``parameters`` an object schema whose ``required`` keys
  are among its ``properties`` (the environment's ``tools`` and each ``Start.tools``);
- ``num_instances``: an int >= 1;
- ``start``: returns a `Start` whose ``messages`` are a non-empty list of `ChatMessage`
  (roles system, user, assistant, tool) not ending with the assistant's turn; an index
  out of range (``-1``, ``num_instances``) raises IndexError;
- ``deterministic``: two starts of one instance open with the same messages and tools;
- ``step``: ``interact`` answers any assistant message (a random schema-valid call, prose,
  a malformed call, an unknown tool, wrong arguments: `_random_agent`) with a `Step`, never
  an exception; ``status`` a `Status` and ``finish`` exactly when it is not ``running``;
  ``agent_context_limit`` is the rollout's, never a task's;
- ``reward``: a finite float, 0.0 while running, in [0, 1] at the end; ``metrics`` a dict
  of str to finite float;
- ``ends``: an episode of random turns ends within ``max_turns`` (the task's own turn
  limit; the rollout's cap is a safety net, not the task's ending);
- ``closed``: ``interact`` after the end or after ``cancel`` raises SessionClosed;
  ``cancel`` twice, or after the end, is quiet;
- ``split``: where the factory takes ``split``, ``train`` and ``test`` both build, hold
  different instances (the first ``4 * instances`` of each compared by ``describe(index)``
  where the task has it, else by their opening messages), and a split outside
  ``train``/``test``/``all`` is refused.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from agentrl.environments._protocol import (
    EnvError,
    Environment,
    InfraError,
    SessionClosed,
    Start,
    Status,
    Step,
    UnknownTask,
    session_tools,
    tool_schema_problems,
)
from agentrl.environments._random_agent import random_turn
from agentrl.environments._registry import make_task
from agentrl.messages import ChatMessage

__all__ = ["ConformanceReport", "Violation", "conformance", "tool_schema_problems"]

_ROLES = {"system", "user", "assistant", "tool"}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule of the contract."""

    rule: str
    """The rule's name (``tools``, ``start``, ``step``, ..., see the module doc)."""
    detail: str
    """What was seen, with the instance and the turn where there is one."""


@dataclass
class ConformanceReport:
    """What `conformance` found: the violations, and how the random episodes ended."""

    task: str
    violations: list[Violation] = field(default_factory=list)
    episodes: int = 0
    """Random episodes played to their end."""
    successes: int = 0
    """Of those, episodes that ended ``completed`` with reward 1.0 (a random agent that
    succeeds often says the task is too easy or mis-judged)."""
    statuses: dict[str, int] = field(default_factory=dict)
    """How many random episodes ended with each status."""

    def add(self, rule: str, detail: str) -> None:
        violation = Violation(rule, detail)
        if violation not in self.violations:
            self.violations.append(violation)

    def format(self) -> str:
        ended = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        head = (
            f"task {self.task}, protocol contract: {len(self.violations)} violation(s); "
            f"random agent: {self.successes}/{self.episodes} succeeded ({ended or 'none ended'})"
        )
        lines, shown = [head], {}
        for v in self.violations:  # up to 3 lines per rule, then a count
            shown[v.rule] = shown.get(v.rule, 0) + 1
            if shown[v.rule] <= 3:
                lines.append(f"  {v.rule}: {v.detail}")
        lines += [f"  {rule}: ... and {n - 3} more" for rule, n in shown.items() if n > 3]
        return "\n".join(lines)


def conformance(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    env: Environment | None = None,
    instances: int = 5,
    episodes: int = 20,
    max_turns: int = 64,
    seed: int = 0,
) -> ConformanceReport:
    """Check task ``name`` (built with ``options``, or ``env`` when given) against the
    contract in the module doc: ``instances`` instances started, ``episodes`` random
    episodes of at most ``max_turns`` turns. InfraError propagates (the environment broke:
    not a protocol matter); a factory that refuses its options raises what it raises."""
    options = dict(options or {})
    env = env if env is not None else make_task(name, **options)
    report = ConformanceReport(task=name)
    rng = random.Random(seed)
    for problem in tool_schema_problems(env.tools):
        report.add("tools", f"environment tools: {problem}")
    count = env.num_instances
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        report.add("num_instances", f"must be an int >= 1, got {count!r}")
        return report
    picks = sorted({0, count - 1, *(rng.randrange(count) for _ in range(instances - 2))})
    for index in picks[:instances]:
        _check_start(env, index, report)
    for bad in (-1, count):
        try:
            env.cancel(env.start(bad).session)
            report.add("start", f"start({bad}) with {count} instances did not raise IndexError")
        except IndexError:
            pass
        except Exception as exc:  # the contract says IndexError; report what came instead
            report.add("start", f"start({bad}) raised {type(exc).__name__}, not IndexError")
    for n in range(episodes):
        if n == 0:  # one episode cancelled at its start: interact must then refuse it
            start = _start(env, rng.randrange(count), report)
            if start is not None:
                env.cancel(start.session)
                _check_closed(env, start, "a cancelled session", report)
        _play(env, rng.randrange(count), rng, max_turns, report)
    _check_split(name, options, instances, report)
    return report


def _check_start(env: Environment, index: int, report: ConformanceReport) -> None:
    first = _start(env, index, report)
    if first is None:
        return
    second = _start(env, index, report)
    for start in (first, second):
        if start is not None:
            env.cancel(start.session)
    if second is not None and _opening(env, first) != _opening(env, second):
        report.add("deterministic", f"instance {index}: two starts open differently")


def _start(env: Environment, index: int, report: ConformanceReport) -> Start | None:
    """``env.start(index)``, with its violations reported; None when it is unusable."""
    try:
        start = env.start(index)
    except (InfraError, SessionClosed):
        raise
    except EnvError as exc:  # SampleError and kin: the task's own word on a bad instance
        report.add("start", f"instance {index}: {type(exc).__name__}: {exc}")
        return None
    except Exception as exc:  # the task's code broke: a violation, named, never a traceback
        report.add("start", f"instance {index}: start raised {type(exc).__name__}: {exc}"[:300])
        return None
    if not isinstance(start, Start):
        report.add("start", f"instance {index}: returned {type(start).__name__}, not Start")
        return None
    messages = start.messages
    if not isinstance(messages, list) or not messages:
        report.add("start", f"instance {index}: messages must be a non-empty list")
    elif not all(isinstance(m, ChatMessage) and m.role in _ROLES for m in messages):
        report.add("start", f"instance {index}: messages must be ChatMessages of roles {_ROLES}")
    elif messages[-1].role == "assistant":
        report.add("start", f"instance {index}: the opening ends with the assistant's turn")
    if start.tools is not None:
        for problem in tool_schema_problems(start.tools):
            report.add("tools", f"instance {index} (Start.tools): {problem}")
    return start


def _opening(env: Environment, start: Start) -> tuple:
    return (repr(start.messages), repr(session_tools(env, start)))


def _play(
    env: Environment, index: int, rng: random.Random, max_turns: int, report: ConformanceReport
) -> None:
    start = _start(env, index, report)
    if start is None:
        return
    tools = [t for t in session_tools(env, start) if not tool_schema_problems([t])]
    for turn in range(max_turns):
        kind, message = random_turn(tools, rng, turn)
        where = f"instance {index}, turn {turn} ({kind})"
        try:
            step = env.interact(start.session, message)
        except InfraError:
            raise
        except Exception as exc:  # a model output must never raise: report what did
            report.add("step", f"{where}: interact raised {type(exc).__name__}: {exc}"[:300])
            env.cancel(start.session)
            return
        if not _check_step(step, where, report):
            env.cancel(start.session)
            return
        if step.finish:
            report.episodes += 1
            report.statuses[step.status.value] = report.statuses.get(step.status.value, 0) + 1
            report.successes += step.status == Status.COMPLETED and step.reward >= 1.0
            _check_closed(env, start, where, report)
            return
    report.add("ends", f"instance {index}: no end after {max_turns} random turns")
    env.cancel(start.session)
    _check_closed(env, start, f"instance {index}, cancelled", report)


def _check_step(step: Any, where: str, report: ConformanceReport) -> bool:
    """Report what is wrong with ``step``; False when it cannot be read further."""
    if not isinstance(step, Step):
        report.add("step", f"{where}: interact returned {type(step).__name__}, not Step")
        return False
    if not isinstance(step.status, Status):
        report.add("step", f"{where}: status {step.status!r} is not a Status")
        return False
    if not isinstance(step.messages, list) or not all(
        isinstance(m, ChatMessage) and m.role in _ROLES for m in step.messages
    ):
        report.add("step", f"{where}: messages must be a list of ChatMessages")
    if step.finish != (step.status != Status.RUNNING):
        report.add("step", f"{where}: finish={step.finish} with status {step.status.value}")
    if step.status == Status.AGENT_CONTEXT_LIMIT:
        report.add("step", f"{where}: agent_context_limit is set by the rollout, not a task")
    reward = step.reward
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        report.add("reward", f"{where}: reward {reward!r} is not a finite float")
    elif step.status == Status.RUNNING and reward != 0.0:
        report.add("reward", f"{where}: reward {reward:g} while running (must be 0.0)")
    elif not 0.0 <= reward <= 1.0:
        report.add("reward", f"{where}: reward {reward:g} outside [0, 1]")
    metrics = step.metrics
    if not isinstance(metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and math.isfinite(v)
        for k, v in metrics.items()
    ):
        report.add("reward", f"{where}: metrics must map names to finite floats: {metrics!r}"[:300])
    return step.finish == (step.status != Status.RUNNING)


def _check_closed(env: Environment, start: Start, where: str, report: ConformanceReport) -> None:
    """After the end (or a cancel): interact raises SessionClosed, cancel stays quiet."""
    message = ChatMessage("assistant", "one more turn")
    try:
        env.interact(start.session, message)
        report.add("closed", f"{where}: interact after the end returned (SessionClosed expected)")
    except SessionClosed:
        pass
    except Exception as exc:  # the contract names SessionClosed; say what came instead
        report.add(
            "closed", f"{where}: interact after the end raised {type(exc).__name__}, not "
            "SessionClosed",
        )  # fmt: skip
    try:
        env.cancel(start.session)
        env.cancel(start.session)
    except Exception as exc:  # cancel must be idempotent
        report.add("closed", f"{where}: cancel after the end raised {type(exc).__name__}: {exc}")


def _check_split(
    name: str, options: dict[str, Any], instances: int, report: ConformanceReport
) -> None:
    if "split" in options:
        return  # the user picked the split: the others may not build with these options
    envs = {}
    for split in ("train", "test"):
        try:
            envs[split] = make_task(name, **{**options, "split": split})
        except (TypeError, UnknownTask):  # no split option, or an env given without a name
            return
        except (EnvError, ValueError) as exc:
            report.add("split", f"split={split} does not build: {exc}")
            return
    try:
        make_task(name, **{**options, "split": "neither"})
        report.add("split", "split='neither' was accepted (train, test or all expected)")
    except (EnvError, ValueError, TypeError):
        pass
    seen: dict[str, int] = {}
    for split, env in envs.items():
        for index in range(min(instances * 4, env.num_instances)):
            key = _instance_key(env, index)
            if split == "train":
                seen[key] = index
            elif key in seen:
                same = f"test instance {index} is train instance {seen[key]}"
                report.add("split", f"{same}: {key[-120:]}")


def _instance_key(env: Environment, index: int) -> str:
    """What an instance is: its ``describe(index)`` where the task has one (a hidden state,
    such as a secret, is not in the opening), else its opening messages."""
    describe = getattr(env, "describe", None)
    if describe is not None:
        return str(describe(index))
    start = env.start(index)
    env.cancel(start.session)
    return repr([m.content for m in start.messages])
