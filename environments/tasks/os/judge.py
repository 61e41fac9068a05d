"""The ``os`` task's judge: an answer against ``evaluation.match``, or the check scripts
run in the session's machine (AgentBench's ``_evaluate_answer``, ``os_interaction/task.py``).

- ``match``: a string (compared after stripping) or ``{"answer": ..., "strip": bool}``
  (equal) or ``{"regex": ...}`` (found in the answer); no answer matches nothing.
- ``check``: the scripts run in turn as judges (`Sandbox.judge`: the interpreter by
  absolute path, a fixed ``PATH``, programs and libraries the agent cannot have
  changed). Each gets as arguments the answer (``str(answer)``: ``"None"`` without one)
  and the stdout of every script before it (AgentBench's ``execute_independent`` hands
  over stdout, not stderr). Success when every script exits 0.
- a null ``check`` entry stands for the example, whose output is the expected answer.
  AgentBench runs it after the episode, on the machine the agent changed: an agent that
  empties ``/root/docs`` and answers ``0`` is then right. Here `expected_answer` runs it
  as a judge once, when the item's ``init`` and ``start`` have run and before the
  agent's first action (the state the question is asked about), and the judge hands
  that stored output on. Whatever the agent does later cannot move it. What varies with
  time (processes an ``init`` started that end on their own) is read as the agent
  first finds it. The example runs on the live machine (a copy of a session with its
  processes cannot be made): its own writes stay, as they stay after AgentBench's run
  (AgentBench's ``data/7/bootstrap.json`` items 52 and 55 create the folders they
  count, the built-in item 4 makes its script executable), and the agent finds them.
"""

from __future__ import annotations

import re

import structlog

from agentrl.environments.tasks.os.items import OSItem
from agentrl.environments.tasks.os.sandbox import RunResult, Sandbox
from agentrl.environments.tasks.os.tools import passable

__all__ = ["expected_answer", "judge"]

log = structlog.get_logger(__name__)


def expected_answer(item: OSItem, sandbox: Sandbox, timeout: float) -> RunResult | None:
    """The example's run as a judge in ``sandbox`` now, for ``item``'s null check
    entries (module doc); None when its check has none."""
    if item.match is not None or all(script is not None for script in item.check):
        return None
    assert item.example is not None  # load_items refuses a null check without an example
    return sandbox.judge(item.example.judge_argv(), timeout)


def judge(
    item: OSItem,
    sandbox: Sandbox,
    answer: str | None,
    timeout: float,
    index: int,
    expected: RunResult | None = None,
) -> bool:
    """True when ``answer`` (None: no answer given) passes ``item``'s judge in ``sandbox``;
    each check script gets ``timeout`` seconds. ``expected`` is `expected_answer`'s
    result, taken before the agent acted (required when the check has a null entry).
    ``index`` names the instance in logs."""
    if item.match is not None:
        if answer is None:
            return False
        if item.match.strip:
            answer = answer.strip()
        if item.match.answer is not None:
            return answer == item.match.answer
        return re.search(item.match.regex or "", answer) is not None
    params = [str(answer)]
    for number, script in enumerate(item.check):
        if not all(passable(p) for p in params):  # e.g. an output with a NUL byte
            return False
        if script is None:  # the example, run before the agent's first action
            if expected is None:
                raise ValueError(f"os item {index}: a null check entry needs expected_answer")
            result = expected
        else:  # by absolute path, in the judge's view: nothing the agent wrote runs here
            result = sandbox.judge(script.judge_argv(*params), timeout)
        if result.timed_out:
            log.warning("os check script timed out", item=index, script=number)
        if result.exit_code != 0:
            log.debug(
                "os check script failed",
                item=index,
                script=number,
                exit_code=result.exit_code,
                stderr=result.errors[-300:],
            )
            return False
        params.append(result.output)  # stdout only, as AgentBench passes it on
    return True
