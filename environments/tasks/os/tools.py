"""The ``os`` task's interface to the model: system prompt, tools, observations, bad-call texts.

The system prompt, the question's wording, the tools, the observation wording, the
truncation mark and the bad-call texts are AgentBench's (``os_interaction/task.py``,
``configs/tasks/os.yaml``); `tasks.os.task` describes the episode around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentrl.environments._toolcalls import function_tool

if TYPE_CHECKING:
    from agentrl.environments.tasks.os.sandbox import Limits

__all__ = [
    "INVALID_FUNCTION",
    "MAX_ARG",
    "NO_TOOL_CALL",
    "QUESTION",
    "SYSTEM_PROMPT",
    "TOOLS",
    "TRUNCATED",
    "limit_notes",
    "observation",
    "passable",
]

TRUNCATED = "\n[truncated because the output is too long]"
NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
"""User message answering a message without a tool call (AgentBench's text)."""
INVALID_FUNCTION = "Invalid function call. Please call a tool instead"
"""Tool message answering a call to an unknown tool (AgentBench's text)."""
MAX_ARG = 100_000
"""Longest script or answer, in UTF-8 bytes (it is passed as one argument)."""

SYSTEM_PROMPT = (
    "You are an assistant that will act like a person. I will play the role of a Linux "
    "(Ubuntu) operating system.\n"
    "Your goal is to implement the operations required by me or answer the questions "
    "proposed by me.\n"
    "For each of your turns, you should first think about what you should do, and then "
    "call exactly one of the provided tools according to the situation.\n"
    "If you think the output is too long, I will truncate it. The truncated output is not "
    "complete. You have to deal with the truncating problem by yourself.\n"
    "Attention, your bash code should not contain any input operation. Once again, you "
    "should use one tool in each turn, and should not respond without function calling.\n"
    "Note that if you think the task has been finished, or there is some message missing "
    "to completely complete the task, you should respond with calling the function "
    '"finish_action", as no additional information will be provided.\n'
    "Also, note that if you have gotten the answer to the question, you should call the "
    '"answer_action" tool instead of simply writing your answer in your response.\n'
    "Your answers should be exact and precise (for example, a single number), do not "
    "answer with full sentences or phrases.\n"
    "Always use a tool provided instead of simply responding with content."
)
"""AgentBench's system message (``os_interaction/task.py``, ``_inject_initial_messages``)."""
QUESTION = "Now, I will start a new problem in a new OS. My problem is:\n\n{description}"
"""The first user message: AgentBench's words around the item's description."""


TOOLS: list[dict] = [
    function_tool(
        "bash_action",
        "Execute bash code to perform an operation in the Linux environment.",
        {"script": {"type": "string", "description": "The bash script to be executed."}},
        ["script"],
    ),
    function_tool(
        "finish_action",
        "Indicate that the task has been finished or need some additional information to be "
        "finished.",
        {
            "thought": {
                "type": "string",
                "description": "The thought or reason indicating the task is finished.",
            }
        },
        ["thought"],
    ),
    function_tool(
        "answer_action",
        "Provide the answer to the question.",
        {"answer": {"type": "string", "description": "The answer to the question."}},
        ["answer"],
    ),
]
"""AgentBench's three tools (``configs/tasks/os.yaml``), in its order and words."""


def observation(
    output: str, limit: int, killed_after: float | None = None, notes: Sequence[str] = ()
) -> str:
    """The model's view of a command's output (AgentBench's wording and truncation), then
    a line per sandbox limit the command hit (``notes``)."""
    if len(output) > limit:
        output = output[: max(limit - 20, 0)] + TRUNCATED
    text = f"The output of the OS:\n\n{output}" if output else "The output of the OS is empty."
    if killed_after is not None:
        text += f"\n[the command was killed: it ran over the {killed_after:g} s time limit]"
    for note in notes:
        text += f"\n[{note}]"
    return text


def limit_notes(output: str, limits: Limits) -> list[str]:
    """A line per sandbox limit a command's output shows it hit (`observation`'s notes)."""
    notes = []
    if "No space left on device" in output or "Disk quota exceeded" in output:
        notes.append(f"the session's disk quota of {limits.disk_mb} MB is full")
    if "Resource temporarily unavailable" in output or "retry: fork" in output:
        notes.append(f"the session's limit of {limits.pids} processes was reached")
    if "File too large" in output:
        notes.append(f"a file may hold at most {limits.file_mb} MB")
    return notes


def passable(text: object) -> bool:
    """True when ``text`` can be a program argument in the sandbox.

    Not a string, a NUL byte, a lone surrogate (not UTF-8) or more than `MAX_ARG`
    bytes (the kernel's limit on one argument is 128 KiB) is the model's fault.
    """
    if not isinstance(text, str) or "\0" in text:
        return False
    try:
        return len(text.encode("utf-8")) <= MAX_ARG
    except UnicodeEncodeError:
        return False
