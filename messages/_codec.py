"""msgpack codec for the wire records; the only module that imports msgpack.

Wire form: a msgpack map ``{"envelope": {...}, "payload": {...}}`` where each
record is a map of its field names. ``list[int]`` fields travel as ``bin`` of
little-endian int32 (0/1 masks as one byte per value) and ``list[float]``
fields as ``bin`` of little-endian float32; they decode back to Python lists.

One validator, `_convert`, walks a value alongside its type hint. Encoding
runs it over the records (checking and producing the wire form); decoding runs
it over the unpacked wire form (checking and rebuilding the records). The
rules per hint are listed in `agentrl.messages._records`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import types
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, overload

import msgpack
import numpy as np

from ._env_records import SessionReport, SessionsLost
from ._errors import MessageError
from ._records import (
    MASK01,
    PAYLOAD_TYPES,
    SCHEMA_VERSION,
    Envelope,
    Message,
    Payload,
    Trajectory,
)

__all__ = ["decode", "encode"]

P = TypeVar("P", bound=Payload)

_BY_KIND: dict[str, type[Payload]] = {cls.KIND: cls for cls in PAYLOAD_TYPES}
_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)
_JSON_MAX_DEPTH = 32
_BYTES = (bytes, bytearray, memoryview)
_SEQUENCES = (list, tuple)


def encode(payload: Payload, *, run: str, message_id: str | None = None) -> bytes:
    """Validate ``payload`` and pack it with a fresh envelope.

    The envelope gets the payload's ``KIND``, ``SCHEMA_VERSION``, ``message_id``
    (a uuid4 hex when None) and ``time.time()``. Raises `MessageError` when the
    payload is not a payload record or breaks the schema.
    """
    cls = type(payload)
    if _BY_KIND.get(getattr(cls, "KIND", None)) is not cls:
        raise MessageError(f"cannot encode {cls.__name__}: not a payload record")
    envelope = Envelope(
        kind=cls.KIND,
        schema=SCHEMA_VERSION,
        message_id=uuid.uuid4().hex if message_id is None else message_id,
        run=run,
        sent_at=time.time(),
    )
    wire = {
        "envelope": _convert(envelope, Envelope, "envelope", decoding=False),
        "payload": _convert(payload, cls, cls.KIND, decoding=False),
    }
    try:
        return msgpack.packb(wire, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MessageError(f"{cls.KIND}: cannot pack: {exc}") from exc


@overload
def decode(body: bytes, expect: None = None) -> Message[Payload]: ...
@overload
def decode(body: bytes, expect: type[P]) -> Message[P]: ...
@overload
def decode(body: bytes, expect: tuple[type[Payload], ...]) -> Message[Payload]: ...
def decode(
    body: bytes, expect: type[Payload] | tuple[type[Payload], ...] | None = None
) -> Message[Any]:
    """Unpack and validate a message; with ``expect`` (a kind or a tuple), require that kind.

    Raises `MessageError` naming the kind and field path on any problem.
    """
    if not isinstance(body, _BYTES):
        raise MessageError(f"message body: expected bytes, got {_type_name(body)}")
    try:
        wire = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        head = bytes(body[:16]).hex(" ")
        more = f" ... ({len(body)} bytes)" if len(body) > 16 else f" ({len(body)} bytes)"
        raise MessageError(f"message body: not valid msgpack ({why}); starts {head}{more}") from exc
    if not isinstance(wire, dict):
        raise MessageError(f"message body: expected a map, got {_type_name(wire)}")
    if set(wire) != {"envelope", "payload"}:
        keys = sorted(map(str, wire))
        raise MessageError(f"message body: expected keys envelope and payload, got {keys}")
    envelope = _convert(wire["envelope"], Envelope, "envelope", decoding=True)
    kind = envelope.kind
    if envelope.schema != SCHEMA_VERSION:
        raise MessageError(
            f"{kind}: schema version {envelope.schema} not supported (expected {SCHEMA_VERSION})"
        )
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise MessageError(f"envelope.kind: unknown kind {kind!r}")
    allowed = expect if isinstance(expect, tuple) else (expect,) if expect is not None else None
    if allowed is not None and cls not in allowed:
        names = " or ".join(c.KIND for c in allowed)
        raise MessageError(f"{kind}: expected a {names} message, got {kind}")
    payload = _convert(wire["payload"], cls, kind, decoding=True)
    return Message(envelope=envelope, payload=payload)


# --- the validator ------------------------------------------------------------


def _convert(value: Any, hint: Any, path: str, *, decoding: bool) -> Any:
    """Check ``value`` against ``hint``; return its wire form (or record form when decoding)."""
    origin = get_origin(hint)
    if origin is Annotated:
        base, *meta = get_args(hint)
        if MASK01 in meta:
            return _mask01(value, path, decoding=decoding)
        return _convert(value, base, path, decoding=decoding)
    if hint is str:
        return _expect_type(value, str, "str", path)
    if hint is bool:
        return _expect_type(value, bool, "bool", path)
    if hint is int:
        return _int(value, path)
    if hint is float:
        return _float(value, path, finite=True)
    if origin is Union or origin is types.UnionType:
        return _optional(value, hint, path, decoding=decoding)
    if origin is Literal:
        choices = get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise _error(path, f"expected one of {list(choices)}, got {value!r}")
        return value
    if origin is list:
        (item,) = get_args(hint)
        if item is int:
            return _int32_array(value, path, decoding=decoding)
        if item is float:
            return _float32_array(value, path, decoding=decoding)
        _expect_type(value, list if decoding else _SEQUENCES, "list", path)
        return [_convert(v, item, f"{path}[{i}]", decoding=decoding) for i, v in enumerate(value)]
    if origin is dict and get_args(hint) == (str, float):
        _expect_type(value, dict, "map", path)
        out = {}
        for key, v in value.items():
            _expect_type(key, str, "str key", path)
            out[key] = _float(v, f"{path}[{key!r}]", finite=False)
        return out
    if hint is dict:
        _json(value, path, depth=0)
        return value
    if dataclasses.is_dataclass(hint):
        return _record(value, hint, path, decoding=decoding)
    raise TypeError(f"{path}: unsupported type hint {hint!r}")


def _record(value: Any, cls: type, path: str, *, decoding: bool) -> Any:
    hints = _field_hints(cls)
    if decoding:
        _expect_type(value, dict, "map", path)
        missing = [name for name in hints if name not in value]
        if missing:
            raise _error(f"{path}.{missing[0]}", "missing field")
        extra = [key for key in value if key not in hints]
        if extra:
            raise _error(f"{path}.{extra[0]}", "unexpected field")
        record = cls(
            **{
                name: _convert(value[name], hint, f"{path}.{name}", decoding=True)
                for name, hint in hints.items()
            }
        )
        out = record
    else:
        if type(value) is not cls:
            raise _error(path, f"expected {cls.__name__}, got {_type_name(value)}")
        record = value
        out = {
            name: _convert(getattr(value, name), hint, f"{path}.{name}", decoding=False)
            for name, hint in hints.items()
        }
    check = _RECORD_CHECKS.get(cls)
    if check is not None:
        check(record, path)
    return out


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved type hint (with Annotated extras), ClassVars left out."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _optional(value: Any, hint: Any, path: str, *, decoding: bool) -> Any:
    args = [a for a in get_args(hint) if a is not type(None)]
    if len(args) != 1 or len(get_args(hint)) != 2:
        raise TypeError(f"{path}: only `X | None` unions are supported, got {hint!r}")
    if value is None:
        return None
    return _convert(value, args[0], path, decoding=decoding)


def _expect_type(value: Any, types_: type | tuple[type, ...], name: str, path: str) -> Any:
    if not isinstance(value, types_) or (types_ is not bool and isinstance(value, bool)):
        raise _error(path, f"expected {name}, got {_type_name(value)}")
    return value


def _int(value: Any, path: str) -> int:
    _expect_type(value, int, "int", path)
    if not _INT64[0] <= value <= _INT64[1]:
        raise _error(path, f"int {value} out of int64 range")
    return value


def _float(value: Any, path: str, *, finite: bool) -> float:
    _expect_type(value, (int, float), "float", path)
    value = float(value)
    if finite and not math.isfinite(value):
        raise _error(path, f"expected a finite float, got {value}")
    return value


def _int32_array(value: Any, path: str, *, decoding: bool) -> Any:
    if decoding:
        return np.frombuffer(_packed(value, 4, path), dtype="<i4").tolist()
    _expect_type(value, _SEQUENCES, "list", path)
    for i, v in enumerate(value):
        _expect_type(v, int, "int", f"{path}[{i}]")
        if not _INT32[0] <= v <= _INT32[1]:
            raise _error(f"{path}[{i}]", f"int {v} out of int32 range")
    return np.array(value, dtype="<i4").tobytes()


def _float32_array(value: Any, path: str, *, decoding: bool) -> Any:
    if decoding:
        values = np.frombuffer(_packed(value, 4, path), dtype="<f4")
        _check_finite(values, path, "")
        return values.tolist()
    _check_items(value, path, (int, float), "float")
    values = np.array(value, dtype=np.float64)
    _check_finite(values, path, "")
    with np.errstate(over="ignore"):
        packed = values.astype("<f4")
    _check_finite(packed, path, " (overflows float32)")
    return packed.tobytes()


def _mask01(value: Any, path: str, *, decoding: bool) -> Any:
    if decoding:
        values = list(_packed(value, 1, path))
    else:
        _check_items(value, path, int, "int")
        values = value
    for i, v in enumerate(values):
        if v != 0 and v != 1:
            raise _error(f"{path}[{i}]", f"expected 0 or 1, got {v}")
    return values if decoding else bytes(values)


def _packed(value: Any, itemsize: int, path: str) -> bytes:
    if not isinstance(value, bytes):
        raise _error(path, f"expected a packed array (bin), got {_type_name(value)}")
    if len(value) % itemsize:
        raise _error(path, f"packed array of {len(value)} bytes, not a multiple of {itemsize}")
    return value


def _check_items(value: Any, path: str, types_: type | tuple[type, ...], name: str) -> None:
    _expect_type(value, _SEQUENCES, "list", path)
    for i, v in enumerate(value):
        _expect_type(v, types_, name, f"{path}[{i}]")


def _check_finite(values: np.ndarray, path: str, note: str) -> None:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raise _error(f"{path}[{i}]", f"expected a finite float{note}, got {values[i]}")


def _json(value: Any, path: str, *, depth: int) -> None:
    """Check a JSON-like value: str keys; None, bool, int64, finite float, str, list, map."""
    if depth > _JSON_MAX_DEPTH:
        raise _error(path, f"nested deeper than {_JSON_MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        _int(value, path)
    elif isinstance(value, float):
        _float(value, path, finite=True)
    elif isinstance(value, _SEQUENCES):
        for i, v in enumerate(value):
            _json(v, f"{path}[{i}]", depth=depth + 1)
    elif isinstance(value, dict):
        for key, v in value.items():
            _expect_type(key, str, "str key", path)
            _json(v, f"{path}[{key!r}]", depth=depth + 1)
    else:
        raise _error(path, f"expected a JSON-like value, got {_type_name(value)}")


# --- cross-field rules --------------------------------------------------------


def _check_trajectory(record: Trajectory, path: str) -> None:
    length = len(record.token_ids)
    for name in ("loss_mask", "logprobs", "versions"):
        other = len(getattr(record, name))
        if other != length:
            raise _error(f"{path}.{name}", f"length {other} != len(token_ids) {length}")


def _check_parallel(names: tuple[str, ...], optional: tuple[str, ...] = ()):
    """A rule: the listed fields have one entry per session (``optional`` ones may be empty)."""

    def check(record: Any, path: str) -> None:
        length = len(getattr(record, names[0]))
        for name in names[1:] + optional:
            other = len(getattr(record, name))
            if other != length and not (name in optional and other == 0):
                raise _error(f"{path}.{name}", f"length {other} != len({names[0]}) {length}")

    return check


_RECORD_CHECKS: dict[type, Callable[[Any, str], None]] = {
    Trajectory: _check_trajectory,
    SessionReport: _check_parallel(("session_ids", "idle"), ("workers", "episodes", "tasks")),
    SessionsLost: _check_parallel(("session_ids", "reasons")),
}
"""Record class -> rule over several of its fields, run after the per-field checks."""


def _error(path: str, detail: str) -> MessageError:
    return MessageError(f"{path}: {detail}")


def _type_name(value: Any) -> str:
    return type(value).__name__
