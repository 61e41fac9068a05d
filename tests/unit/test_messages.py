"""Tests for the wire records and the msgpack codec of agentrl.messages."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.messages import (
    SCHEMA_VERSION,
    ChatMessage,
    CheckpointQuery,
    CheckpointReady,
    ControlCommand,
    EnvCancel,
    EnvInteract,
    EnvReply,
    EnvStart,
    EpisodeRequest,
    GenerateRequest,
    GenerateResult,
    Heartbeat,
    Message,
    MessageError,
    MetricsReport,
    SessionReport,
    SessionsLost,
    StatusQuery,
    ToolCall,
    Trajectory,
    decode,
    encode,
)
from agentrl.messages._records import PAYLOAD_TYPES

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
FLOAT64 = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | INT64 | FLOAT64 | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """A strategy for values of a record field, derived from its type hint."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:  # the 0/1 mask
        return st.lists(st.integers(0, 1), max_size=20)
    if hint is str:
        return TEXT
    if hint is bool:
        return st.booleans()
    if hint is int:
        return INT64
    if hint is float:
        return FLOAT64
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, typing.get_origin(int | None)):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | strategy_for(inner)
    if origin is list:
        compact = {int: INT32, float: FLOAT32}
        item = compact[args[0]] if args[0] in compact else strategy_for(args[0])
        return st.lists(item, max_size=20 if args[0] in (int, float) else 3)
    if origin is dict:
        return st.dictionaries(TEXT, FLOAT64, max_size=4)
    if hint is dict:
        return st.dictionaries(TEXT, JSON, max_size=3)
    assert dataclasses.is_dataclass(hint), hint
    return record_strategy(hint)


def record_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    """Trajectories whose four token arrays share one length."""
    length = draw(st.integers(0, 30))
    base = draw(record_strategy(Trajectory))
    return dataclasses.replace(
        base,
        token_ids=draw(st.lists(INT32, min_size=length, max_size=length)),
        loss_mask=draw(st.lists(st.integers(0, 1), min_size=length, max_size=length)),
        logprobs=draw(st.lists(FLOAT32, min_size=length, max_size=length)),
        versions=draw(st.lists(INT32, min_size=length, max_size=length)),
    )


@st.composite
def session_tables(draw: st.DrawFn, cls: type) -> Any:
    """SessionReport / SessionsLost whose per-session lists share one length."""
    length = draw(st.integers(0, 5))
    base = draw(record_strategy(cls))
    hints = typing.get_type_hints(cls)
    per_session = {
        name: draw(st.lists(FLOAT32 if hints[name] == list[float] else TEXT,
                            min_size=length, max_size=length))
        for name in ("session_ids", "idle", "workers", "episodes", "tasks", "reasons")
        if hasattr(base, name)
    }  # fmt: skip
    return dataclasses.replace(base, **per_session)


def payload_strategy(cls: type) -> st.SearchStrategy[Any]:
    if cls in (SessionReport, SessionsLost):
        return session_tables(cls)
    return trajectories() if cls is Trajectory else record_strategy(cls)


def make_trajectory(length: int = 3, **changes: Any) -> Trajectory:
    base = Trajectory(
        episode_id="ep-1",
        group_id="g-1",
        task="gsm8k",
        index=7,
        sample_idx=1,
        group_size=4,
        issued_version=3,
        token_ids=list(range(length)),
        loss_mask=[i % 2 for i in range(length)],
        logprobs=[-0.5 if i % 2 else 0.0 for i in range(length)],
        versions=[3 if i % 2 else -1 for i in range(length)],
        pools=["cpu"],
        reward=1.0,
        env_reward=1.0,
        status="completed",
        num_turns=1,
        timings={"generate": 0.25},
        metrics={"turns": 1.0},
    )
    return dataclasses.replace(base, **changes)


def make_reply() -> EnvReply:
    call = ToolCall(id="c1", name="search", arguments='{"q": "x"}')
    return EnvReply(
        session_id="s1",
        worker_id="w1",
        messages=[ChatMessage(role="assistant", content="", tool_calls=[call])],
        tools=[{"type": "function", "function": {"name": "search", "parameters": {}}}],
        status="running",
        reward=0.0,
        finish=False,
        metrics={},
    )


def rewrite(body: bytes, change: Any) -> bytes:
    """Unpack a valid message, let ``change(wire)`` edit it, pack it again."""
    wire = msgpack.unpackb(body, raw=False)
    change(wire)
    return msgpack.packb(wire, use_bin_type=True)


def decode_error(body: bytes, **kwargs: Any) -> str:
    with pytest.raises(MessageError) as info:
        decode(body, **kwargs)
    return str(info.value)


# --- records ------------------------------------------------------------------


def test_every_table_kind_is_a_payload_record() -> None:
    kinds = {cls.KIND for cls in PAYLOAD_TYPES}
    assert kinds == {
        "episode_request",
        "generate_request",
        "generate_result",
        "trajectory",
        "checkpoint_ready",
        "checkpoint_query",
        "status_query",
        "heartbeat",
        "control_command",
        "metrics_report",
        "env_start",
        "env_interact",
        "env_cancel",
        "env_reply",
        "session_report",
        "sessions_lost",
    }
    assert SCHEMA_VERSION == 2


@pytest.mark.parametrize("cls", [*PAYLOAD_TYPES, ChatMessage, ToolCall])
def test_records_are_frozen_and_slotted(cls: type) -> None:
    params = cls.__dataclass_params__
    assert params.frozen
    assert "__slots__" in cls.__dict__


def test_defaults() -> None:
    assert EpisodeRequest("e", "t", 0, "g", 0, 2, 0).attempt == 0
    message = ChatMessage(role="user", content="hi")
    assert (message.tool_calls, message.tool_call_id, message.name) == ([], None, None)
    assert GenerateRequest("r", "e", [1], 4, 1.0, 1.0, [2]).seed is None


# --- round trips --------------------------------------------------------------


@pytest.mark.parametrize("cls", PAYLOAD_TYPES, ids=lambda cls: cls.KIND)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    payload = data.draw(payload_strategy(cls))
    message = decode(encode(payload, run="run-a", message_id="m-1"), expect=cls)
    assert isinstance(message, Message)
    assert message.payload == payload
    assert type(message.payload) is cls
    envelope = message.envelope
    assert (envelope.kind, envelope.schema, envelope.run) == (cls.KIND, SCHEMA_VERSION, "run-a")
    assert envelope.message_id == "m-1"


def test_envelope_defaults() -> None:
    first = decode(encode(CheckpointQuery("me"), run="r")).envelope
    second = decode(encode(CheckpointQuery("me"), run="r")).envelope
    assert len(first.message_id) == 32 and first.message_id != second.message_id
    assert first.sent_at > 1.6e9


def test_metric_values_may_be_non_finite() -> None:
    report = MetricsReport("learner", 3, {"a": math.nan, "b": math.inf})
    values = decode(encode(report, run="r")).payload.values
    assert math.isnan(values["a"]) and values["b"] == math.inf


def test_ints_are_accepted_for_floats_and_tuples_for_lists() -> None:
    request = GenerateRequest("r", "e", (1, 2), 8, 1, 1, (0,))
    decoded = decode(encode(request, run="r")).payload
    assert decoded.temperature == 1.0 and isinstance(decoded.temperature, float)
    assert decoded.prompt_ids == [1, 2] and decoded.stop_ids == [0]


def test_float32_rounding() -> None:
    # 0.1 is not exactly representable; float32(0.1) = 0.100000001490116...
    result = GenerateResult("r", [5], [0.1], 0, "cpu", "stop")
    (logprob,) = decode(encode(result, run="r")).payload.logprobs
    assert logprob != 0.1 and logprob == pytest.approx(0.1, rel=1e-7)


def test_trajectory_arrays_are_compact() -> None:
    length = 4096
    body = encode(make_trajectory(length), run="r")
    # 4 (token_ids) + 1 (loss_mask) + 4 (logprobs) + 4 (versions) bytes per token = 13
    assert len(body) < 14 * length + 2048
    wire = msgpack.unpackb(body, raw=False)["payload"]
    assert len(wire["token_ids"]) == 4 * length and isinstance(wire["token_ids"], bytes)
    assert len(wire["loss_mask"]) == length
    assert decode(body).payload == make_trajectory(length)


def test_little_endian_layout() -> None:
    wire = msgpack.unpackb(encode(make_trajectory(2), run="r"), raw=False)["payload"]
    assert wire["token_ids"] == b"\x00\x00\x00\x00\x01\x00\x00\x00"  # [0, 1] as <i4
    assert wire["versions"] == b"\xff\xff\xff\xff\x03\x00\x00\x00"  # [-1, 3] as <i4
    assert wire["loss_mask"] == b"\x00\x01"
    assert wire["logprobs"] == b"\x00\x00\x00\x00\x00\x00\x00\xbf"  # [0.0, -0.5] as <f4


# --- rejections on decode -----------------------------------------------------


def test_reject_not_msgpack() -> None:
    assert "not valid msgpack" in decode_error(b"\xc1")
    # the reason says what was wrong and shows the bytes, even when msgpack says nothing
    assert decode_error(b"\xc1 garbage") == (
        "message body: not valid msgpack (FormatError); starts c1 20 67 61 72 62 61 67 65 (9 bytes)"
    )
    assert "not valid msgpack" in decode_error(encode(CheckpointQuery("x"), run="r")[:-3])


def test_reject_not_bytes() -> None:
    assert "expected bytes, got str" in decode_error("hello")  # type: ignore[arg-type]


def test_reject_not_a_map() -> None:
    assert "expected a map, got list" in decode_error(msgpack.packb([1, 2]))


def test_reject_bad_top_level_keys() -> None:
    body = rewrite(encode(CheckpointQuery("x"), run="r"), lambda w: w.update(extra=1))
    assert "envelope and payload" in decode_error(body)


def test_reject_unknown_kind() -> None:
    body = rewrite(encode(CheckpointQuery("x"), run="r"), lambda w: w["envelope"].update(kind="x"))
    assert decode_error(body) == "envelope.kind: unknown kind 'x'"


def test_reject_schema_mismatch() -> None:
    body = rewrite(
        encode(CheckpointQuery("x"), run="r"),
        lambda w: w["envelope"].update(schema=SCHEMA_VERSION + 1),
    )
    assert decode_error(body).startswith("checkpoint_query: schema version 3 not supported")


def test_reject_bad_envelope() -> None:
    body = rewrite(encode(CheckpointQuery("x"), run="r"), lambda w: w["envelope"].pop("run"))
    assert decode_error(body) == "envelope.run: missing field"


def test_reject_kind_mismatch() -> None:
    body = encode(CheckpointQuery("x"), run="r")
    text = decode_error(body, expect=Trajectory)
    assert text == "checkpoint_query: expected a trajectory message, got checkpoint_query"


def test_reject_missing_field() -> None:
    body = rewrite(encode(make_trajectory(), run="r"), lambda w: w["payload"].pop("reward"))
    assert decode_error(body) == "trajectory.reward: missing field"


def test_reject_missing_defaulted_field() -> None:
    body = rewrite(
        encode(EpisodeRequest("e", "t", 0, "g", 0, 2, 0), run="r"),
        lambda w: w["payload"].pop("attempt"),
    )
    assert decode_error(body) == "episode_request.attempt: missing field"


def test_reject_extra_field() -> None:
    body = rewrite(encode(make_trajectory(), run="r"), lambda w: w["payload"].update(bonus=1.0))
    assert decode_error(body) == "trajectory.bonus: unexpected field"


def test_reject_wrong_type() -> None:
    body = rewrite(encode(make_trajectory(), run="r"), lambda w: w["payload"].update(index="7"))
    assert decode_error(body) == "trajectory.index: expected int, got str"


def test_reject_bool_for_int() -> None:
    body = rewrite(encode(make_trajectory(), run="r"), lambda w: w["payload"].update(index=True))
    assert decode_error(body) == "trajectory.index: expected int, got bool"


def test_reject_non_finite() -> None:
    body = rewrite(
        encode(make_trajectory(), run="r"), lambda w: w["payload"].update(reward=math.inf)
    )
    assert decode_error(body) == "trajectory.reward: expected a finite float, got inf"


def test_reject_non_finite_in_float_array() -> None:
    nan32 = b"\x00\x00\xc0\x7f"  # float32 quiet NaN, little-endian
    body = rewrite(
        encode(make_trajectory(2), run="r"),
        lambda w: w["payload"].update(logprobs=b"\x00\x00\x00\x00" + nan32),
    )
    assert decode_error(body) == "trajectory.logprobs[1]: expected a finite float, got nan"


def test_reject_unequal_lengths() -> None:
    body = rewrite(
        encode(make_trajectory(3), run="r"),
        lambda w: w["payload"].update(versions=w["payload"]["versions"][:8]),
    )
    assert decode_error(body) == "trajectory.versions: length 2 != len(token_ids) 3"


def test_reject_mask_values() -> None:
    body = rewrite(
        encode(make_trajectory(3), run="r"),
        lambda w: w["payload"].update(loss_mask=b"\x00\x02\x01"),
    )
    assert decode_error(body) == "trajectory.loss_mask[1]: expected 0 or 1, got 2"


def test_reject_ragged_packed_array() -> None:
    body = rewrite(
        encode(make_trajectory(3), run="r"), lambda w: w["payload"].update(token_ids=b"\x00" * 11)
    )
    assert "trajectory.token_ids: packed array of 11 bytes" in decode_error(body)


def test_reject_plain_array_for_packed_field() -> None:
    body = rewrite(
        encode(make_trajectory(2), run="r"), lambda w: w["payload"].update(token_ids=[0, 1])
    )
    assert decode_error(body) == "trajectory.token_ids: expected a packed array (bin), got list"


def test_reject_literal_value() -> None:
    body = rewrite(
        encode(ControlCommand("pause", "why"), run="r"),
        lambda w: w["payload"].update(command="reboot"),
    )
    assert decode_error(body) == (
        "control_command.command: expected one of ['pause', 'resume', 'shutdown'], got 'reboot'"
    )


def test_reject_nested_field_path() -> None:
    def change(wire: dict) -> None:
        wire["payload"]["messages"][0]["tool_calls"][0]["name"] = 3

    body = rewrite(encode(make_reply(), run="r"), change)
    assert decode_error(body) == "env_reply.messages[0].tool_calls[0].name: expected str, got int"


def test_reject_non_str_metric_key() -> None:
    body = rewrite(
        encode(Heartbeat("n", "sampler", "a", 1.0, {}), run="r"),
        lambda w: w["payload"].update(state={b"k": 1.0}),
    )
    assert decode_error(body) == "heartbeat.state: expected str key, got bytes"


def test_reject_bytes_in_json_value() -> None:
    body = rewrite(
        encode(make_reply(), run="r"), lambda w: w["payload"]["tools"][0].update(blob=b"x")
    )
    assert decode_error(body) == "env_reply.tools[0]['blob']: expected a JSON-like value, got bytes"


# --- rejections on encode -----------------------------------------------------


def encode_error(payload: Any) -> str:
    with pytest.raises(MessageError) as info:
        encode(payload, run="r")
    return str(info.value)


def test_encode_rejects_non_payload() -> None:
    text = encode_error(ChatMessage(role="user", content="hi"))
    assert text == "cannot encode ChatMessage: not a payload record"


def test_encode_rejects_int32_overflow() -> None:
    text = encode_error(make_trajectory(2, token_ids=[0, 2**31]))
    assert text == "trajectory.token_ids[1]: int 2147483648 out of int32 range"


def test_encode_rejects_int64_overflow() -> None:
    text = encode_error(CheckpointReady(2**63, "file:///x", "d", 0.0))
    assert text == "checkpoint_ready.version: int 9223372036854775808 out of int64 range"


def test_encode_rejects_float32_overflow() -> None:
    text = encode_error(make_trajectory(2, logprobs=[0.0, -1e39]))
    assert text == "trajectory.logprobs[1]: expected a finite float (overflows float32), got -inf"


def test_encode_rejects_non_finite_scalar() -> None:
    text = encode_error(make_trajectory(reward=math.nan))
    assert text == "trajectory.reward: expected a finite float, got nan"


def test_encode_rejects_bad_mask() -> None:
    text = encode_error(make_trajectory(3, loss_mask=[0, 1, 2]))
    assert text == "trajectory.loss_mask[2]: expected 0 or 1, got 2"


def test_encode_rejects_unequal_lengths() -> None:
    text = encode_error(make_trajectory(3, logprobs=[0.0]))
    assert text == "trajectory.logprobs: length 1 != len(token_ids) 3"


def test_encode_rejects_bool_in_int_array() -> None:
    text = encode_error(GenerateRequest("r", "e", [1, True], 4, 1.0, 1.0, []))
    assert text == "generate_request.prompt_ids[1]: expected int, got bool"


def test_encode_rejects_wrong_nested_record() -> None:
    text = encode_error(EnvInteract("s", ToolCall("1", "f", "{}")))  # type: ignore[arg-type]
    assert text == "env_interact.message: expected ChatMessage, got ToolCall"


def test_encode_rejects_unpackable_text() -> None:
    text = encode_error(EnvCancel("\ud800"))
    assert text.startswith("env_cancel: cannot pack")


def test_encode_rejects_bad_run() -> None:
    with pytest.raises(MessageError, match=r"^envelope.run: expected str, got int$"):
        encode(EnvStart("s", "t", 0), run=5)  # type: ignore[arg-type]


def test_decode_expecting_one_of_several_kinds() -> None:
    body = encode(StatusQuery("me"), run="r")
    assert decode(body, expect=(CheckpointQuery, StatusQuery)).payload == StatusQuery("me")
    with pytest.raises(MessageError, match="expected a checkpoint_query or heartbeat message"):
        decode(body, expect=(CheckpointQuery, Heartbeat))
