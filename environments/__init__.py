"""agentrl.environments: the Environment protocol, tool-call parsing, chat rendering, tasks.

Public API:

- :class:`Environment` protocol with :class:`Start`, :class:`Step`, :class:`Status`;
- errors :class:`EnvError` > :class:`InfraError`, :class:`SessionClosed`,
  :class:`UnknownTask`, :class:`TaskOptionsError`, :class:`MalformedToolCall`,
  :class:`SampleError`, :class:`ChatTemplateError`;
- :func:`parse_assistant` (tool calls out of sampled text);
- :class:`ChatFormat` (chat template -> token ids, incrementally);
- task registry :func:`make_task`, :func:`register_task`, :func:`task_names` (a task may
  also be an entry point of group ``agentrl.tasks`` or an import path ``pkg.mod:attr``).
"""

from agentrl.environments._chat import ChatFormat, ChatTemplateError
from agentrl.environments._locate import TaskImportError
from agentrl.environments._protocol import (
    EnvError,
    Environment,
    InfraError,
    MalformedToolCall,
    SampleError,
    SessionClosed,
    Start,
    Status,
    Step,
    TaskOptionsError,
    UnknownTask,
    session_tools,
)
from agentrl.environments._registry import (
    check_task,
    expand_task_name,
    make_task,
    register_task,
    task_names,
    task_problems,
)
from agentrl.environments._toolcalls import parse_assistant

parse_tool_calls = parse_assistant
"""Alias under the name docs/internals.md first used."""

__all__ = [
    "ChatFormat",
    "ChatTemplateError",
    "EnvError",
    "Environment",
    "InfraError",
    "MalformedToolCall",
    "SampleError",
    "SessionClosed",
    "Start",
    "Status",
    "Step",
    "TaskImportError",
    "TaskOptionsError",
    "UnknownTask",
    "check_task",
    "expand_task_name",
    "make_task",
    "parse_assistant",
    "parse_tool_calls",
    "register_task",
    "session_tools",
    "task_names",
    "task_problems",
]
