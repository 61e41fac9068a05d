"""agentrl's rollout in the seat of a verifiers agent: what an Env's ``run()`` plays with.

A verifiers 0.4.0 Env plays a task through ``agents.<seat>``: ``await agent.run(task)``
(one segment: the model answers the prompt, calling tools, until a reply without a tool
call; ``SingleAgentEnv``) or ``async with agent.interaction(task) as i`` then ``await
i.turn(message)`` per user turn (a game engine or scripted user answering each reply:
TextArena's Env, or any Env of one's own). `Seat` is that agent, with agentrl's model
behind it: each model call of the segment is handed to agentrl (`Rollout.ask`) and the
reply comes back as the next assistant message, in the place where verifiers' ``null``
harness would call the model through its interception server.

What verifiers does around a model call is done here the way its chat harness and rollout
do it (file and line as of verifiers 0.4.0):

- the trace: each reply is committed to the task's ``vf.Trace`` with
  ``graph.prepare_turn(trace, conversation, tools).commit(response)``, as the interception
  server does, so rewards read ``trace.last_reply``, ``trace.messages``, ``trace.state``...
- limits and stops (``session.RolloutSession.refused``): before each model call,
  ``max_turns`` ends the rollout with stop condition ``max_turns``, then each of the task's
  ``@vf.stop(trace)`` hooks may end it with its own name;
- tools (``harnesses/utils/core.py`` ``run_loop`` and ``mcp.connect_mcp``): the task's and
  taskset's ``vf.Toolset`` servers are built in-process (``MCPServer``, MCP's own argument
  validation), named ``<server>_<tool>``, and the model's calls are answered with the same
  error texts (invalid JSON, not an object, unknown tool, the tool's own error);
- the rollout's end (``rollout.Rollout.close``): the task's ``finalize`` then ``score``
  (its ``@vf.reward``/``@vf.metric`` hooks and plugged judges) on the finished trace.

Everything here runs on the environment's side: the model only supplies assistant messages;
the trace, tool results, state, stops and scores are verifiers' own code on them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentrl.environments.tasks.verifiers.library import load
from agentrl.messages import ChatMessage

__all__ = ["Rollout", "Seat", "Unsupported", "to_chat"]


class Unsupported(Exception):
    """Raised when a task uses a verifiers feature the seat cannot play (module doc)."""


Ask = Callable[[list[ChatMessage]], Any]
"""``await ask(new_messages)``: shows agentrl's model the messages, returns its reply."""


def to_chat(message: Any) -> ChatMessage:
    """A verifiers message as agentrl's `ChatMessage` (text content only)."""
    vf = load().vf
    text = vf.types.content_text(message.content) if message.content is not None else ""
    if message.role == "tool":
        return ChatMessage("tool", text, tool_call_id=message.tool_call_id, name=message.name)
    return ChatMessage(message.role, text)


def _to_vf(message: ChatMessage) -> Any:
    vf = load().vf
    calls = [vf.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls]
    return vf.AssistantMessage(content=message.content or None, tool_calls=calls or None)


class Rollout:
    """One task's rollout in the seat: its trace, tools, conversation and turns."""

    def __init__(self, task: Any, taskset: Any, seat_config: Any, max_turns: int, ask: Ask):
        m = load()
        self.task, self._taskset, self._ask, self.max_turns = task, taskset, ask, max_turns
        self.trace = m.vf.Trace(
            task=m.vf.TraceTask(
                type=type(task).__name__, data=task.data, key=task.key, hash=task.hash
            ),
            state=m.vf.state.state_cls(type(task))(),
            agent=m.vf.AgentInfo(config=seat_config),
        )
        self.conversation: list[Any] = []
        self.bad_calls = 0
        self._started = False
        self._servers: dict[str, tuple[Any, str]] = {}  # tool name -> (MCPServer, raw name)
        self._tools: list[Any] = []  # vf.Tool, for the trace
        self.schemas: list[dict] = []  # OpenAI function schemas, for agentrl
        self._stops: list[Callable] = []

    async def open(self) -> None:
        """The task's ``setup`` (no runtime), its stops and its tool servers."""
        m = load()
        if m.decorators.discover_decorated(self.task, "intercept"):
            raise Unsupported("@vf.intercept hooks (request and response rewrites)")
        for fn in self.task.hooks("stop"):
            if m.session.hook_boundary(fn, allow_trace=True) is not m.vf.Trace:
                raise Unsupported(f"@vf.stop {fn.__name__} on a Request or Response")
            self._stops.append(fn)
        await m.decorators.invoke(self.task.setup, {"trace": self.trace, "runtime": None})
        toolsets = [
            *[(t, False) for t in type(self._taskset).toolsets(self._taskset.config)],
            *[(t, True) for t in self.task.toolsets(self.task.config)],
        ]
        for toolset, per_task in toolsets:
            await self._serve(toolset, per_task)

    async def _serve(self, toolset: Any, per_task: bool) -> None:
        m = load()
        await toolset.setup()
        if per_task:
            await toolset.setup_task(self.task)
        server = m.MCPServer(toolset.server_name or type(toolset).__name__)
        for fn in m.decorators.discover_decorated(toolset, "tool"):
            server.add_tool(
                self._with_state(fn),
                name=getattr(fn, "tool_name", None) or fn.__name__,
                description=(fn.__doc__ or "").strip() or None,
            )
        for tool in await server.list_tools():
            prefix = toolset.server_name
            name = f"{prefix}_{tool.name}" if prefix else tool.name
            if name in self._servers:
                raise Unsupported(f"two tools named {name!r}")
            self._servers[name] = (server, tool.name)
            description, parameters = tool.description or "", tool.input_schema
            self._tools.append(m.vf.Tool(name=name, description=description, parameters=parameters))
            function = {"name": name, "description": description, "parameters": parameters}
            self.schemas.append({"type": "function", "function": function})

    def _with_state(self, fn: Callable) -> Callable:
        """``fn`` with this rollout's ``trace.state`` as the toolset's ``self.state``, as
        verifiers' state channel gives it (``mcp/server.py`` ``ServerBase._with_state``)."""
        call_state = load().mcp_server._call_state
        state = self.trace.state

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = call_state.set(state)
            try:
                result = fn(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result
            finally:
                call_state.reset(token)

        wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
        return wrapper

    async def segment(self, messages: list[Any] | None) -> Any:
        """One segment: the model answers (calling tools) until a reply without a tool
        call; a ``vf.Segment``, ``terminated`` when a limit or stop refused the call."""
        vf = load().vf
        new: list[Any] = []
        if not self._started:
            self._started = True
            data = self.task.data
            if data.system_prompt:
                new.append(vf.SystemMessage(content=data.system_prompt))
            if isinstance(data.prompt, str):
                new.append(vf.UserMessage(content=data.prompt))
            elif data.prompt:
                new.extend(data.prompt)
        new.extend(messages or [])
        first = len(self.trace.nodes)
        while True:
            self.conversation.extend(new)
            if await self._refused():
                return vf.Segment(messages=[], terminated=True)
            reply = _to_vf(await self._ask([to_chat(x) for x in new]))
            pending = load().graph.prepare_turn(self.trace, list(self.conversation), self._tools)
            pending.commit(
                vf.Response(
                    id=f"agentrl-{uuid.uuid4().hex[:12]}",
                    created=int(time.time()),
                    model="agentrl",
                    message=reply,
                    finish_reason="tool_calls" if reply.tool_calls else "stop",
                )
            )
            self.conversation.append(reply)
            if not reply.tool_calls:
                break
            new = [await self._call(call) for call in reply.tool_calls]
        out = [n.message for n in self.trace.nodes[first:] if n.sampled or n.message.role == "tool"]
        return vf.Segment(messages=out, root_reply=self.trace.root_reply)

    async def _refused(self) -> bool:
        """``RolloutSession.refused``: the turn limit, then the task's trace stops."""
        m = load()
        if self.trace.stop_condition is not None:
            return True
        if self.trace.num_turns >= self.max_turns:
            self.trace.stop("max_turns")
            return True
        for stop in self._stops:
            result = await m.session.call_hook(stop, {m.vf.Trace: self.trace})
            if not isinstance(result, bool):
                raise m.vf.TaskError(f"@stop must return bool, got {type(result).__name__}")
            if result:
                self.trace.stop(stop.__name__)
                return True
        return False

    async def _call(self, call: Any) -> Any:
        """One tool call's result, with the texts of verifiers' chat harness."""
        vf = load().vf
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            text = f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
        else:
            if not isinstance(arguments, dict):
                kind = type(arguments).__name__
                text = f"error: tool arguments must be a JSON object, got {kind}; "
                text += "resend as an object"
            elif call.name not in self._servers:
                text = f"error: unknown tool {call.name!r}"
            else:
                text = await self._run_tool(call.name, arguments)
        if text.startswith(("error: ", "Error executing tool", "Unknown tool")):
            self.bad_calls += 1
        return vf.ToolMessage(tool_call_id=call.id, content=text, name=call.name)

    async def _run_tool(self, name: str, arguments: dict) -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        server, raw = self._servers[name]
        try:
            result = await server.call_tool(raw, arguments)
        except ToolError as exc:  # MCP's server sends this text back as the error result
            return str(exc)
        return _content_text(result.content)

    async def close(self) -> None:
        """``Rollout.close``: the task's ``finalize`` then its scoring, on the trace."""
        m = load()
        if self.trace.stop_condition is None:
            self.trace.stop("agent_completed")
        await m.decorators.invoke(self.task.finalize, {"trace": self.trace, "runtime": None})
        await self.task.score(self.trace, None)
        self.trace.is_completed = self.trace.ok = True


def _content_text(blocks: list[Any]) -> str:
    """MCP content blocks as the chat harness gives them (``mcp_content_to_chat_content``,
    text only: an image block is shown as its description)."""
    return "\n".join(b.text if b.type == "text" else str(b) for b in blocks) if blocks else "[]"


class Seat:
    """``agents.<seat>`` for an Env's ``run()``: ``run(task)`` and ``interaction(task)``
    (module doc). Keeps every rollout it opened, for the episode's scoring."""

    def __init__(self, name: str, config: Any, taskset: Any, max_turns: int, ask: Ask) -> None:
        self.name, self.config, self.trainable = name, config, True
        self._taskset, self._max_turns, self._ask = taskset, max_turns, ask
        self.rollouts: list[Rollout] = []

    async def _open(self, task: Any) -> Rollout:
        rollout = Rollout(task, self._taskset, self.config, self._max_turns, self._ask)
        self.rollouts.append(rollout)
        await rollout.open()
        return rollout

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt, scored: the finished trace."""
        rollout = await self._open(task)
        await rollout.segment(None)
        await rollout.close()
        return rollout.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator[Interaction]:
        """A rollout held open turn by turn; leaving it scores the trace."""
        rollout = await self._open(task)
        yield Interaction(rollout)
        if rollout.trace.stop_condition is None:
            rollout.trace.stop("user_closed")
        await rollout.close()


class Interaction:
    """``vf.Interaction``'s surface: ``turn(message)`` and ``trace``."""

    def __init__(self, rollout: Rollout) -> None:
        self._rollout = rollout
        self._over = False

    @property
    def trace(self) -> Any:
        return self._rollout.trace

    async def turn(self, message: Any = None) -> Any:
        """Send one user turn (text or messages; none for a prompted task's opening) and
        run one segment; a terminated segment when a limit or stop ended the rollout."""
        vf = load().vf
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if isinstance(message, str):
            messages = [vf.UserMessage(content=message)]
        else:
            parse = load().dialects.parse_message
            messages = [parse(x) if isinstance(x, dict) else x for x in message or []]
        segment = await self._rollout.segment(messages)
        self._over = segment.terminated
        return segment
