"""Reading tool calls out of sampled assistant text.

Accepted forms, tried in this order:

1. ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` tags, one or
   several; a tag may also hold a JSON list of calls (SmolLM2's own format)
   or a ```json fenced block. When the text has any tag, only tags count.
2. Otherwise, fenced blocks (```json ... ```) whose JSON is a call or a
   list of calls.
3. Otherwise, bare JSON objects with ``"name"`` and ``"arguments"`` (or a
   JSON list of them) anywhere in the text.

``arguments`` may be an object or a JSON-encoded object; a missing
``arguments`` means ``{}`` and ``parameters`` is accepted as a synonym.
The call's arguments are stored re-encoded as a JSON text, ids are
``call_0``, ``call_1``, ... in order of appearance, and the text outside
the calls (stripped) becomes the message content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.environments._protocol import MalformedToolCall
from agentrl.messages import ChatMessage, ToolCall

__all__ = ["call_arguments", "call_text", "function_tool", "parse_assistant", "tool_reply"]

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_BARE_CALL_START = re.compile(r'\{\s*"name"\s*:')
_DECODER = json.JSONDecoder()


def parse_assistant(text: str) -> ChatMessage:
    """Parse sampled assistant text into a ChatMessage with its tool calls.

    Raises MalformedToolCall when the text holds a call that cannot be read:
    an unterminated or stray tag, invalid JSON inside a tag, a call without a
    name, or arguments that are not an object. Text with no call gives a
    message with no tool calls.
    """
    if _OPEN in text or _CLOSE in text:
        content, raw_calls = _split_tags(text)
    else:
        content, raw_calls = _split_fences(text)
        if not raw_calls:
            content, raw_calls = _split_bare(text)
    calls = [_to_tool_call(raw, f"call_{i}") for i, raw in enumerate(raw_calls)]
    return ChatMessage(role="assistant", content=content.strip(), tool_calls=calls)


def _split_tags(text: str) -> tuple[str, list[Any]]:
    outside: list[str] = []
    calls: list[Any] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        stray = text.find(_CLOSE, pos)
        if start < 0:
            if stray >= 0:
                raise MalformedToolCall(f"{_CLOSE} without an opening {_OPEN}")
            outside.append(text[pos:])
            break
        if 0 <= stray < start:
            raise MalformedToolCall(f"{_CLOSE} without an opening {_OPEN}")
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            raise MalformedToolCall(f"unterminated {_OPEN} (no {_CLOSE})")
        body = text[start + len(_OPEN) : end]
        if _OPEN in body:
            raise MalformedToolCall(f"nested {_OPEN} inside another {_OPEN}")
        outside.append(text[pos:start])
        calls.extend(_calls_in(_unfence(body.strip())))
        pos = end + len(_CLOSE)
    return " ".join(s.strip() for s in outside if s.strip()), calls


def _unfence(body: str) -> str:
    match = _FENCE.fullmatch(body)
    return match.group(1).strip() if match else body


def _calls_in(body: str) -> list[Any]:
    """The calls inside one tag body: a JSON object or a non-empty list of objects."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise MalformedToolCall(f"invalid JSON inside {_OPEN}: {_why(exc)}") from exc
    if isinstance(value, list):
        if not value:
            raise MalformedToolCall(f"empty list inside {_OPEN}")
        return value
    return [value]


def _split_fences(text: str) -> tuple[str, list[Any]]:
    calls: list[Any] = []
    outside: list[str] = []
    pos = 0
    for match in _FENCE.finditer(text):
        found = _as_calls(match.group(1).strip())
        if found is None:
            continue
        outside.append(text[pos : match.start()])
        calls.extend(found)
        pos = match.end()
    outside.append(text[pos:])
    return " ".join(s.strip() for s in outside if s.strip()), calls


def _as_calls(body: str) -> list[Any] | None:
    """The calls a fenced block holds, or None when it is not call JSON."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        if _BARE_CALL_START.match(body):
            raise MalformedToolCall("invalid JSON in a fenced tool call") from None
        return None
    if _looks_like_call(value):
        return [value]
    if isinstance(value, list) and value and all(_looks_like_call(v) for v in value):
        return value
    return None


def _split_bare(text: str) -> tuple[str, list[Any]]:
    """Scan for bare JSON calls; other JSON and prose stay in the content."""
    calls: list[Any] = []
    outside: list[str] = []
    kept = 0
    pos = 0
    while True:
        brace = _next_json_start(text, pos)
        if brace < 0:
            break
        try:
            value, end = _DECODER.raw_decode(text, brace)
        except (ValueError, RecursionError):
            if _BARE_CALL_START.match(text, brace):
                raise MalformedToolCall("invalid JSON in a bare tool call") from None
            pos = brace + 1
            continue
        found = None
        if _looks_like_call(value):
            found = [value]
        elif isinstance(value, list) and value and all(_looks_like_call(v) for v in value):
            found = value
        if found is None:
            # Not a call: skip the whole value so calls nested inside it do not count.
            pos = end
            continue
        outside.append(text[kept:brace])
        calls.extend(found)
        kept = pos = end
    outside.append(text[kept:])
    return " ".join(s.strip() for s in outside if s.strip()), calls


def _next_json_start(text: str, pos: int) -> int:
    brace, bracket = text.find("{", pos), text.find("[", pos)
    if brace < 0 or bracket < 0:
        return max(brace, bracket)
    return min(brace, bracket)


def _why(exc: BaseException) -> str:
    # ValueError covers JSONDecodeError and Python's int-digits limit; RecursionError deep nesting.
    return exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__


def _looks_like_call(value: Any) -> bool:
    return isinstance(value, dict) and "name" in value and _args_key(value) is not None


def _args_key(call: dict) -> str | None:
    for key in ("arguments", "parameters"):
        if key in call:
            return key
    return None


def _to_tool_call(raw: Any, call_id: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise MalformedToolCall(f"a tool call must be a JSON object, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MalformedToolCall('a tool call needs a non-empty string "name"')
    key = _args_key(raw)
    args = raw[key] if key is not None else {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            raise MalformedToolCall(
                f"{name}: arguments string is not valid JSON: {_why(exc)}"
            ) from exc
    if not isinstance(args, dict):
        raise MalformedToolCall(
            f"{name}: arguments must be a JSON object, got {type(args).__name__}"
        )
    return ToolCall(id=call_id, name=name.strip(), arguments=json.dumps(args, ensure_ascii=False))


def call_arguments(call: ToolCall) -> dict[str, Any] | None:
    """A parsed tool call's arguments as a dict, or None when they are not a JSON object."""
    try:
        args = json.loads(call.arguments)
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def tool_reply(call: ToolCall, content: str) -> ChatMessage:
    """The tool message answering ``call`` (its id and name echoed)."""
    return ChatMessage(role="tool", content=content, tool_call_id=call.id, name=call.name)


def call_text(name: str, arguments: Any) -> str:
    """A call written in the first form `parse_assistant` reads:
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (prompts' examples, demos)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{_OPEN}{body}{_CLOSE}"


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """An OpenAI function-tool schema: ``{"type": "function", "function": {...}}`` whose
    parameters are an object of ``properties`` (JSON Schema), ``required`` ones, no others."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }
