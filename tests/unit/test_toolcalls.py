"""parse_assistant: tool calls out of sampled assistant text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.environments import MalformedToolCall, parse_assistant
from agentrl.messages import ChatMessage, ToolCall


def _calls(message: ChatMessage) -> list[tuple[str, str, dict]]:
    return [(c.id, c.name, json.loads(c.arguments)) for c in message.tool_calls]


def test_single_tag_call():
    msg = parse_assistant(
        '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>'
    )
    assert msg.role == "assistant"
    assert msg.content == ""
    assert msg.tool_calls == [
        ToolCall(id="call_0", name="calculate", arguments='{"expression": "2 + 3"}')
    ]


def test_several_tags_with_text_around_them():
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        "and also\n"
        '<tool_call> {"name": "b", "arguments": {}} </tool_call>\nDone.'
    )
    msg = parse_assistant(text)
    assert _calls(msg) == [("call_0", "a", {"x": 1}), ("call_1", "b", {})]
    assert msg.content == "Let me compute. and also Done."


def test_arguments_as_json_encoded_string_are_stored_as_json_text():
    msg = parse_assistant('<tool_call>{"name": "f", "arguments": "{\\"v\\": 84}"}</tool_call>')
    assert _calls(msg) == [("call_0", "f", {"v": 84})]
    assert isinstance(msg.tool_calls[0].arguments, str)


def test_list_of_calls_inside_one_tag():
    # SmolLM2's own function-calling format.
    msg = parse_assistant(
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
        "</tool_call>"
    )
    assert _calls(msg) == [("call_0", "a", {"x": 1}), ("call_1", "b", {})]


def test_fenced_json_inside_a_tag():
    msg = parse_assistant('<tool_call>```json\n{"name": "a", "arguments": {}}\n```</tool_call>')
    assert _calls(msg) == [("call_0", "a", {})]


def test_bare_json_object():
    msg = parse_assistant('{"name": "answer", "arguments": {"value": 84}}')
    assert _calls(msg) == [("call_0", "answer", {"value": 84})]
    assert msg.content == ""


def test_bare_json_inside_prose():
    msg = parse_assistant('Sure: {"name": "answer", "arguments": {"value": 1.5}} -- done')
    assert _calls(msg) == [("call_0", "answer", {"value": 1.5})]
    assert msg.content == "Sure: -- done"


def test_bare_json_list_of_calls():
    msg = parse_assistant('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": 2}}]')
    assert _calls(msg) == [("call_0", "a", {}), ("call_1", "b", {"y": 2})]


def test_fenced_json_block():
    text = 'I will call:\n```json\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n```'
    msg = parse_assistant(text)
    assert _calls(msg) == [("call_0", "calculate", {"expression": "1+1"})]
    assert msg.content == "I will call:"


def test_parameters_is_a_synonym_and_missing_arguments_is_empty():
    msg = parse_assistant(
        '<tool_call>{"name": "a", "parameters": {"k": "v"}}</tool_call>'
        '<tool_call>{"name": "b"}</tool_call>'
    )
    assert _calls(msg) == [("call_0", "a", {"k": "v"}), ("call_1", "b", {})]


def test_plain_text_has_no_calls():
    msg = parse_assistant("  The answer is 42.  ")
    assert msg == ChatMessage(role="assistant", content="The answer is 42.", tool_calls=[])


def test_json_that_is_not_a_call_stays_content():
    text = 'Here is data {"a": 1, "inner": {"name": "x", "arguments": {}}} and [1, 2]'
    msg = parse_assistant(text)
    assert msg.tool_calls == []
    assert msg.content == text


def test_non_ascii_arguments_survive():
    msg = parse_assistant('<tool_call>{"name": "say", "arguments": {"t": "héllo ✓"}}</tool_call>')
    assert json.loads(msg.tool_calls[0].arguments) == {"t": "héllo ✓"}


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ('<tool_call>{"name": "a", "arguments": {}}', "unterminated"),
        ('<tool_call>{"name": "a", "arguments": {</tool_call>', "invalid JSON"),
        ('<tool_call>{"name": "a", "arguments": {"v": 96 + 74}}</tool_call>', "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "a", "arguments": 5}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "a", "arguments": "[1]"}</tool_call>', "JSON object"),
        ("<tool_call>[]</tool_call>", "empty list"),
        ('<tool_call>"just a string"</tool_call>', "JSON object"),
        ('{"name": "a", "arguments": {}}</tool_call>', "without an opening"),
        ("<tool_call><tool_call>{}</tool_call></tool_call>", "nested"),
        ('{"name": "answer", "arguments": {"value": 96 + 74}}', "bare tool call"),
        ('```json\n{"name": "a", "arguments": {"x": }\n```', "fenced"),
        ('{"name": "a", "arguments": [1]}', "JSON object"),
    ],
)
def test_malformed_calls_raise(text, reason_part):
    with pytest.raises(MalformedToolCall) as info:
        parse_assistant(text)
    assert reason_part in info.value.reason


def test_tags_take_precedence_over_bare_json():
    msg = parse_assistant(
        '{"name": "bare", "arguments": {}} '
        '<tool_call>{"name": "tagged", "arguments": {}}</tool_call>'
    )
    assert [c.name for c in msg.tool_calls] == ["tagged"]
    assert msg.content == '{"name": "bare", "arguments": {}}'


_FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "```json\n",
        "```",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        '"parameters"',
        ":",
        ",",
        '"calculate"',
        '"{\\"x\\": 1}"',
        "1e999",
        "null",
        " ",
        "\n",
        "text",
        '"',
        "\\",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_arbitrary_text_only_ever_raises_malformed(text):
    try:
        msg = parse_assistant(text)
    except MalformedToolCall:
        return
    for call in msg.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)


@settings(max_examples=600, deadline=None)
@given(st.lists(_FRAGMENTS | st.text(max_size=3), max_size=30).map("".join))
def test_call_like_text_only_ever_raises_malformed(text):
    try:
        msg = parse_assistant(text)
    except MalformedToolCall:
        return
    assert [c.id for c in msg.tool_calls] == [f"call_{i}" for i in range(len(msg.tool_calls))]
    for call in msg.tool_calls:
        assert call.name.strip() == call.name != ""
        assert isinstance(json.loads(call.arguments), dict)


_JSON_LEAF = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_ARGS = st.dictionaries(
    st.text(max_size=6), st.recursive(_JSON_LEAF, lambda c: st.lists(c, max_size=3)), max_size=4
)
_NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_NAMES, _ARGS), min_size=1, max_size=3), st.booleans())
def test_rendered_calls_parse_back(calls, as_string):
    parts = []
    for name, args in calls:
        arguments = json.dumps(args) if as_string else args
        parts.append(f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")
    msg = parse_assistant("\n".join(parts))
    assert _calls(msg) == [(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)]
