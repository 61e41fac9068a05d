"""The OpenAI-compatible HTTP API over a `ServeService` (FastAPI on uvicorn).

``POST /v1/chat/completions``: ``model``, ``messages`` (system, user, assistant with
``tool_calls``, tool), ``tools``, ``tool_choice`` (``auto`` or ``none``), ``n``,
``temperature``, ``top_p``, ``max_tokens`` (or ``max_completion_tokens``), ``stop``.
The answer is OpenAI's chat.completion, plus ``agentrl``: the prompt's token ids and, per
choice, the sampled token ids, their logprobs, the policy version and the pool. No
streaming. A call inside an episode names it in the ``X-Agentrl-Episode`` header (or as
``user: "episode:<id>"``).

``GET /v1/models``: the run's policy model.

``POST /v1/episodes`` ``{"task", "group"?, "group_size"?}``: open an episode; the answer
has its ``id``, ``group``, ``sample_idx``, the policy ``version`` and, for a task of the
run's config, the environment's opening ``messages`` and ``tools``.
``POST /v1/episodes/{id}/step`` ``{"message"?}``: the task's environment answers the last
assistant turn (or ``message``): ``messages``, ``status``, ``reward``, ``finish``; the
episode ends when ``finish`` is true. ``POST /v1/episodes/{id}/end`` ``{"reward",
"status"?}``: end an episode the agent judges itself (a finite reward inside
``serve.reward_range``), or give up an episode its environment judges (a status other than
``completed``, no reward). Both ends publish the trajectory.

Bodies are strict JSON: ``NaN``, ``Infinity`` and a number beyond a float's range (``1e309``)
are refused as malformed (400), so no non-finite number reaches a field.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a
malformed request (the message names the field), 404 for an unknown episode, 409 for one
that ended; 401, 413 and 429 come from `guard.Guard` before a request gets here.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.environments import ChatTemplateError, EnvError
from agentrl.environments._chat import message_dict
from agentrl.messages import ChatMessage, ToolCall

from .episodes import EpisodeError
from .guard import error_body

__all__ = ["EPISODE_HEADER", "make_app"]

EPISODE_HEADER = "X-Agentrl-Episode"


class _Function(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: _Function


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[_Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    user: str | None = None


class EpisodeOpen(BaseModel):
    task: str
    group: str | None = None
    group_size: int | None = Field(None, ge=1)


class EpisodeStep(BaseModel):
    message: _Message | None = None


class EpisodeEnd(BaseModel):
    reward: float | None = Field(None, allow_inf_nan=False, strict=True)
    status: str = "completed"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a float's range")
    return value


def strict_json(body: bytes) -> Any:
    """``body`` parsed as JSON without Python's extensions: ``NaN``, ``Infinity`` and a
    float that overflows raise `json.JSONDecodeError` (FastAPI answers it as malformed)."""
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        raise json.JSONDecodeError(str(exc), body.decode(errors="replace"), 0) from exc


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class _StrictRoute(APIRoute):
    """A route whose JSON body is parsed by `strict_json`."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request):
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict


def _error(status: int, message: str, code: str = "invalid_request") -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(status_code=status, content=error_body(message, kind, code))


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def to_chat(message: _Message) -> ChatMessage:
    role = "system" if message.role == "developer" else message.role
    calls = [
        ToolCall(
            id=c.id or f"call_{i}",
            name=c.function.name,
            arguments=c.function.arguments
            if isinstance(c.function.arguments, str)
            else json.dumps(c.function.arguments),
        )
        for i, c in enumerate(message.tool_calls or [])
    ]
    return ChatMessage(
        role=role,
        content=_text(message.content),
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        name=message.name,
    )


def from_chat(message: ChatMessage) -> dict[str, Any]:
    out = message_dict(message, parsed_arguments=False)
    if message.tool_calls:
        out["content"] = message.content or None  # OpenAI's: no text beside the calls
    return out


def make_app(service) -> FastAPI:
    """The routes over ``service`` (a `ServeService`, or a fake with its attributes)."""
    app = FastAPI(title="agentrl", docs_url=None, redoc_url=None)
    app.router.route_class = _StrictRoute

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}"
            + (f" ({e['ctx']['error']})" if e["type"] == "json_invalid" else "")
            for e in exc.errors()
        )
        return _error(400, f"malformed request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (an unreadable body, an unknown route) in OpenAI's shape
        return _error(exc.status_code, str(exc.detail), "invalid_request")

    @app.exception_handler(EpisodeError)
    async def _episode(_request: Request, exc: EpisodeError) -> JSONResponse:
        return _error(exc.status, str(exc), "episode")

    @app.exception_handler(ChatTemplateError)
    async def _template(_request: Request, exc: ChatTemplateError) -> JSONResponse:
        return _error(400, f"cannot render the messages: {exc}", "template")

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": service.model, "object": "model", "owned_by": "agentrl",
                      "created": 0, "agentrl_version": service.version}],
        }  # fmt: skip

    @app.post("/v1/chat/completions")
    def chat(body: ChatRequest, request: Request) -> Any:
        if body.stream:
            return _error(400, "stream: streaming is not supported; send stream=false")
        choice = body.tool_choice
        if choice not in (None, "auto", "none"):
            return _error(400, f"tool_choice: {choice!r} is not supported (auto or none): "
                          "the sampler cannot force a call")  # fmt: skip
        eid = request.headers.get(EPISODE_HEADER)
        if eid is None and body.user and body.user.startswith("episode:"):
            eid = body.user.removeprefix("episode:")
        episode = service.book.get(eid) if eid else None
        tools = [] if choice == "none" else list(body.tools or [])
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        prompt, choices = service.complete(
            [to_chat(m) for m in body.messages],
            tools,
            episode=episode,
            n=body.n,
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.max_completion_tokens or body.max_tokens,
            stop=stop,
            parse_calls=choice != "none",
        )
        completion = sum(len(c.result.token_ids) for c in choices)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": [
                {
                    "index": i,
                    "message": from_chat(c.message),
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
                for i, c in enumerate(choices)
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
            "agentrl": {
                "episode": episode.id if episode else None,
                "prompt_token_ids": prompt,
                "choices": [
                    {
                        "token_ids": c.result.token_ids,
                        "logprobs": c.result.logprobs,
                        "version": c.result.version,
                        "pool": c.result.pool,
                    }
                    for c in choices
                ],
            },
        }

    @app.post("/v1/episodes")
    def open_episode(body: EpisodeOpen) -> dict[str, Any]:
        try:
            episode, messages, tools = service.book.open(
                body.task, group=body.group, group_size=body.group_size
            )
        except EnvError as exc:
            raise EpisodeError(f"task {body.task!r} cannot start: {exc}", 500) from exc
        return {
            "id": episode.id,
            "group": episode.group.id,
            "sample_idx": episode.sample_idx,
            "group_size": episode.group.size,
            "task": episode.group.task,
            "index": episode.group.index,
            "version": episode.group.version,
            "messages": [from_chat(m) for m in messages],
            "tools": tools,
        }

    @app.post("/v1/episodes/{episode_id}/step")
    def step(episode_id: str, body: EpisodeStep | None = None) -> dict[str, Any]:
        episode = service.book.get(episode_id)
        message = to_chat(body.message) if body and body.message else None
        result = service.book.step(episode, message)
        return {
            "messages": [from_chat(m) for m in result.messages],
            "status": result.status.value,
            "reward": result.reward,
            "finish": result.finish,
        }

    @app.post("/v1/episodes/{episode_id}/end")
    def end(episode_id: str, body: EpisodeEnd) -> dict[str, Any]:
        episode = service.book.get(episode_id)
        traj = service.book.end_by_agent(episode, body.reward, body.status)
        return {"episode": traj.episode_id, "reward": traj.reward, "tokens": len(traj.token_ids),
                "turns": traj.num_turns}  # fmt: skip

    return app
