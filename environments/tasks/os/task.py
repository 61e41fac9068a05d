"""The ``os`` task: do things on a Linux machine, or find answers on it (AgentBench OS).

Each instance is one item in AgentBench's os_interaction format (`tasks.os.items`):
``description``, ``create`` (``local``: the image; ``init``: scripts run before the
first message), ``start`` (typed into the agent's shell before the question),
``evaluation`` (``match`` or ``check``, and ``example``: a reference solution).

A session is a fresh sandbox (`tasks.os.sandbox`: bubblewrap on the host or a
container): each ``init`` script runs on its own (one that fails or runs over
``init_timeout`` raises `ItemError`, a `SampleError`: the episode ends ``task_error``
and is not trained on, as AgentBench gives up such a sample with status ``unknown``),
then the agent's shell opens (`tasks.os.shell`: by default AgentBench's one ``bash
--login`` on a terminal, `tasks.os.terminal`) and ``start`` runs in it (one still
running after ``timeout``: `ItemError` too), then the model gets AgentBench's system
prompt and question (`tasks.os.tools`). Tools (AgentBench's, ``configs/tasks/os.yaml``):

- ``bash_action(script)``: runs the script in the agent's shell; the observation is
  ``The output of the OS:`` and the output, cut to ``output_chars`` (800) with
  AgentBench's ``[truncated because the output is too long]``, or ``The output of the
  OS is empty.``. A command still running after ``timeout`` (30 s, AgentBench's
  ``execute_shell`` limit) ends the episode ``task_limit_reached`` with reward 0, as
  AgentBench's ``TimeoutError`` ends the sample (it records ``task_error``); with
  ``shell: fresh`` and ``timeout_ends: false`` the command is killed with what it
  started, the observation says so and the episode goes on. After the terminal's login
  shell itself ended (``exit``), a ``bash_action`` ends the episode
  ``agent_invalid_action`` (AgentBench's write to the closed stream raises).
- ``answer_action(answer)``: ends the episode with an answer.
- ``finish_action(thought)``: ends the episode; as AgentBench reads it, its
  ``thought`` is the answer the judge gets (``None`` when the call has no argument).

The judge (`tasks.os.judge`) compares the answer with ``match`` or runs the ``check``
scripts in the session's machine (the example a null ``check`` entry compares the answer
with runs at ``start``, before the agent's first action). Bad calls, as AgentBench's
``os_interaction/task.py`` answers them (the episode goes on): no tool call gets the
user message `NO_TOOL_CALL`; only the first call of a message runs; arguments that are
not JSON get a tool message with the JSON error; an unknown tool gets
`INVALID_FUNCTION`; a script or answer that is not a string, holds a NUL or a lone
surrogate, or is over `MAX_ARG` bytes gets a tool message saying so. A tool reads its
first argument when its own name is missing.
``max_turns`` (8) assistant messages without an end (or the level's own limit) ->
``task_limit_reached``, reward 0. A sandbox that breaks raises `SandboxError` (an
InfraError: the rollout retries the episode).

Options: ``data`` (a file, folder or glob, `tasks.os.items.data_files`; default: the
built-in set), ``scripts``, ``sandbox`` (``bwrap`` or ``docker``; default: docker when
it answers and has the image, else bwrap), ``image`` (``agentrl/os-sandbox``),
``images`` (item image -> local image; AgentBench's ``default``, ``packages``,
``ubuntu`` unmapped run in ``image``), ``shell`` (``terminal`` or ``fresh``),
``max_turns`` (8), ``timeout`` (30 s), ``timeout_ends`` (true), ``init_timeout`` and
``check_timeout`` (30 s, AgentBench's ``execute_command`` limit), ``output_chars``
(800), ``memory_mb`` (512), ``pids`` (256), ``disk_mb`` (256), ``cpus`` (1.0;
`tasks.os.sandbox.Limits`), ``split`` and ``seed`` (`tasks.toolkit.split`), ``levels``
(default ``[2]``: the data set; 0 and 1 are generated, `tasks.os.levels`, instance
``index`` playing ``levels[index % len(levels)]``) and ``generated`` (instances per
generated level without level 2). Metrics: ``env/turns``, ``env/commands``,
``env/timeouts``, ``env/bad_calls``, ``env/level``, ``env/success``.
"""

from __future__ import annotations

import copy
import json
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
    items_of_split,
    load_items,
)
from agentrl.environments.tasks.os.judge import expected_answer, judge
from agentrl.environments.tasks.os.levels import GENERATED_LEVELS, LEVEL_TURNS, make_level
from agentrl.environments.tasks.os.sandbox import (
    BACKENDS,
    DEFAULT_IMAGE,
    Limits,
    RunResult,
    Sandbox,
    choose_backend,
    open_sandbox,
)
from agentrl.environments.tasks.os.shell import SHELLS, AgentShell, FreshShell
from agentrl.environments.tasks.os.terminal import open_terminal
from agentrl.environments.tasks.os.tools import (
    INVALID_FUNCTION,
    NO_TOOL_CALL,
    QUESTION,
    SYSTEM_PROMPT,
    TOOLS,
    limit_notes,
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
from agentrl.environments.tasks.toolkit.split import check_split
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
    shell: AgentShell
    lock: threading.Lock = field(default_factory=threading.Lock)
    turns: int = 0
    commands: int = 0
    timeouts: int = 0
    bad_calls: int = 0
    max_turns: int = 8
    done: bool = False
    expected: RunResult | None = None
    """The example's output for a null check entry, taken before the first action."""


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
        shell: str = SHELLS[0],
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
        if shell not in SHELLS:
            raise ValueError(f"os: shell must be one of {', '.join(SHELLS)}, got {shell!r}")
        if shell == "terminal" and not timeout_ends:
            raise ValueError(
                "os: timeout_ends: false needs shell: fresh (a terminal's "
                "command cannot be stopped apart from its shell)"
            )
        self._split = check_split(split, "os")
        self._seed = seed
        self._levels = check_levels(levels, (*GENERATED_LEVELS, FULL_LEVEL), "os")
        items = load_items(data, scripts) if FULL_LEVEL in self._levels else []
        self._items = items_of_split(items, split, seed)
        if FULL_LEVEL in self._levels and not self._items:
            raise ValueError(f"os: the {split} split of the data holds no item")
        self._plan = LevelPlan(self._levels, FULL_LEVEL, len(self._items), generated)
        self._backend = sandbox
        self._image = image
        self._images = dict(images or {})
        self._max_turns = max_turns
        self._timeout = float(timeout)
        self._timeout_ends = bool(timeout_ends)
        self._shell = shell
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
        """Output of the latest ``bash_action`` on instance ``index``, not truncated (for
        scripted agents)."""
        with self._lock:
            return self._last_output.get(index, "")

    def start(self, index: int) -> Start:
        item = self.item(index)
        image = self._images.get(item.image or "", item.image or self._image)
        if image in AGENTBENCH_IMAGES:  # AgentBench's local-os/<name>, not mapped: ours
            image = self._image
        label = f"os-{index}-{uuid.uuid4().hex[:8]}"
        sandbox = open_sandbox(self.backend, image=image, limits=self._limits, label=label)
        shell: AgentShell | None = None
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
            shell = self._open_shell(sandbox)
            if item.start is not None:  # in the agent's shell, as AgentBench runs it
                started = shell.run(item.start.code, self._timeout)
                if started.timed_out or started.ended:  # AgentBench: status unknown
                    why = "ended the shell" if started.ended else f"ran over {self._timeout:g} s"
                    raise ItemError(f"item {index}: start {why}")
            expected = expected_answer(item, sandbox, self._check_timeout)
        except BaseException:
            if shell is not None:
                shell.close()
            sandbox.close()
            raise
        messages = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=QUESTION.format(description=item.description)),
        ]
        limit = min(self._max_turns, LEVEL_TURNS.get(item.level, self._max_turns))
        session = _Session(index, item, sandbox, shell, max_turns=limit, expected=expected)
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
            success = self._judge(session, None)
            return self._end(session, Status.COMPLETED, "finished", success=success)
        if not passable(value) or (call.name == "bash_action" and not value.strip()):
            session.bad_calls += 1
            return f"{call.name} needs its {key} as one text argument"
        if call.name == "bash_action":
            return self._bash(session, value)
        success = self._judge(session, value)
        why = "answered" if call.name == "answer_action" else "finished"
        return self._end(session, Status.COMPLETED, why, success=success)

    def _open_shell(self, sandbox: Sandbox) -> AgentShell:
        """The session's shell (the ``shell`` option, `tasks.os.shell`)."""
        return FreshShell(sandbox) if self._shell == "fresh" else open_terminal(sandbox)

    def _bash(self, session: _Session, script: str) -> Step | str:
        if session.shell.ended:  # AgentBench: writing to the closed stream raises
            return self._end(session, Status.AGENT_INVALID_ACTION, "the shell has ended")
        session.commands += 1
        result = session.shell.run(script, self._timeout)
        with self._lock:
            self._last_output[session.index] = result.text
        if result.timed_out:
            session.timeouts += 1
            if self._timeout_ends:  # AgentBench: execute_shell's TimeoutError ends the sample
                return self._end(session, Status.TASK_LIMIT_REACHED, "command timeout")
        killed = self._timeout if result.timed_out else None
        notes = limit_notes(result.text, self._limits)
        return observation(result.text, self._output_chars, killed, notes)

    def _judge(self, session: _Session, answer: str | None) -> bool:
        item, timeout = session.item, self._check_timeout
        return judge(item, session.sandbox, answer, timeout, session.index, session.expected)

    def cancel(self, session: _Session) -> None:
        with session.lock:
            self._close(session)

    def _close(self, session: _Session) -> None:
        if not session.done:
            session.done = True
            try:
                session.shell.close()
            finally:
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
