"""Typed parsing of plain YAML data into (nested) dataclasses, collecting every problem.

``build_dataclass(cls, raw, where, problems)`` converts a mapping into ``cls``
following its type hints (dataclasses, ``X | None``, ``list[X]``,
``dict[str, X]``, ``int``, ``float``, ``str``, ``bool``). Each problem is
appended to ``problems`` with its dotted path, and a field with a type problem
keeps its default, so the caller's semantic checks still see every other
value: one pass reports everything.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

__all__ = ["build_dataclass"]

_INVALID = object()
"""A value with a type problem (already reported); the field keeps its default."""


def build_dataclass(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        label = where.rstrip(".") or "top level"
        problems.append(f"{label}: expected a mapping, got {type(raw).__name__}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            known = ", ".join(sorted(fields))
            problems.append(f"{where}{key}: unknown key (known: {known})")
    values = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{where}{name}: required")
            continue
        value = _convert(hints[name], raw[name], f"{where}{name}", problems)
        if value is not _INVALID:
            values[name] = value
    try:
        return cls(**values)
    except TypeError:  # a required field is missing: already reported
        return None


def _convert(tp: Any, value: Any, where: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where, problems)
        for member in inner:  # the first member the value fits (`bool | str`: true or auto)
            tried: list[str] = []
            converted = _convert(member, value, where, tried)
            if converted is not _INVALID and not tried:
                return converted
        names = " or ".join(getattr(a, "__name__", str(a)) for a in inner)
        problems.append(f"{where}: expected {names}, got {value!r}")
        return _INVALID
    if dataclasses.is_dataclass(tp):
        built = build_dataclass(tp, value, f"{where}.", problems)
        return _INVALID if built is None else built
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {type(value).__name__}")
            return _INVALID
        items = [_convert(item_tp, v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
        return _INVALID if any(v is _INVALID for v in items) else items
    if origin is dict:
        _key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a mapping, got {type(value).__name__}")
            return _INVALID
        if val_tp is Any:
            return dict(value)
        items = {str(k): _convert(val_tp, v, f"{where}.{k}", problems) for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _INVALID}
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads `1e-5` as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, str, bool) and isinstance(value, tp) and not (tp is int and type(value) is bool):
        return value
    problems.append(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")
    return _INVALID
