"""Scripted agents of the BFCL tasks for ``agentrl-env check`` (`tasks.bfcl.task.CHECK_AGENTS`).

``oracle`` plays the possible answer: its first acceptable value per parameter
(single-turn; Java and JavaScript parameters as source text), or the ground-truth calls of
each turn in one message followed by a text that ends the turn (multi-turn); the relevance
categories get a call or none, as they ask. ``random`` makes one uninformed call of a
random offered function per turn.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentrl.environments.tasks.bfcl.data import (
    RELEVANCE_CATEGORIES,
    Entry,
    method_parameters,
    to_tools,
)
from agentrl.messages import ToolCall

if TYPE_CHECKING:
    from agentrl.environments.tasks.bfcl.task import BFCLTask

__all__ = ["CHECK_AGENTS"]

_OMIT = object()


def _pick(options: list, required: bool = False) -> Any:
    """A value of a possible answer's option list: left out when "" (may be left out) is
    among them and the function does not require it, else the first other option."""
    chosen = [o for o in options if o != ""]
    if not chosen or ("" in options and not required):
        return _OMIT
    return _resolve(chosen[0])


def _resolve(value: Any) -> Any:
    if isinstance(value, dict):  # a dict parameter: each key has its own option list
        out = {}
        for key, options in value.items():
            chosen = _pick(options) if isinstance(options, list) else options
            if chosen is not _OMIT:
                out[key] = chosen
        return out
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


def _required(entry: Entry, name: str) -> set[str]:
    for function in entry.checked["function"]:
        if function["name"] == name:
            return set(function.get("parameters", {}).get("required", []))
    return set()


def _as_source(value: Any) -> str:
    """A value written as Java/JavaScript source text: BFCL gives those categories'
    parameters as strings ("in string representation") and parses them back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def _tool_name(name: str) -> str:
    return name.replace(".", "_")


def _oracle(env: BFCLTask, index: int, rng: random.Random) -> Iterator[Any]:
    """The possible answer: its first acceptable value per parameter (single-turn), or the
    ground-truth calls of each turn in one message, then a text that ends the turn."""
    entry = env.entry(index)
    if entry.category in RELEVANCE_CATEGORIES:
        if "irrelevance" in entry.category:
            yield "None of the functions can answer this."
        else:
            first = entry.prompt["function"][0]
            yield ToolCall("call_0", _tool_name(first["name"]), json.dumps(_any_args(first, rng)))
        return
    if not entry.multi_turn:
        calls = []
        for i, answer in enumerate(entry.answer):
            (name, params), *_ = answer.items()
            required = _required(entry, name)
            args = {
                k: v for k, opts in params.items() if (v := _pick(opts, k in required)) is not _OMIT
            }
            if entry.category in ("simple_java", "simple_javascript"):
                args = {k: _as_source(v) for k, v in args.items()}
            calls.append(ToolCall(f"call_{i}", _tool_name(name), json.dumps(args)))
        yield calls
        return
    for turn in entry.answer:
        if turn:
            yield [_parsed_call(entry, text, i) for i, text in enumerate(turn)]
        yield "Done."


def _parsed_call(entry: Entry, text: str, i: int) -> ToolCall:
    """A ground-truth call string (``mv(source='a', destination='b')``) as a ToolCall;
    positional arguments are named by the backend method's signature."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"bfcl: ground truth {text!r} of {entry.id} is not a plain call")
    name = node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        names = method_parameters(entry, name)
        for pos, value in zip(names, node.args, strict=False):
            args[pos] = ast.literal_eval(value)
    return ToolCall(f"call_{i}", name, json.dumps(args))


_RANDOM_VALUES = {
    "string": lambda r: r.choice(["test", "abc", "file.txt", "2024-01-01", "New York"]),
    "integer": lambda r: r.randint(0, 100),
    "number": lambda r: round(r.uniform(0, 100), 2),
    "boolean": lambda r: r.random() < 0.5,
    "array": lambda r: [],
    "object": lambda r: {},
}


def _any_args(function: dict, rng: random.Random) -> dict:
    """Plausible but uninformed values for a function's required parameters."""
    tool = to_tools([function])[0]["function"]
    props = tool["parameters"].get("properties", {})
    return {
        k: _RANDOM_VALUES.get(props[k].get("type", "string"), _RANDOM_VALUES["string"])(rng)
        for k in tool["parameters"].get("required", [])
        if k in props
    }


def _random(env: BFCLTask, index: int, rng: random.Random) -> Iterator[Any]:
    """One uninformed call of a random offered function per turn (random required
    arguments), then a text that ends the turn."""
    entry = env.entry(index)
    functions = entry.prompt.get("function") or []
    turns = len(entry.prompt["question"]) if entry.multi_turn else 1
    for _ in range(turns):
        if functions:
            chosen = rng.choice(functions)
            yield ToolCall("call_0", _tool_name(chosen["name"]), json.dumps(_any_args(chosen, rng)))
        if entry.multi_turn:
            yield "Done."


CHECK_AGENTS = {"oracle": _oracle, "random": _random}
"""``agentrl-env check --task bfcl_multi_turn --agent oracle|random`` (and ``bfcl``)."""
