"""An OpenEnv environment as an agentrl task: ``openenv`` with ``url`` or ``app``.

OpenEnv (openenv-core 0.3.0) serves an environment as an HTTP server whose WebSocket
sessions take ``reset(seed=...)`` and ``step(action)`` and answer with an observation, a
reward and ``done``; the reward is the server's (an OpenEnv ``Rubric`` or the environment's
own code). agentrl plays it through OpenEnv's own client (``GenericEnvClient``, one
WebSocket session per episode) against a running server (``url``) or one it starts from the
environment's ASGI app (``app: package.server.app:app``, `server`).

**What maps to what.** Instance ``i``: a reset with seed ``n``, the ``i``-th integer whose
``openenv:<n>`` falls on the split (`tasks.toolkit.split.in_split`, a quarter to test), so
train and test reset with disjoint seeds; ``reset`` options are passed to every reset. The
opening: a system prompt (``system``) and the reset observation as JSON. The action: one
tool, ``tool`` (default ``step``), whose parameters are the server's action schema
(``/schema``) without OpenEnv's ``metadata`` field; each call is one ``step``, answered with
the observation as JSON. A message without a call is answered with a reminder and counts as
a bad call; an action the server refuses (its validation) is answered with the server's
error, a bad call, and the episode goes on.

**Reward and statuses.** ``done`` ends the episode ``completed`` with reward the server's
reward of the last step (``reward: last``, the default) or the sum over the episode
(``reward: sum``), clamped to [0, 1]; success is a reward of 1.0. ``max_turns`` (default
10) ends it ``task_limit_reached``, reward 0. A lost connection is an InfraError (the
rollout retries the episode); a reset the server refuses is a SampleError.

**The judge is the server's.** The model writes only the action's fields; the server
validates them against its own Action model, steps its environment and computes the
reward; the ``metadata`` field is not offered and dropped from a call.

**MCP environments** (RFC 003: the server's action is ``CallToolAction``): the tools are the
server's own, listed once with a ``list_tools`` step when the task is built; a call of one is
a ``call_tool`` step, answered with the tool's text, or ``error: <message>`` (a bad call)
when the server reports an error (unknown tool, arguments its validation refuses).

**Not supported:** a container image (``from_docker_image``) is not started by
this task: start the container and give its ``url``. ``app`` runs the server as a local
process without a sandbox: for environments that run no model-written code.
"""

from __future__ import annotations

import copy
import json
import math
import random
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import structlog

from agentrl.environments._protocol import InfraError, SampleError, Start, Status, Step
from agentrl.environments.tasks.openenv.actions import (
    action_tool,
    mcp_tools,
    observation_text,
    tool_result_text,
)
from agentrl.environments.tasks.openenv.library import load
from agentrl.environments.tasks.openenv.server import Server
from agentrl.environments.tasks.toolkit.episode import (
    after_turn,
    begin_turn,
    end_episode,
    no_tool_call,
)
from agentrl.environments.tasks.toolkit.split import check_split, in_split
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["CHECK_AGENTS", "OpenEnvTask", "openenv"]

log = structlog.get_logger(__name__)

REWARDS = ("last", "sum")
"""Values of the ``reward`` option."""

SYSTEM = (
    "You act in an environment. Each observation is JSON. Call {tool} with one "
    "action at a time until the episode ends."
)
REMINDER = "Call {tool} with your next action."
_MCP_ACTIONS = {"CallToolAction", "ListToolsAction", "Action"}
"""Action titles of an MCP environment (``deserialize_action`` routes MCP types for them)."""


def openenv(
    *,
    url: str | None = None,
    app: str | None = None,
    split: str = "train",
    seed: int = 0,
    size: int = 100,
    max_turns: int = 10,
    reward: str = "last",
    reset: dict[str, Any] | None = None,
    tool: str = "step",
    system: str | None = None,
    timeout: float = 60.0,
) -> OpenEnvTask:
    """The ``openenv`` task: ``size`` episodes of the OpenEnv server at ``url`` or started
    from ``app`` (``module:attribute`` of its ASGI app), on ``split``; ``timeout`` seconds
    for the server's start and for each of its answers."""
    return OpenEnvTask(
        url=url,
        app=app,
        split=split,
        seed=seed,
        size=size,
        max_turns=max_turns,
        reward=reward,
        reset=reset,
        tool=tool,
        system=system,
        timeout=timeout,
    )


@dataclass
class _Session:
    client: Any
    max_turns: int
    turns: int = 0
    bad_calls: int = 0
    steps: int = 0
    total: float = 0.0
    done: bool = False


class OpenEnvTask:
    """An OpenEnv server's episodes as an agentrl environment (module doc)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        app: str | None = None,
        split: str = "train",
        seed: int = 0,
        size: int = 100,
        max_turns: int = 10,
        reward: str = "last",
        reset: dict[str, Any] | None = None,
        tool: str = "step",
        system: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.name = "openenv"
        check_split(split, self.name)
        if not isinstance(size, int) or size < 1 or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"{self.name}: size and max_turns must be integers >= 1")
        if reward not in REWARDS:
            raise ValueError(f"{self.name}: reward must be one of {', '.join(REWARDS)}")
        if reset is not None and (not isinstance(reset, dict) or "seed" in reset):
            raise ValueError(f"{self.name}: reset must be a mapping without seed (use seed)")
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"{self.name}: timeout must be a number of seconds > 0")
        self._client_type, self._lost = load().GenericEnvClient, load().lost
        self.server = Server(url=url, app=app, start_timeout=float(timeout), task=self.name)
        weakref.finalize(self, self.server.close)  # a started server ends with its task
        action = self.server.schema.get("action") or {}
        self.split, self.seed, self.size, self.max_turns = split, seed, size, max_turns
        self.reward, self._reset, self._timeout = reward, dict(reset or {}), float(timeout)
        self.mcp = action.get("title") in _MCP_ACTIONS
        self._schemas = self._list_tools() if self.mcp else [action_tool(tool, action)]
        named = " or ".join(s["function"]["name"] for s in self._schemas)
        self._named = f"the {named} tool"
        self._system = system if system is not None else SYSTEM.format(tool=self._named)
        self._seeds: list[int] = []
        self._lock = threading.Lock()

    @property
    def tools(self) -> list[dict]:
        return copy.deepcopy(self._schemas)

    def _list_tools(self) -> list[dict]:
        """An MCP environment's tools: one ``list_tools`` step on a session of its own."""
        client = self._client_type(base_url=self.server.url, message_timeout_s=self._timeout)
        try:
            with client.sync() as session:
                listed = session.step({"type": "list_tools"}).observation.get("tools") or []
        except (RuntimeError, *self._lost) as exc:
            self.server.close()
            raise ValueError(f"{self.name}: list_tools failed on {self.server.url}: {exc}") from exc
        if not listed:
            self.server.close()
            raise ValueError(
                f"{self.name}: the MCP environment at {self.server.url} lists no tools"
            )
        return mcp_tools(listed)

    @property
    def num_instances(self) -> int:
        return self.size

    def reset_seed(self, index: int) -> int:
        """The seed instance ``index`` resets with (module doc); IndexError out of range."""
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name}: index {index} not in [0, {self.size})")
        with self._lock:
            n = self._seeds[-1] + 1 if self._seeds else 0
            while len(self._seeds) <= index:
                if in_split(f"openenv:{n}", self.split, self.seed):
                    self._seeds.append(n)
                n += 1
            return self._seeds[index]

    def describe(self, index: int) -> str:
        return f"(reset seed {self.reset_seed(index)})"

    def start(self, index: int) -> Start:
        seed = self.reset_seed(index)
        client = self._client_type(base_url=self.server.url, message_timeout_s=self._timeout)
        client = client.sync()
        try:
            client.connect()
            result = client.reset(seed=seed, **self._reset)
        except RuntimeError as exc:  # the server's refusal of the reset
            client.close()
            raise SampleError(f"{self.name}: reset with seed {seed} refused: {exc}") from exc
        except self._lost as exc:
            client.close()
            raise InfraError(f"{self.name}: {self.server.url} lost: {exc}") from exc
        messages = [
            ChatMessage("system", self._system),
            ChatMessage("user", observation_text(result.observation)),
        ]
        return Start(_Session(client, self.max_turns), messages)

    def interact(self, session: _Session, message: ChatMessage) -> Step:
        begin_turn(self.name, session)
        if not message.tool_calls:
            reminder = REMINDER.format(tool=self._named)
            return after_turn(session, [no_tool_call(session, reminder)], self._end)
        replies: list[ChatMessage] = []
        for call in message.tool_calls:
            action, problem = self._action(call)
            if action is None:
                session.bad_calls += 1
                replies.append(_reply(call, f"error: {problem}"))
                continue
            try:
                result = session.client.step(action)
            except RuntimeError as exc:  # the server refused the action (its validation)
                session.bad_calls += 1
                replies.append(_reply(call, f"error: {exc}"))
                continue
            except self._lost as exc:
                self._close(session)
                raise InfraError(f"{self.name}: {self.server.url} lost: {exc}") from exc
            session.steps += 1
            value = result.reward if isinstance(result.reward, int | float) else 0.0
            session.total += value
            shown = tool_result_text if self.mcp else observation_text
            text = shown(result.observation)
            session.bad_calls += text.startswith("error: ")
            replies.append(_reply(call, text))
            if result.done:
                return self._judge(session, float(value), replies)
        return after_turn(session, replies, self._end)

    def cancel(self, session: _Session) -> None:
        session.done = True
        self._close(session)

    def close(self) -> None:
        """Stop the server this task started (none for a URL)."""
        self.server.close()

    def _action(self, call: ToolCall) -> tuple[dict | None, str]:
        names = [s["function"]["name"] for s in self._schemas]
        if call.name not in names:
            return None, f"unknown tool {call.name!r}; call {' or '.join(names)}"
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return None, f"arguments are not JSON ({exc})"
        if not isinstance(arguments, dict):
            return None, "arguments must be a JSON object"
        if self.mcp:
            return {"type": "call_tool", "tool_name": call.name, "arguments": arguments}, ""
        arguments.pop("metadata", None)  # OpenEnv's own field: not the model's to set
        return arguments, ""

    def _judge(self, session: _Session, last: float, replies: list[ChatMessage]) -> Step:
        raw = last if self.reward == "last" else session.total
        if not math.isfinite(raw):
            log.warning("openenv reward is not finite", reward=raw)
            return self._end(session, Status.TASK_ERROR, f"reward {raw}", replies)
        score = min(max(raw, 0.0), 1.0)
        return self._end(session, Status.COMPLETED, "done", replies, score=score, raw=raw)

    def _end(
        self,
        session: _Session,
        status: Status,
        why: str,
        replies: list[ChatMessage],
        *,
        score: float | None = None,
        raw: float | None = None,
    ) -> Step:
        self._close(session)
        metrics = {
            "env/return": session.total,
            "env/steps": float(session.steps),
            "env/server_reward": raw or 0.0,
        }
        return end_episode(
            self.name,
            session,
            status,
            why,
            replies,
            level=0,
            success=score is not None and score >= 1.0,
            reward=score or 0.0,
            metrics=metrics,
        )

    def _close(self, session: _Session) -> None:
        try:
            session.client.close()
        except (RuntimeError, *self._lost) as exc:  # the session is over either way
            log.debug("openenv client close failed", error=repr(exc))


def _reply(call: ToolCall, text: str) -> ChatMessage:
    return ChatMessage("tool", text, tool_call_id=call.id, name=call.name)


def _random(env: OpenEnvTask, index: int, rng: random.Random):
    """One of the tools with a random value for each field (by JSON type), or prose."""
    while True:
        if rng.random() < 0.2:
            yield "Let me think."
            continue
        function = rng.choice(env.tools)["function"]
        properties = function["parameters"].get("properties", {})
        arguments = {name: _value(spec, rng) for name, spec in properties.items()}
        yield ToolCall(id="call_0", name=function["name"], arguments=json.dumps(arguments))


def _value(spec: dict, rng: random.Random) -> Any:
    kind = spec.get("type")
    if "enum" in spec:
        return rng.choice(spec["enum"])
    if kind == "integer":
        low, high = spec.get("minimum", 1), spec.get("maximum", 64)
        return rng.randint(int(low), int(high))
    if kind == "number":
        return rng.uniform(0, 100)
    if kind == "boolean":
        return rng.random() < 0.5
    return "x"


CHECK_AGENTS = {"random": _random}
"""The scripted agent for agentrl-env check --agent random (OpenEnv gives no reference
answer, so there is no oracle)."""
