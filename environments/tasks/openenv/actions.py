"""What the model's calls become on an OpenEnv server, and what it reads back.

An action environment takes one action model (its ``/schema``): `action_tool` offers it as
one function whose parameters are that schema without OpenEnv's ``metadata``. An MCP
environment (RFC 003) lists its tools: `mcp_tools` offers them as they are. Observations are
shown as JSON (`observation_text`); a ``call_tool`` observation as the tool's text or its
error (`tool_result_text`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["action_tool", "mcp_tools", "observation_text", "tool_result_text"]


def mcp_tools(listed: list[dict]) -> list[dict]:
    """An MCP environment's ``list_tools`` answer as function schemas."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in listed
    ]


def action_tool(tool: str, action: dict[str, Any]) -> dict:
    """The action schema as one function's parameters, without OpenEnv's ``metadata``."""
    parameters = copy.deepcopy(action) or {"type": "object", "properties": {}}
    parameters.get("properties", {}).pop("metadata", None)
    parameters["required"] = [r for r in parameters.get("required", []) if r != "metadata"]
    description = parameters.pop("description", None) or "Take one action in the environment."
    parameters.pop("title", None)
    return {
        "type": "function",
        "function": {"name": tool, "description": description, "parameters": parameters},
    }


def observation_text(observation: Any) -> str:
    """An observation (or any server value) as the JSON text the model reads."""
    return json.dumps(observation, ensure_ascii=False, default=str)


def tool_result_text(observation: dict) -> str:
    """A ``call_tool`` observation as the tool's answer: its text content, or its error."""
    error = observation.get("error")
    if error:
        return f"error: {error.get('message', error) if isinstance(error, dict) else error}"
    result = observation.get("result")
    blocks = result.get("content") if isinstance(result, dict) else None
    if isinstance(blocks, list):
        return "\n".join(b.get("text", json.dumps(b)) for b in blocks if isinstance(b, dict))
    return observation_text(result)
