"""The agent's shell in the ``os`` task: what its commands run in, and what they return.

Two kinds (the ``shell`` option, `SHELLS`):

- ``terminal`` (AgentBench's): one interactive ``bash --login`` on a terminal for the
  session (`tasks.os.terminal.Terminal`): the item's ``start`` and every ``bash_action``
  are typed into it, so everything carries over (the working directory, variables,
  shell options, the user after a ``su - jack``), and the output is what the terminal
  shows up to the next prompt;
- ``fresh``: each command a fresh ``bash`` in the session's sandbox, wrapped by
  `agent_script` so that it first restores the state the previous one left (`STATE`)
  and saves its own on exit: the working directory (``/root`` at first), every shell
  variable but bash's own (`_SKIPPED`), functions and aliases. Shell options (``set
  -e``...) and the user do not carry over (a ``su`` without a command ends with its
  command); its output is stdout and stderr as written, and a command over its time
  limit is killed with what it started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agentrl.environments.tasks.os.sandbox import Sandbox

__all__ = ["SHELLS", "STATE", "AgentShell", "FreshShell", "ShellOutput", "agent_script"]

SHELLS = ("terminal", "fresh")
"""The values of the ``shell`` option; the first is the default."""
STATE = "/run/agentrl/shell-state"
"""File in the sandbox holding the agent's shell state between commands (``fresh``)."""


@dataclass(frozen=True, slots=True)
class ShellOutput:
    """What one command gave back."""

    text: str
    """Its output as the model sees it (before truncation)."""
    timed_out: bool = False
    """True when it was still running at its time limit."""
    ended: bool = False
    """True when the shell itself ended with it (``exit`` in a terminal's login shell)."""


class AgentShell(Protocol):
    """Where the agent's commands run."""

    @property
    def ended(self) -> bool:
        """True once the shell itself has ended and takes no more commands."""
        ...

    def run(self, command: str, timeout: float) -> ShellOutput:
        """Run ``command``, waiting at most ``timeout`` seconds."""
        ...

    def close(self) -> None:
        """Release the shell (its processes die with the sandbox in any case)."""
        ...


class FreshShell:
    """The ``fresh`` shell: a new ``bash`` per command, its state restored (module doc)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def ended(self) -> bool:
        """Never: each command has a shell of its own."""
        return False

    def run(self, command: str, timeout: float) -> ShellOutput:
        result = self._sandbox.run(agent_script(command), timeout)
        return ShellOutput(result.output, timed_out=result.timed_out)

    def close(self) -> None:
        """Nothing of its own to release: each command ended with its call."""


_SKIPPED = (
    "BASH*|EUID|UID|PPID|SHELLOPTS|FUNCNAME|GROUPS|HISTCMD|LINENO|RANDOM|SECONDS|SRANDOM|"
    "EPOCHREALTIME|EPOCHSECONDS|PIPESTATUS|_|SHLVL|COMP_*|DIRSTACK|PWD|OPTIND|OPTARG|"
    "__agentrl_*"
)

_PROLOGUE = f"""shopt -s expand_aliases
__agentrl_save() {{
    {{
        printf 'cd -- %q\\n' "$PWD"
        for __agentrl_n in $(compgen -v); do
            case $__agentrl_n in {_SKIPPED}) continue ;; esac
            declare -p "$__agentrl_n" 2>/dev/null
        done
        declare -f
        alias -p
    }} > {STATE}.new 2>/dev/null && mv -f {STATE}.new {STATE}
}}
if [ -r {STATE} ]; then . {STATE} 2>/dev/null; else cd /root 2>/dev/null; fi
trap __agentrl_save EXIT
"""


def agent_script(script: str) -> str:
    """``script`` as a command of the agent's shell (state restored first, saved at exit)."""
    return _PROLOGUE + script
