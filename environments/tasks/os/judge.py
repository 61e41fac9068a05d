"""The ``os`` task's judge: an answer against ``evaluation.match``, or the check scripts
run in the session's machine (AgentBench's ``_evaluate_answer``, ``os_interaction/task.py``).

- ``match``: a string (compared after stripping) or ``{"answer": ..., "strip": bool}``
  (equal) or ``{"regex": ...}`` (found in the answer); no answer matches nothing.
- ``check``: the scripts run in turn as judges (`Sandbox.judge`: the interpreter by
  absolute path, a fixed ``PATH``, programs and libraries the agent cannot have
  changed). Each gets as arguments the answer (``str(answer)``: ``"None"`` without one)
  and the stdout of every script before it (AgentBench's ``execute_independent`` hands
  over stdout, not stderr); a null entry runs the example there. Success when every
  script exits 0.
"""

from __future__ import annotations

import re

import structlog

from agentrl.environments.tasks.os.items import OSItem
from agentrl.environments.tasks.os.sandbox import Sandbox
from agentrl.environments.tasks.os.tools import passable

__all__ = ["judge"]

log = structlog.get_logger(__name__)


def judge(item: OSItem, sandbox: Sandbox, answer: str | None, timeout: float, index: int) -> bool:
    """True when ``answer`` (None: no answer given) passes ``item``'s judge in ``sandbox``;
    each check script gets ``timeout`` seconds. ``index`` names the instance in logs."""
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
        script = script if script is not None else item.example
        assert script is not None  # load_items refuses a null check without an example
        # by absolute path, in the judge's view: nothing the agent wrote runs here
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
