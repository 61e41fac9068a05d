"""A task-agnostic random agent: what `agentrl-env check --agent random` plays on any task.

It knows nothing but the session's tool schemas. Most turns it calls a random tool
with arguments drawn from that tool's JSON schema (`schema_value`); the rest are the
outputs a small model really writes, each as the rollout hands it to the task
(`_toolcalls.parse_assistant`'s output, or the raw text of an unreadable call as a
message without calls):

- ``text``: prose without a call;
- ``malformed``: a ``<tool_call>`` tag holding broken JSON (raw text, no calls);
- ``unknown_tool``: a call to a tool the task does not offer;
- ``wrong_arguments``: a known tool with its required arguments missing or of the wrong
  type.

A task must answer each of these with a `Step` (an observation, or an end with a
status), never an exception: model failures are statuses (`_protocol`).
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrl.messages import ChatMessage, ToolCall

__all__ = ["KINDS", "random_turn", "schema_value"]

KINDS = ("call", "text", "malformed", "unknown_tool", "wrong_arguments")
"""What one random turn may be; ``call`` (schema-valid) is drawn most often."""
_WEIGHTS = (6, 1, 1, 1, 1)
_WORDS = ("a", "north", "0", "yes", "x1", "42", "hello world", "", "SELECT 1", "-3.5")


def random_turn(tools: list[dict], rng: random.Random, turn: int) -> tuple[str, ChatMessage]:
    """One assistant message and its kind (one of `KINDS`) for a session offering ``tools``."""
    kind = rng.choices(KINDS, _WEIGHTS)[0] if tools else rng.choice(KINDS[1:3])
    call_id = f"call_{turn}"
    if kind == "text":
        return kind, ChatMessage("assistant", rng.choice(("I think so.", "", "42", "Done.")))
    if kind == "malformed":
        return kind, ChatMessage("assistant", '<tool_call>{"name": "x", "arguments": {</tool_call>')
    if kind == "unknown_tool":
        call = ToolCall(call_id, "no_such_tool_zz", json.dumps({"q": 1}))
        return kind, ChatMessage("assistant", "", [call])
    function = rng.choice(tools)["function"]
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    if kind == "wrong_arguments":
        arguments = {key: [None, {"deep": True}] for key in schema.get("properties", {})}
        arguments = dict(list(arguments.items())[: rng.randint(0, len(arguments))])
    else:
        arguments = schema_value(schema, rng)
    call = ToolCall(call_id, function["name"], json.dumps(arguments))
    return kind, ChatMessage("assistant", "", [call])


def schema_value(schema: dict, rng: random.Random, depth: int = 0) -> Any:
    """A random value that validates against the JSON schema ``schema`` (the subset tool
    schemas use: type, enum, const, anyOf/oneOf, properties/required, items, minimum,
    maximum, minItems/maxItems, examples)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_value(rng.choice(schema[key]), rng, depth + 1)
    if schema.get("examples") and rng.random() < 0.5:
        return rng.choice(schema["examples"])
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = rng.choice([k for k in kind if k != "null"] or ["null"])
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        return {
            key: schema_value(sub, rng, depth + 1)
            for key, sub in properties.items()
            if key in required or (depth < 3 and rng.random() < 0.5)
        }
    if kind == "array":
        low = schema.get("minItems", 0)
        high = max(low, min(schema.get("maxItems", 3), 3 if depth < 3 else low))
        items = schema.get("items", {"type": "string"})
        return [schema_value(items, rng, depth + 1) for _ in range(rng.randint(low, high))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", -10)
        high = schema.get("maximum", max(low, 0) + 100)
        if kind == "integer":
            return rng.randint(int(low), int(high))
        return round(rng.uniform(low, high), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return rng.choice(_WORDS)
