"""A diagnosis's section as a frozen dataclass, and the three things read from its type:
its report.json value, the section read back from that value, and its JSON Schema.

    to_json(section)          dataclass -> dict in field order (report.json keeps that order),
                              tuples -> lists, nested dataclasses -> dicts
    from_json(Cls, value)     the inverse, driven by the field types
    json_schema(Cls)          {"type": "object", "additionalProperties": false, "required": [every
                              field], "properties": {...}}: int -> integer, float -> number,
                              str -> string, bool -> boolean, X | None -> [X, null],
                              tuple[X, ...] -> array of X, dict[str, X] -> object of X values,
                              a dataclass -> a nested object

A field's report key is its name unless `key(...)` renames it (a Python keyword such as
"from"); `key(..., schema={...})` or `meta(schema={...})` adds constraints (minimum, pattern)
to what the type gives. Two kinds of field whose key may be absent (the schema requires
neither):

    optional()   an `X | None` written only when set: None leaves its key out
    inline()     a `Group | None` (a dataclass) whose keys sit in the parent's object, all of
                 them there or none: {"a": 1} + Group(b=2, c=None) -> {"a": 1, "b": 2, "c": null};
                 read back as present when the group's first key is
    spread()     a `dict[str, X]` (or bare `dict`) whose entries sit in the parent's object at the
                 field's place: {"a": 1} + {"x": 2, "y": 3} + {"z": 4} -> {"a": 1, "x": 2, "y": 3, "z": 4};
                 read back as every parent key no other field claims; the schema admits those keys
                 as X (bare dict: any value), so the parent's object accepts keys beyond its fields

`internal(default)` marks a field the run fills for the verdicts (the trained layout's keys)
that report.json does not hold: skipped by all three, read back as its default.

Worked example:

    @dataclass(frozen=True)
    class Span:
        start: int = key("from", schema={"minimum": 0})
        period: int
    to_json(Span(3, 2)) == {"from": 3, "period": 2}
    json_schema(Span)["properties"]["from"] == {"type": "integer", "minimum": 0}

This module knows dataclasses and JSON Schema; nothing about diagnoses, models or files.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import MISSING, field, fields, is_dataclass

CI95 = {"minItems": 2, "maxItems": 2}            # a 95% interval [lo, hi]
TREE = {"pattern": "^(chain-[0-9]+|s[0-9]+-k[0-9]+-d[0-9]+)$"}
COUNT = {"minimum": 0}
RATE = {"minimum": 0, "maximum": 1}
AT_LEAST_ONE = {"minimum": 1}
POSITIVE = {"exclusiveMinimum": 0}


def meta(*, schema: dict | None = None, default=MISSING):
    """A field with schema constraints beside its type."""
    return field(metadata={"schema": schema or {}}, **({} if default is MISSING else {"default": default}))


def key(name: str, *, schema: dict | None = None):
    """A field written under another report key (e.g. the keyword "from")."""
    return field(metadata={"key": name, "schema": schema or {}})


def optional(*, schema: dict | None = None):
    """A field (default None) whose key report.json holds only when it is set."""
    return field(default=None, metadata={"optional": True, "schema": schema or {}})


def inline():
    """A dataclass field (default None) written as its own keys in the parent's object, or not at all."""
    return field(default=None, metadata={"inline": True, "schema": {}})
def spread():
    """A dict field whose entries are written as keys of the parent's object, at the field's place."""
    return field(metadata={"spread": True, "schema": {}})


def internal(default):
    """A field kept in memory for the verdicts, not written to report.json (read back as `default`)."""
    return field(default=default, compare=False, metadata={"internal": True})


def _fields(value) -> list[dataclasses.Field]:
    """The fields report.json holds: every field but the internal ones."""
    return [f for f in fields(value) if not f.metadata.get("internal")]


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def to_json(value):
    """A section (or any value inside one) as report.json holds it."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in _fields(value):
            v = getattr(value, f.name)
            if v is None and (f.metadata.get("optional") or f.metadata.get("inline")):
                continue
            grouped = f.metadata.get("inline") or f.metadata.get("spread")
            out.update(to_json(v) if grouped else {_key(f): to_json(v)})
        return out
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _args(tp) -> tuple:
    return typing.get_args(tp)


def _is_optional(tp) -> bool:
    return _origin(tp) in (typing.Union, types.UnionType) and type(None) in _args(tp)


def _origin(tp):
    return typing.get_origin(tp)


def _inner(tp):
    """X of `X | None`."""
    rest = [a for a in _args(tp) if a is not type(None)]
    return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]


def from_json(tp, value):
    """The typed value of `value` (report.json's), read as type `tp`."""
    if value is None:
        return None
    if _is_optional(tp):
        return from_json(_inner(tp), value)
    if is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: _spread(tp, hints[f.name], value) if f.metadata.get("spread")
                     else _field(f, hints[f.name], value) for f in _fields(tp)})
    if _origin(tp) is dict and _args(tp):
        return {k: from_json(_args(tp)[1], v) for k, v in value.items()}
    if _origin(tp) is tuple:
        a = _args(tp)
        item = a[0] if len(a) == 2 and a[1] is Ellipsis else None
        return tuple(from_json(item if item is not None else a[i], v) for i, v in enumerate(value))
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def _claimed(cls) -> set[str]:
    """The report keys the fields of `cls` (inline groups' included) write, spread fields aside."""
    hints, out = _hints(cls), set()
    for f in _fields(cls):
        if f.metadata.get("inline"):
            out |= _claimed(_inner(hints[f.name]))
        elif not f.metadata.get("spread"):
            out.add(_key(f))
    return out


def _spread(cls, tp, parent: dict) -> dict:
    """A spread field read back: the parent's keys that no other field of `cls` claims, in order."""
    claimed = _claimed(cls)
    return from_json(tp, {k: v for k, v in parent.items() if k not in claimed})


def _field(f: dataclasses.Field, tp, parent: dict):
    """One field's value read out of its parent object (an inline group from the parent itself)."""
    if f.metadata.get("inline"):
        group = _inner(tp)
        return from_json(group, parent) if _key(fields(group)[0]) in parent else None
    if f.metadata.get("optional"):
        return from_json(tp, parent.get(_key(f)))
    return from_json(tp, parent[_key(f)])


SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}


def json_schema(tp, extra: dict | None = None) -> dict:
    """The JSON Schema of type `tp` (module docstring), `extra` merged in at this level."""
    extra = dict(extra or {})
    if _is_optional(tp):
        inner = json_schema(_inner(tp), extra)
        if "type" in inner and not is_dataclass(_inner(tp)):
            t = inner["type"]
            return {**inner, "type": [*(t if isinstance(t, list) else [t]), "null"]}
        return {"oneOf": [{"type": "null"}, inner]}
    if is_dataclass(tp):
        hints, props, required, more = _hints(tp), {}, [], False
        for f in _fields(tp):
            if f.metadata.get("spread"):
                more = json_schema(hints[f.name]).get("additionalProperties", True)
            elif f.metadata.get("inline"):
                props.update(json_schema(_inner(hints[f.name]))["properties"])
            elif f.metadata.get("optional"):
                props[_key(f)] = json_schema(_inner(hints[f.name]), f.metadata.get("schema"))
            else:
                props[_key(f)] = json_schema(hints[f.name], f.metadata.get("schema"))
                required.append(_key(f))
        return {"type": "object", "additionalProperties": more, "required": required, "properties": props, **extra}
    if _origin(tp) is tuple:
        a = _args(tp)
        if len(a) == 2 and a[1] is Ellipsis:
            item_extra = extra.pop("items", None)
            return {"type": "array", "items": json_schema(a[0], item_extra), **extra}
        return {"type": "array", "items": json_schema(a[0]), "minItems": len(a), "maxItems": len(a), **extra}
    if tp in SCALARS:
        return {"type": SCALARS[tp], **extra}
    if _origin(tp) is dict and _args(tp):
        return {"type": "object", "additionalProperties": json_schema(_args(tp)[1]), **extra}
    if tp is dict:
        return {"type": "object", **extra}
    raise TypeError(f"no JSON Schema for {tp!r}: use int, float, str, bool, tuples, dataclasses and | None")
