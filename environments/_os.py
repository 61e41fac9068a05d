"""The ``os`` task: do things on a Linux machine, or find answers on it (AgentBench OS).

Each instance is one item in AgentBench's os_interaction format (read by
`agentrl.environments._osdata`): ``description`` (the request), ``create``
(``image``: the container image; ``init``: script(s) run before the first
message), ``start`` (a script started in the background, left running),
``evaluation`` with ``match`` or ``check``, and ``example`` (a reference
solution), ``labels``.

A session is a fresh sandbox (`agentrl.environments._sandbox`: bubblewrap on
the host or a container; nothing is shared between sessions): ``init`` runs
in it, then ``start``, then the model gets the description. Tools:

- ``bash_action(script)``: runs the script in the sandbox (the working
  directory carries over between calls, as in AgentBench's shell; starts in
  ``/root``); the observation is ``The output of the OS:`` and the output
  (stdout and stderr), cut to ``output_chars`` (800) with AgentBench's
  ``[truncated because the output is too long]``, or ``The output of the OS is
  empty.``; a command over ``timeout`` seconds is killed and the observation
  says so. An error is an observation, not an ending.
- ``answer_action(answer)``: ends the episode with an answer.
- ``finish_action()``: ends the episode (the task was to change the machine).

Judging, as AgentBench does it:

- ``match``: a string (compared after stripping) or ``{"answer": ..., "strip":
  bool}`` (equal) or ``{"regex": ...}`` (found in the answer). ``finish`` gives
  no answer, which matches nothing.
- ``check``: a list of scripts run in turn in the session's sandbox, after the
  model's actions. Each gets as arguments the answer (``str(answer)``, so
  ``"None"`` after ``finish``) and the output of every script before it; a null
  entry means "run the example here" (its output is typically the expected
  answer, compared by the next script). Success when every script exits 0.

The example is read from ``evaluation.example`` only (AgentBench ignores one
at the top level of an item). Endings other than ``completed``: no tool call,
an unknown tool or bad arguments (a script or answer that is not a string,
holds a NUL or a lone surrogate, or is over `MAX_ARG` bytes) ->
``agent_invalid_action``; ``max_turns`` assistant messages without an end ->
``task_limit_reached``. An item whose ``init`` runs over ``init_timeout``
raises `ItemError`; a sandbox that breaks raises `SandboxError` (an
InfraError: the rollout retries the episode).

Options: ``data`` (a JSON/JSONL file; default: the built-in set under
``data/os/``), ``scripts`` (folder of ``{"file": ...}`` scripts), ``sandbox``
(``bwrap`` or ``docker``; default: docker when it answers and has the image,
else bwrap), ``image`` (default ``agentrl/os-sandbox``), ``images`` (item image
name -> local image), ``max_turns`` (8), ``timeout`` (10 s per command),
``init_timeout`` and ``check_timeout`` (60 s), ``output_chars`` (800),
``memory_mb`` (512), ``pids`` (256).
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog

from agentrl.environments._osdata import ItemError, OSItem, Script, load_items
from agentrl.environments._protocol import SessionClosed, Start, Status, Step
from agentrl.environments._sandbox import (
    BACKENDS,
    DEFAULT_IMAGE,
    Limits,
    Sandbox,
    choose_backend,
    open_sandbox,
)
from agentrl.environments._toolcalls import call_arguments, tool_reply
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "OSTask", "observation"]

log = structlog.get_logger(__name__)

TRUNCATED = "\n[truncated because the output is too long]"
MAX_ARG = 100_000
"""Longest script or answer, in UTF-8 bytes (it is passed as one argument)."""

SYSTEM_PROMPT = (
    "You act on a Linux (Debian) machine as root to do what the user asks or to answer "
    "their question. Run bash commands with bash_action (no interactive input; long "
    "outputs are truncated, so filter them). When you know the answer, call answer_action "
    "with only the answer; when the task was to change the machine and it is done, call "
    "finish_action."
)


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS: list[dict] = [
    _tool(
        "bash_action",
        "Run a bash script on the machine and see its output.",
        {
            "script": {
                "type": "string",
                "description": "The bash code.",
                "examples": ["ls -1 /etc | wc -l"],
            }
        },
        ["script"],
    ),
    _tool(
        "answer_action",
        "Give the answer to the question. This ends the task.",
        {"answer": {"type": "string", "description": "Only the answer.", "examples": ["220"]}},
        ["answer"],
    ),
    _tool("finish_action", "Say the requested change is done. This ends the task.", {}, []),
]

# The working directory carries over between bash_action calls.
_PROLOGUE = (
    'cd "$(cat /run/agentrl/cwd 2>/dev/null || echo /root)" 2>/dev/null\n'
    "trap 'pwd > /run/agentrl/cwd 2>/dev/null' EXIT\n"
)


def observation(output: str, limit: int, killed_after: float | None = None) -> str:
    """The model's view of a command's output (AgentBench's wording and truncation)."""
    if len(output) > limit:
        output = output[: max(limit - 20, 0)] + TRUNCATED
    text = f"The output of the OS:\n\n{output}" if output else "The output of the OS is empty."
    if killed_after is not None:
        text += f"\n[the command was killed: it ran over the {killed_after:g} s time limit]"
    return text


def _passable(text: object) -> bool:
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


@dataclass(slots=True)
class _Session:
    index: int
    item: OSItem
    sandbox: Sandbox
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    commands: int = 0
    timeouts: int = 0
    done: bool = False


class OSTask:
    """The OS environment (registered as ``os``); see the module doc."""

    def __init__(
        self,
        *,
        data: str | None = None,
        scripts: str | None = None,
        sandbox: str | None = None,
        image: str = DEFAULT_IMAGE,
        images: dict[str, str] | None = None,
        max_turns: int = 8,
        timeout: float = 10.0,
        init_timeout: float = 60.0,
        check_timeout: float = 60.0,
        output_chars: int = 800,
        memory_mb: int = 512,
        pids: int = 256,
    ) -> None:
        if max_turns < 1 or timeout <= 0 or output_chars < 40:
            raise ValueError("os: max_turns >= 1, timeout > 0 and output_chars >= 40 required")
        if sandbox is not None and sandbox not in BACKENDS:
            raise ValueError(f"os: sandbox must be one of {', '.join(BACKENDS)}, got {sandbox!r}")
        self._items = load_items(data, scripts)
        self._backend = sandbox
        self._image = image
        self._images = dict(images or {})
        self._max_turns = max_turns
        self._timeout = float(timeout)
        self._init_timeout = float(init_timeout)
        self._check_timeout = float(check_timeout)
        self._output_chars = output_chars
        self._limits = Limits(memory_mb=memory_mb, pids=pids)
        self._lock = threading.Lock()
        self._last_output: dict[int, str] = {}

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def num_instances(self) -> int:
        return len(self._items)

    @property
    def backend(self) -> str:
        """The sandbox backend sessions use (chosen on first use when not given)."""
        with self._lock:
            if self._backend is None:
                self._backend = choose_backend(self._image)
                log.info("os sandbox backend", backend=self._backend)
            return self._backend

    def item(self, index: int) -> OSItem:
        if not 0 <= index < len(self._items):
            raise IndexError(f"os: index {index} not in [0, {len(self._items)})")
        return self._items[index]

    def describe(self, index: int) -> str:
        item = self.item(index)
        return f"[{','.join(item.labels)}] {item.description[:80]!r}"

    def last_output(self, index: int) -> str:
        """Raw output of the latest ``bash_action`` on instance ``index`` (for scripted agents)."""
        with self._lock:
            return self._last_output.get(index, "")

    def start(self, index: int) -> Start:
        item = self.item(index)
        image = self._images.get(item.image, item.image) if item.image else self._image
        label = f"os-{index}-{uuid.uuid4().hex[:8]}"
        sandbox = open_sandbox(self.backend, image=image, limits=self._limits, label=label)
        try:
            for number, script in enumerate(item.init):
                result = sandbox.exec(script.argv(), self._init_timeout)
                if result.timed_out:
                    raise ItemError(
                        f"item {index}: init script {number} ran over {self._init_timeout:g} s"
                    )
                if result.exit_code != 0:  # AgentBench goes on too; worth a line in the log
                    log.info("os init script failed", item=index, code=result.exit_code)
            if item.start is not None:
                sandbox.start_background(item.start.code)
        except BaseException:
            sandbox.close()
            raise
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=item.description),
        ]
        return Start(session=_Session(index, item, sandbox), messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        with session.lock:
            if session.done:
                raise SessionClosed("os: interact on a session that has ended")
            try:
                return self._interact(session, message)
            except BaseException:
                self._close(session)
                raise

    def _interact(self, session: _Session, message: ChatMessage) -> Step:
        session.turns += 1
        if not message.tool_calls:
            return self._end(session, Status.AGENT_INVALID_ACTION, "no tool call")
        replies: list[ChatMessage] = []
        for call in message.tool_calls:
            args = call_arguments(call)
            if args is None:
                return self._end(session, Status.AGENT_INVALID_ACTION, "bad arguments", replies)
            if call.name == "bash_action":
                script = args.get("script")
                if not _passable(script) or not script.strip():
                    return self._end(session, Status.AGENT_INVALID_ACTION, "bad bash args", replies)
                replies.append(tool_reply(call, self._bash(session, script)))
            elif call.name == "answer_action":
                answer = args.get("answer")
                if isinstance(answer, int | float) and not isinstance(answer, bool):
                    answer = str(answer)
                if not _passable(answer):
                    why = "bad answer args"
                    return self._end(session, Status.AGENT_INVALID_ACTION, why, replies)
                success = self._judge(session, answer)
                return self._end(session, Status.COMPLETED, "answered", replies, success=success)
            elif call.name == "finish_action":
                success = self._judge(session, None)
                return self._end(session, Status.COMPLETED, "finished", replies, success=success)
            else:
                return self._end(session, Status.AGENT_INVALID_ACTION, "unknown tool", replies)
        if session.turns >= self._max_turns:
            return self._end(session, Status.TASK_LIMIT_REACHED, "max turns", replies)
        return Step(messages=replies, status=Status.RUNNING, reward=0.0, finish=False, metrics={})

    def _bash(self, session: _Session, script: str) -> str:
        session.commands += 1
        result = session.sandbox.run(_PROLOGUE + script, self._timeout)
        with self._lock:
            self._last_output[session.index] = result.output
        if result.timed_out:
            session.timeouts += 1
        killed = self._timeout if result.timed_out else None
        return observation(result.output, self._output_chars, killed)

    def _judge(self, session: _Session, answer: str | None) -> bool:
        item = session.item
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
            if not all(_passable(p) for p in params):  # e.g. an output with a NUL byte
                return False
            script = script if script is not None else item.example
            assert script is not None  # load_items refuses a null check without an example
            result = session.sandbox.exec(script.argv(*params), self._check_timeout)
            if result.timed_out:
                log.warning("os check script timed out", item=session.index, script=number)
            if result.exit_code != 0:
                return False
            params.append(result.output)
        return True

    def cancel(self, session: _Session) -> None:
        with session.lock:
            self._close(session)

    def _close(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            session.sandbox.close()

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage] | None = None,
        *,
        success: bool = False,
    ) -> Step:
        self._close(session)
        metrics = {
            "env/turns": float(session.turns),
            "env/commands": float(session.commands),
            "env/timeouts": float(session.timeouts),
            "env/success": float(success),
        }
        log.debug("os episode ended", status=status.value, why=why, **metrics)
        return Step.end(status, 1.0 if success else 0.0, metrics, replies)


# --- scripted agents for `agentrl-env check` -------------------------------------------


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=json.dumps(arguments))


def _oracle(env: OSTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    """Run the example, then answer with its output (stripped) or finish.

    A match item without an example is answered with its expected string.
    """
    item = env.item(index)
    example: Script | None = item.example
    if example is not None:
        yield _call("bash_action", script=example.as_bash())
    if not item.wants_answer:
        yield _call("finish_action")
    elif example is not None:
        yield _call("answer_action", answer=env.last_output(index).strip())
    else:
        yield _call("answer_action", answer=item.match.answer if item.match else "")


def _random(env: OSTask, index: int, rng: random.Random) -> Iterator[ToolCall]:
    yield _call("bash_action", script="ls")
    if env.item(index).wants_answer:
        yield _call("answer_action", answer="0")
    else:
        yield _call("finish_action")


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
