"""The agent's shell in the ``os`` task: what carries over from one command to the next.

AgentBench runs the item's ``start`` script and every ``bash_action`` in one
interactive shell, so a ``cd``, a variable (exported or not), a function or an
alias set by one is there for the next. Here each command is a fresh ``bash``
in the session's sandbox; `agent_script` wraps it so that it first restores the
state the previous one left (`STATE`) and saves its own on exit: the working
directory (``/root`` at first), every shell variable but bash's own
(`_SKIPPED`), functions and aliases. Shell options (``set -e``...) and the user
do not carry over (a ``su`` without a command ends with its command; docs/tasks.md).
"""

from __future__ import annotations

__all__ = ["STATE", "agent_script"]

STATE = "/run/agentrl/shell-state"
"""File in the sandbox holding the agent's shell state between commands."""

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
