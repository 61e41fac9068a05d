"""The ``os`` task: do things on a Linux machine, or find answers on it (AgentBench OS).

Each instance is one item in AgentBench's os_interaction format (read by
`agentrl.environments.tasks.os.items`): ``description`` (the request), ``create``
(``image``: the container image; ``init``: script(s) run before the first
message), ``start`` (a script run in the agent's shell before the question),
``evaluation`` with ``match`` or ``check``, and ``example`` (a reference
solution), ``labels``.

A session is a fresh sandbox (`agentrl.environments.tasks.os.sandbox`: bubblewrap on
the host or a container; nothing is shared between sessions): each ``init``
script runs in it on its own (one that fails or runs over ``init_timeout``
raises `ItemError`, a `SampleError`: the episode ends ``task_error`` and is not
trained on, as AgentBench gives up such a sample with status ``unknown``), then
``start`` runs in the agent's shell (`tasks.os.shell`: its working directory,
variables, functions and aliases carry over to the model's commands; one still running
after ``timeout`` raises `ItemError` too), then the
model gets AgentBench's system prompt and question (`tasks.os.tools`). Tools
(AgentBench's, ``configs/tasks/os.yaml``):

- ``bash_action(script)``: runs the script in the agent's shell (starts in
  ``/root``); the observation is ``The output of the OS:`` and the output
  (stdout and stderr), cut to ``output_chars`` (800) with AgentBench's
  ``[truncated because the output is too long]``, or ``The output of the OS is
  empty.``. A command still running after ``timeout`` (30 s, AgentBench's
  ``execute_shell`` limit) ends the episode ``task_limit_reached`` with reward 0, as
  AgentBench's ends the sample (it records ``task_error``); with ``timeout_ends:
  false`` the command is killed with what it started, the observation says so and the
  episode goes on. An error is an observation, not an ending.
- ``answer_action(answer)``: ends the episode with an answer.
- ``finish_action(thought)``: ends the episode (the task was to change the
  machine); as AgentBench reads it, its ``thought`` is the answer the judge gets
  (``None`` when the call has no argument).

Judging, as AgentBench does it:

- ``match``: a string (compared after stripping) or ``{"answer": ..., "strip":
  bool}`` (equal) or ``{"regex": ...}`` (found in the answer). ``finish`` gives
  no answer, which matches nothing.
- ``check``: a list of scripts run in turn in the session's sandbox, after the
  model's actions, as judges (`Sandbox.judge`: the interpreter by absolute path, a
  fixed ``PATH``, programs and libraries the agent cannot have changed). Each gets
  as arguments the answer (``str(answer)``: the thought after ``finish_action``,
  ``"None"`` without one) and the stdout of every script before it (AgentBench's
  ``execute_independent`` hands over stdout, not stderr); a null
  entry means "run the example here" (its output is typically the expected
  answer, compared by the next script). Success when every script exits 0.

The example is read from ``evaluation.example`` only (AgentBench ignores one
at the top level of an item).

Bad calls, as AgentBench's ``os_interaction/task.py`` answers them (the episode
goes on): a message with no tool call gets the user message `NO_TOOL_CALL`;
only the first call of a message runs; arguments that are not JSON get a tool
message with the JSON error; an unknown tool gets `INVALID_FUNCTION`; a script
or answer that is not a string, holds a NUL or a lone surrogate, or is over
`MAX_ARG` bytes gets a tool message saying so. A tool reads its first argument
when its own name is missing (as AgentBench does). The only other ending:
``max_turns`` (8, AgentBench's ``configs/tasks/os.yaml``) assistant messages
without an end (or the level's own limit) -> ``task_limit_reached``, reward 0.
A sandbox that breaks raises `SandboxError` (an InfraError: the rollout retries
the episode).

Options: ``data`` (a JSON/JSONL file; default: the built-in set under
``data/``), ``scripts`` (folder of ``{"file": ...}`` scripts), ``sandbox``
(``bwrap`` or ``docker``; default: docker when it answers and has the image,
else bwrap), ``image`` (default ``agentrl/os-sandbox``), ``images`` (item image
name -> local image; AgentBench's names ``default``, ``packages``, ``ubuntu``
unmapped run in ``image``), ``max_turns`` (8), ``timeout`` (30 s per command),
``timeout_ends`` (true), ``init_timeout`` and ``check_timeout`` (30 s, AgentBench's
``execute_command`` limit), ``output_chars`` (800),
``memory_mb`` (512), ``pids`` (256), ``disk_mb`` (256), ``cpus`` (1.0; the limits:
`agentrl.environments.tasks.os.sandbox.Limits`), ``split`` (``train``, ``test``, ``all``; the
items by a hash of their description and checks, `tasks.toolkit.split`) and ``seed``.

``levels`` (default ``[2]``, the data set only) mixes in the generated levels of
`tasks.os.levels` (0: read one named file; 1: count the lines of a file or the files
of a folder; 4 turns each): instance ``index`` plays ``levels[index %
len(levels)]`` (`tasks.toolkit.levels`), and ``generated`` sets how many instances per
generated level there are when level 2 is not among them. The sandbox, judge
and check agents run generated items like data items. Metrics: ``env/turns``,
``env/commands``, ``env/timeouts``, ``env/bad_calls``, ``env/level``,
``env/success``.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from agentrl.environments._protocol import Start, Status, Step
from agentrl.environments._toolcalls import tool_reply
from agentrl.environments.tasks.os.agents import CHECK_AGENTS
from agentrl.environments.tasks.os.items import (
    FULL_LEVEL,
    ItemError,
    OSItem,
    content_key,
    load_items,
)
from agentrl.environments.tasks.os.levels import GENERATED_LEVELS, LEVEL_TURNS, make_level
from agentrl.environments.tasks.os.sandbox import (
    BACKENDS,
    DEFAULT_IMAGE,
    Limits,
    Sandbox,
    choose_backend,
    open_sandbox,
)
from agentrl.environments.tasks.os.shell import agent_script
from agentrl.environments.tasks.os.tools import (
    INVALID_FUNCTION,
    NO_TOOL_CALL,
    QUESTION,
    SYSTEM_PROMPT,
    TOOLS,
    observation,
    passable,
)
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.levels import LevelPlan, check_levels, pick
from agentrl.environments.tasks.toolkit.split import check_split, split_items
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "OSTask", "observation"]

log = structlog.get_logger(__name__)


AGENTBENCH_IMAGES = ("default", "packages", "ubuntu")
"""AgentBench's image names (``create.local``; ``environment.py``); unmapped, they run
in the ``image`` option's image."""
_ARGUMENT = {"bash_action": "script", "answer_action": "answer", "finish_action": "thought"}
"""Each tool's argument (a call without it gives its first one, as AgentBench reads calls)."""


@dataclass(slots=True)
class _Session:
    index: int
    item: OSItem
    sandbox: Sandbox
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    commands: int = 0
    timeouts: int = 0
    bad_calls: int = 0
    max_turns: int = 8
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
        timeout: float = 30.0,
        timeout_ends: bool = True,
        init_timeout: float = 30.0,
        check_timeout: float = 30.0,
        output_chars: int = 800,
        memory_mb: int = 512,
        pids: int = 256,
        disk_mb: int = 256,
        cpus: float = 1.0,
        split: str = "train",
        seed: int = 0,
        levels: Sequence[int] = (FULL_LEVEL,),
        generated: int = 1000,
    ) -> None:
        if max_turns < 1 or timeout <= 0 or output_chars < 40 or generated < 1:
            raise ValueError(
                "os: max_turns >= 1, timeout > 0, output_chars >= 40 and generated >= 1 required"
            )
        if memory_mb < 32 or pids < 8 or disk_mb < 8 or cpus <= 0:
            raise ValueError("os: memory_mb >= 32, pids >= 8, disk_mb >= 8 and cpus > 0 required")
        if sandbox is not None and sandbox not in BACKENDS:
            raise ValueError(f"os: sandbox must be one of {', '.join(BACKENDS)}, got {sandbox!r}")
        self._split = check_split(split, "os")
        self._seed = seed
        self._levels = check_levels(levels, (*GENERATED_LEVELS, FULL_LEVEL), "os")
        items = load_items(data, scripts) if FULL_LEVEL in self._levels else []
        self._items = _split(items, split, seed)
        if FULL_LEVEL in self._levels and not self._items:
            raise ValueError(f"os: the {split} split of the data holds no item")
        self._plan = LevelPlan(self._levels, FULL_LEVEL, len(self._items), generated)
        self._backend = sandbox
        self._image = image
        self._images = dict(images or {})
        self._max_turns = max_turns
        self._timeout = float(timeout)
        self._timeout_ends = bool(timeout_ends)
        self._init_timeout = float(init_timeout)
        self._check_timeout = float(check_timeout)
        self._output_chars = output_chars
        self._limits = Limits(memory_mb=memory_mb, pids=pids, disk_mb=disk_mb, cpus=cpus)
        self._lock = threading.Lock()
        self._last_output: dict[int, str] = {}

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(TOOLS)

    @property
    def levels(self) -> tuple[int, ...]:
        """The ``levels`` option: instance ``index`` plays ``levels[index % len(levels)]``."""
        return tuple(self._levels)

    @property
    def num_instances(self) -> int:
        return self._plan.num_instances

    @property
    def backend(self) -> str:
        """The sandbox backend sessions use (chosen on first use when not given)."""
        with self._lock:
            if self._backend is None:
                self._backend = choose_backend(self._image)
                log.info("os sandbox backend", backend=self._backend)
            return self._backend

    def item(self, index: int) -> OSItem:
        """The item instance ``index`` plays (a data-set item or a generated one)."""
        return pick("os", self._plan, index, self._items, self._split, self._seed, make_level)

    def describe(self, index: int) -> str:
        item = self.item(index)
        where = f" ({item.source})" if item.source else ""
        return f"[{','.join(item.labels)}] {item.description[:80]!r}{where}"

    def last_output(self, index: int) -> str:
        """Raw output of the latest ``bash_action`` on instance ``index`` (for scripted agents)."""
        with self._lock:
            return self._last_output.get(index, "")

    def start(self, index: int) -> Start:
        item = self.item(index)
        image = self._images.get(item.image or "", item.image or self._image)
        if image in AGENTBENCH_IMAGES:  # AgentBench's local-os/<name>, not mapped: ours
            image = self._image
        label = f"os-{index}-{uuid.uuid4().hex[:8]}"
        sandbox = open_sandbox(self.backend, image=image, limits=self._limits, label=label)
        try:
            for number, script in enumerate(item.init):
                result = sandbox.exec(script.argv(), self._init_timeout)
                if result.timed_out:
                    raise ItemError(
                        f"item {index}: init script {number} ran over {self._init_timeout:g} s"
                    )
                if result.exit_code != 0:  # AgentBench: sample status unknown, not scored
                    raise ItemError(
                        f"item {index}: init script {number} failed (exit {result.exit_code}): "
                        f"{result.output[-300:]}"
                    )
            if item.start is not None:  # in the agent's shell, as AgentBench runs it
                started = sandbox.run(agent_script(item.start.code), self._timeout)
                if started.timed_out:  # AgentBench: the sample ends, status unknown
                    raise ItemError(f"item {index}: start ran over {self._timeout:g} s")
        except BaseException:
            sandbox.close()
            raise
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=QUESTION.format(description=item.description)),
        ]
        limit = min(self._max_turns, LEVEL_TURNS.get(item.level, self._max_turns))
        session = _Session(index, item, sandbox, max_turns=limit)
        return Start(session=session, messages=messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        with session.lock:
            begin_turn("os", session)
            try:
                return self._interact(session, message)
            except BaseException:
                self._close(session)
                raise

    def _interact(self, session: _Session, message: ChatMessage) -> Step:
        if not message.tool_calls:
            return after_turn(session, [no_tool_call(session, NO_TOOL_CALL)], self._end)
        call = message.tool_calls[0]  # AgentBench runs only the first call of a message
        reply = self._call(session, call)
        if isinstance(reply, Step):
            return reply
        return after_turn(session, [tool_reply(call, reply)], self._end)

    def _call(self, session: _Session, call: ToolCall) -> Step | str:
        """One call: its observation, AgentBench's reply to a bad one, or the last step."""
        try:
            args = json.loads(call.arguments)
        except ValueError as exc:
            session.bad_calls += 1
            return str(exc)
        if not isinstance(args, dict):
            session.bad_calls += 1
            return "the arguments are not a JSON object"
        if call.name not in _ARGUMENT:
            session.bad_calls += 1
            return INVALID_FUNCTION
        key = _ARGUMENT[call.name]
        value = args[key] if key in args else next(iter(args.values()), None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if call.name == "finish_action" and not args:  # AgentBench: no thought, answer None
            return self._end(session, Status.COMPLETED, "finished", success=self._judge(session))
        if not passable(value) or (call.name == "bash_action" and not value.strip()):
            session.bad_calls += 1
            return f"{call.name} needs its {key} as one text argument"
        if call.name == "bash_action":
            return self._bash(session, value)
        success = self._judge(session, value)
        why = "answered" if call.name == "answer_action" else "finished"
        return self._end(session, Status.COMPLETED, why, success=success)

    def _bash(self, session: _Session, script: str) -> Step | str:
        session.commands += 1
        result = session.sandbox.run(agent_script(script), self._timeout)
        with self._lock:
            self._last_output[session.index] = result.output
        if result.timed_out:
            session.timeouts += 1
            if self._timeout_ends:  # AgentBench: execute_shell's TimeoutError ends the sample
                return self._end(session, Status.TASK_LIMIT_REACHED, "command timeout")
        killed = self._timeout if result.timed_out else None
        return observation(result.output, self._output_chars, killed, self._notes(result.output))

    def _notes(self, output: str) -> list[str]:
        """A line per sandbox limit a command's output shows it hit."""
        notes = []
        if "No space left on device" in output or "Disk quota exceeded" in output:
            notes.append(f"the session's disk quota of {self._limits.disk_mb} MB is full")
        if "Resource temporarily unavailable" in output or "retry: fork" in output:
            notes.append(f"the session's limit of {self._limits.pids} processes was reached")
        if "File too large" in output:
            notes.append(f"a file may hold at most {self._limits.file_mb} MB")
        return notes

    def _judge(self, session: _Session, answer: str | None = None) -> bool:
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
            if not all(passable(p) for p in params):  # e.g. an output with a NUL byte
                return False
            script = script if script is not None else item.example
            assert script is not None  # load_items refuses a null check without an example
            # by absolute path, in the judge's view: nothing the agent wrote runs here
            result = session.sandbox.judge(script.judge_argv(*params), self._check_timeout)
            if result.timed_out:
                log.warning("os check script timed out", item=session.index, script=number)
            if result.exit_code != 0:
                log.debug(
                    "os check script failed",
                    item=session.index,
                    script=number,
                    exit_code=result.exit_code,
                    stderr=result.errors[-300:],
                )
                return False
            params.append(result.output)  # stdout only, as AgentBench passes it on
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
        metrics = {"env/commands": float(session.commands), "env/timeouts": float(session.timeouts)}
        return end_episode(
            "os",
            session,
            status,
            why,
            replies,
            level=session.item.level,
            success=success,
            metrics=metrics,
        )


def _split(items: list[OSItem], split: str, seed: int) -> list[OSItem]:
    """The items of ``split``; items with one `content_key` (a repeated item, one question
    of two images) share their side, so none is on both."""
    keys = [content_key(item) for item in items]
    distinct = list(dict.fromkeys(keys))
    side = set(split_items(distinct, distinct, split, seed))
    return [item for item, key in zip(items, keys, strict=True) if key in side]
