"""Turning conversations into policy token ids, keeping sampled assistant ids exact.

The policy never sees a re-tokenised history: the prompt for turn k+1 is
``prompt ids (turn 0) + sampled ids + closing ids + observation ids + ...``,
where every piece after the first is computed on its own:

- ``prompt_ids(messages, tools)``: the chat template on the opening messages,
  with the generation prompt.
- ``closing_ids(sampled)``: ``end_of_turn_ids`` when the sampler stopped on
  length before writing the end-of-turn token, else ``[]``. The rollout
  appends them as non-trainable tokens (loss mask 0), so the next
  observation always follows a closed assistant turn.
- ``observation_ids(history, new_messages)``: the templated text of
  ``history + new_messages`` (with the generation prompt) minus the templated
  text of ``history`` cut right after the end-of-turn marker of its last
  assistant message, tokenised without special-token insertion. For ChatML
  this is ``"\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n"``.

Templates that ignore ``tools=`` (SmolLM2's does) get the tools written into
the system message: a short instruction, the function schemas and one worked
example call in the exact ``<tool_call>`` format that ``parse_assistant`` reads;
an assistant message's structured ``tool_calls`` (a task's worked example) are
written into its text in that format too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jinja2

from agentrl.environments._protocol import EnvError
from agentrl.environments._toolcalls import call_text
from agentrl.messages import ChatMessage

__all__ = ["ChatFormat", "ChatTemplateError", "tools_system_text"]

_MARK = "@@agentrl-assistant-content@@"


class ChatTemplateError(EnvError):
    """Raised when a tokenizer's chat template cannot be used incrementally.

    E.g. rendering ``history`` is not a prefix of rendering ``history +
    new_messages``, or no end-of-turn marker follows an assistant message.
    """


class ChatFormat:
    """Chat-template rendering and incremental tokenisation for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.template_takes_tools = _takes_tools(tokenizer)
        """True when the template renders ``tools=`` itself; else tools go in the system text."""
        self._eot_text = _end_of_turn_text(tokenizer)
        self.end_of_turn_ids: list[int] = tokenizer.encode(self._eot_text, add_special_tokens=False)
        """Token ids that close an assistant turn (``<|im_end|>`` for ChatML)."""
        stops = [self.end_of_turn_ids[-1]]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stops:
            stops.append(tokenizer.eos_token_id)
        self.stop_ids: list[int] = stops
        """Ids that end sampling of an assistant turn: the end-of-turn token and EOS."""

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict] = (),
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The chat template's text for ``messages`` (tools in the system text if needed)."""
        dicts = [_to_dict(m) for m in messages]
        if not self.template_takes_tools:
            dicts = [_calls_as_text(d) for d in dicts]
        kwargs: dict[str, Any] = {}
        if tools and self.template_takes_tools:
            kwargs["tools"] = list(tools)
        elif tools:
            dicts = _with_tools_in_system(dicts, tools)
        return self._tok.apply_chat_template(
            dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def prompt_ids(self, messages: Sequence[ChatMessage], tools: Sequence[dict] = ()) -> list[int]:
        """Ids of the opening prompt, ending with the assistant generation prompt."""
        text = self.render(messages, tools, add_generation_prompt=True)
        return self._tok.encode(text, add_special_tokens=False)

    def closing_ids(self, sampled_ids: Sequence[int]) -> list[int]:
        """Ids to append (loss mask 0) after a sampled turn that did not end with end-of-turn."""
        n = len(self.end_of_turn_ids)
        if list(sampled_ids[-n:]) == self.end_of_turn_ids:
            return []
        return list(self.end_of_turn_ids)

    def observation_ids(
        self,
        history: Sequence[ChatMessage],
        new_messages: Sequence[ChatMessage],
        tools: Sequence[dict] = (),
    ) -> list[int]:
        """Ids to append after the closed assistant turn that ends ``history``.

        ``history`` is every message so far, its last one the assistant turn
        just sampled (its text is irrelevant: only what follows it is
        rendered). ``tools`` must be the same as for ``prompt_ids``. The ids
        end with the generation prompt for the next assistant turn.
        """
        if not history or history[-1].role != "assistant":
            raise ChatTemplateError("observation_ids: history must end with an assistant message")
        before = self.render(history, tools, add_generation_prompt=False)
        after = self.render([*history, *new_messages], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                "chat template is not incremental: rendering the history is not a prefix of "
                f"rendering history + new messages (first difference at char "
                f"{_first_difference(before, after)})"
            )
        cut = before.rfind(self._eot_text)
        if cut < 0:
            raise ChatTemplateError(
                f"no end-of-turn marker {self._eot_text!r} after the last assistant message"
            )
        suffix = before[cut + len(self._eot_text) :] + after[len(before) :]
        return self._tok.encode(suffix, add_special_tokens=False)

    def decode_assistant(self, sampled_ids: Sequence[int]) -> str:
        """Text of a sampled assistant turn, without special tokens (input to parse_assistant)."""
        return self._tok.decode(list(sampled_ids), skip_special_tokens=True)


def tools_system_text(tools: Sequence[dict], *, example: bool = True) -> str:
    """The tool schemas and call instruction written into the system message.

    With ``example``, one example call in the exact format follows (built from
    the first tool's parameter ``examples`` or placeholders).
    """
    if not tools:
        return ""
    functions = [_strip_examples(t.get("function", t)) for t in tools]
    schemas = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    text = f"<tools>\n{schemas}\n</tools>\nTo call a tool, write <tool_call>JSON</tool_call>"
    if not example:
        return text + "."
    return f"{text}, for example:\n{_example_call(tools[0].get('function', tools[0]))}"


def _example_call(function: dict) -> str:
    props = function.get("parameters", {}).get("properties", {})
    args = {name: _example_value(schema) for name, schema in props.items()}
    return call_text(function.get("name", "tool"), args)


def _example_value(schema: dict) -> Any:
    if schema.get("examples"):
        return schema["examples"][0]
    return {"string": "...", "integer": 1, "number": 1, "boolean": True}.get(
        schema.get("type", "string"), "..."
    )


def _strip_examples(function: dict) -> dict:
    params = function.get("parameters")
    if not isinstance(params, dict) or "properties" not in params:
        return function
    props = {
        k: {f: v for f, v in p.items() if f != "examples"} for k, p in params["properties"].items()
    }
    return {**function, "parameters": {**params, "properties": props}}


def _with_tools_in_system(dicts: list[dict], tools: Sequence[dict]) -> list[dict]:
    # An assistant turn that already shows a call (a task's worked demo) teaches the format
    # better than a line in the system text; measured on SmolLM2-135M with the calculator
    # demo, adding the example line too dropped calculate-first turns from 8/64 to 0/64.
    shown = any(d["role"] == "assistant" and "<tool_call>" in d["content"] for d in dicts)
    block = tools_system_text(tools, example=not shown)
    if dicts and dicts[0]["role"] == "system":
        first = dict(dicts[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *dicts[1:]]
    return [{"role": "system", "content": block}, *dicts]


def _to_dict(message: ChatMessage) -> dict:
    return message_dict(message)


def message_dict(message: ChatMessage, *, parsed_arguments: bool = True) -> dict:
    """``message`` as an OpenAI-style dict; a call's arguments parsed (as chat templates
    take them) or, with ``parsed_arguments=False``, the JSON text (as the wire API has it)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": _json_or_text(c.arguments) if parsed_arguments else c.arguments,
                },
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _calls_as_text(message: dict) -> dict:
    """An assistant message's structured calls written into its text, in the form
    ``parse_assistant`` reads: a template that ignores tools drops ``tool_calls`` (SmolLM2's),
    and a worked example in the opening messages (kg's one-shot) would lose its calls."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    texts = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    content = "\n".join([message["content"], *texts] if message["content"] else texts)
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _takes_tools(tokenizer: Any) -> bool:
    probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    tool = {
        "type": "function",
        "function": {
            "name": "probe_tool_xyz",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    try:
        with_tools = tokenizer.apply_chat_template(
            probe, tools=[tool], tokenize=False, add_generation_prompt=True
        )
    except jinja2.TemplateError:
        return False
    return with_tools != plain


def _end_of_turn_text(tokenizer: Any) -> str:
    """The text the template writes right after an assistant message's content, up to and
    including its first special token (``<|im_end|>`` for ChatML)."""
    probe = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": _MARK},
    ]
    text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    at = text.find(_MARK)
    if at < 0:
        raise ChatTemplateError("chat template does not render assistant content verbatim")
    tail = text[at + len(_MARK) :]
    specials = [s for s in tokenizer.all_special_tokens if s]
    hits = [(tail.find(s), s) for s in specials if tail.find(s) >= 0]
    if not hits:
        raise ChatTemplateError(f"no special token closes an assistant turn: {tail!r}")
    start, token = min(hits, key=lambda h: (h[0], -len(h[1])))
    return tail[: start + len(token)]


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
