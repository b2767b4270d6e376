"""Spark types and JSON Schemas: a JSON Schema derived from a struct column, and a column checked
against a given JSON Schema, by what Spark's ``to_json`` writes with ``TO_JSON_OPTIONS``.

``to_json`` leaves a null field out of its object, so a field Spark may fill with null is optional
(not ``required``) when derived, and must be optional in a given schema. A double or float NaN,
Infinity or -Infinity is written as the JSON string "NaN", "Infinity" or "-Infinity" (JSON has no
such numbers), so a derived float or double is ``anyOf`` a number and those three strings. A
timestamp is an instant, written in UTC with its microseconds and an explicit offset ("Z"), a
``format: date-time``; a timestamp_ntz a local date-time without offset, its own ``pattern``; a
binary base64 text, ``contentEncoding: base64``.

Only the keywords that say what ``to_json`` writes are understood (``type``, ``properties``,
``required``, ``items``, ``additionalProperties``; for a single value also ``enum``, ``format``,
``pattern``, ``contentEncoding``, ``anyOf`` and ``oneOf``); a schema built with others (``$ref``,
``minimum``, ...) is refused by name rather than half-checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

DRAFT = "http://json-schema.org/draft-07/schema#"
NON_FINITE = ("NaN", "Infinity", "-Infinity")
NTZ_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}$"
# In UTC: an offset written with XXX drops seconds, and zones had odd ones before 1900 (Asia/Kolkata
# was +05:53:28), which would shift the instant; UTC also makes the bytes independent of the session.
# All three options exist since Spark 3.3 (timestampNTZFormat) and 2.2 (the others).
TO_JSON_OPTIONS = {
    "ignoreNullFields": "true",  # whatever the session's default: the derived schema makes them optional
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timeZone": "UTC",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}
_CONTAINERS: dict[str, str] = {"struct": "object", "map": "object", "array": "array"}
_CHECKED = {"type", "properties", "required", "items", "additionalProperties"}
_VALUE_CHECKED = {*_CHECKED, "enum", "format", "pattern", "contentEncoding", "anyOf", "oneOf"}
_ANNOTATIONS = {"$schema", "$id", "title", "description", "default", "examples", "$comment", "contentMediaType"}
_CANNOT = "which kafka2pc cannot check against a DataFrame"
_NULLABLE_FIX = (
    "make the column non-null (F.coalesce(col, default), or df.where(col.isNotNull()) before the struct), "
    'or drop it from the schema\'s "required"'
)
# A path to a value inside the column: a struct's field name, or None for an array's element or a
# map's value.
Steps = tuple[str | None, ...]


@dataclass(frozen=True)
class _Kind:
    """One kind of JSON value ``to_json`` writes for a Spark type."""

    json_type: str
    samples: tuple[Any, ...] | None = None  # every form it takes (fixed-form text); None: any value
    format: str | None = None
    encoding: str | None = None
    shown: str = ""  # how the message names it

    @property
    def free(self) -> bool:
        return self.samples is None


_NULL = _Kind("null", (None,))
_NON_FINITE = _Kind("string", NON_FINITE, shown='NaN or ±Infinity, written as "NaN", "Infinity", "-Infinity"')
_INTEGER = (_Kind("integer"),)
_KINDS: dict[str, tuple[_Kind, ...]] = {
    "boolean": (_Kind("boolean", (True, False)),),
    "tinyint": _INTEGER,
    "smallint": _INTEGER,
    "int": _INTEGER,
    "bigint": _INTEGER,
    "decimal": (_Kind("number"),),
    "float": (_Kind("number"), _NON_FINITE),
    "double": (_Kind("number"), _NON_FINITE),
    "string": (_Kind("string"),),
    "date": (_Kind("string", ("2026-01-31", "0001-01-01"), "date", shown="'2026-01-31'"),),
    "timestamp": (
        _Kind(
            "string",
            ("2026-01-31T18:29:59.123456Z", "0001-01-01T00:00:00.000000Z"),
            "date-time",
            shown="'2026-01-31T18:29:59.123456Z' (an instant, in UTC)",
        ),
    ),
    "timestamp_ntz": (
        _Kind(
            "string",
            ("2026-01-31T23:59:59.123456", "0001-01-01T00:00:00.000000"),
            shown="'2026-01-31T23:59:59.123456' (a local date-time, without offset)",
        ),
    ),
    "binary": (_Kind("string", ("AAH/", "", "aGk="), encoding="base64", shown="base64 text ('AAH/')"),),
}


@dataclass
class Fit:
    """How a column fits a given schema: ``problems`` (empty: it does), and the float or double values
    whose schema takes numbers but not "NaN"/"Infinity"/"-Infinity": the rows must hold none there."""

    problems: list[str] = field(default_factory=list)
    finite_only: list[tuple[str, Steps]] = field(default_factory=list)


def derive(data_type: Any, title: str) -> dict[str, Any]:
    """The JSON Schema (draft-07) of a struct column; its null fields are optional."""
    from pyspark.sql import types as T

    if not isinstance(data_type, T.StructType):
        raise TypeError(f"JSON Schema values are objects: the column must be a struct, not {data_type.simpleString()}")
    return {"$schema": DRAFT, "title": title, **_json(data_type)}


def _json(dt: Any) -> dict[str, Any]:
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return {
            "type": "object",
            "properties": {f.name: _json(f.dataType) for f in dt.fields},
            "required": [f.name for f in dt.fields if not f.nullable],
            "additionalProperties": False,
        }
    if isinstance(dt, T.ArrayType):
        items = _json(dt.elementType)
        return {"type": "array", "items": _or_null(items) if dt.containsNull else items}
    if isinstance(dt, T.MapType):
        values = _json(dt.valueType)
        return {"type": "object", "additionalProperties": _or_null(values) if dt.valueContainsNull else values}
    name = _type_name(dt)
    if name in ("float", "double"):
        return {"anyOf": [{"type": "number"}, {"type": "string", "enum": list(NON_FINITE)}]}
    if name == "timestamp_ntz":
        return {"type": "string", "pattern": NTZ_PATTERN}
    if name == "binary":
        return {"type": "string", "contentEncoding": "base64"}
    if name in _KINDS:
        [kind] = _KINDS[name]
        return {"type": kind.json_type, **({"format": kind.format} if kind.format else {})}
    raise TypeError(f"Spark type {dt.simpleString()} has no JSON Schema counterpart kafka2pc derives")


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in schema:
        return {"anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {**schema, "type": [schema["type"], "null"]}


def check(data_type: Any, schema: Any, path: str) -> list[str]:
    """Why a column of ``data_type`` cannot be written as ``schema`` requires (empty: it can, but for
    the non-finite values ``fit`` names)."""
    return fit(data_type, schema, path).problems


def fit(data_type: Any, schema: Any, path: str) -> Fit:
    """How a column of ``data_type`` fits ``schema``: what cannot be written, and where the rows must
    hold no NaN or ±Infinity."""
    out = Fit()
    _check(data_type, schema, False, path, (), out)
    return out


def non_finite_problem(path: str, rows: int, total: int) -> str:
    """The sentence for a float or double field that holds values its schema cannot take."""
    return (
        f"field {path!r} holds NaN, Infinity or -Infinity in {rows} of {total} rows, which to_json writes as "
        'the strings "NaN", "Infinity", "-Infinity", which the schema does not take there: replace them '
        "(e.g. F.when(F.isnan(c) | (F.abs(c) == float('inf')), None).otherwise(c), and make the field "
        'optional), or let the schema take them (anyOf: [{"type": "number"}, {"enum": ["NaN", "Infinity", '
        '"-Infinity"]}], as a derived schema does)'
    )


def _types(schema: dict[str, Any]) -> tuple[set[str], bool]:
    given = schema.get("type")
    names = set(given) if isinstance(given, list) else {given} if given else {"object", "array"}
    return names - {"null"}, "null" in names or not given


def _check(dt: Any, schema: Any, nullable: bool, path: str, steps: Steps, out: Fit) -> None:
    from pyspark.sql import types as T

    if not isinstance(schema, dict):
        return  # true/false schemas: nothing to check field by field
    name = _type_name(dt)
    if name not in _CONTAINERS:
        _check_value(dt, schema, nullable, path, steps, out)
        return
    problems = out.problems
    unknown = sorted(k for k in schema if k not in _ANNOTATIONS and k not in _CHECKED)
    if unknown:
        problems.append(f"field {path!r}: the schema uses {unknown}, which kafka2pc cannot check against a DataFrame")
        return
    types, allows_null = _types(schema)
    if nullable and not allows_null:
        problems.append(f"field {path!r} may hold nulls but the schema does not allow null there: {_NULLABLE_FIX}")
    if _CONTAINERS[name] not in types:
        problems.append(f"field {path!r} is {dt.simpleString()} but the schema says {sorted(types)}: cast it")
        return
    extra = schema.get("additionalProperties")
    if isinstance(dt, T.StructType):
        properties = schema.get("properties") or {}
        columns = {f.name: f for f in dt.fields}
        for required in schema.get("required") or []:
            column = columns.get(required)
            if column is None:
                problems.append(f"field '{path}.{required}' is required but missing: add it to the struct")
            elif column.nullable:
                problems.append(
                    f"field '{path}.{required}' is required but may hold nulls, which to_json leaves out: "
                    + _NULLABLE_FIX
                )
        for field_name, column in columns.items():
            sub = f"{path}.{field_name}"
            if field_name in properties:
                _check(column.dataType, properties[field_name], False, sub, (*steps, field_name), out)
            elif extra is False:
                problems.append(f"field {sub!r} is not in the schema, which allows no other: drop it from the struct")
            elif isinstance(extra, dict):
                _check(column.dataType, extra, False, sub, (*steps, field_name), out)
    elif isinstance(dt, T.ArrayType) and isinstance(schema.get("items"), dict):
        _check(dt.elementType, schema["items"], dt.containsNull, f"{path}[]", (*steps, None), out)
    elif isinstance(dt, T.MapType) and isinstance(extra, dict):
        _check(dt.valueType, extra, dt.valueContainsNull, f"{path}{{}}", (*steps, None), out)


def _check_value(dt: Any, schema: dict[str, Any], nullable: bool, path: str, steps: Steps, out: Fit) -> None:
    """A single value (not an object or array): every kind of JSON value to_json writes for its type
    must be taken by the schema, but NaN and ±Infinity, which only the rows can rule out."""
    unknown = _unknown(schema)
    if unknown:
        out.problems.append(
            f"field {path!r}: the schema uses {unknown}, which kafka2pc cannot check against a DataFrame"
        )
        return
    if nullable and _refusal(schema, _NULL):
        out.problems.append(f"field {path!r} may hold nulls but the schema does not allow null there: {_NULLABLE_FIX}")
    name = _type_name(dt)
    kinds = _KINDS.get(name)
    if kinds is None:
        out.problems.append(f"field {path!r} is {dt.simpleString()}, which kafka2pc does not write as JSON: cast it")
        return
    for kind in kinds:
        why = _refusal(schema, kind)
        if why is None:
            continue
        if kind is _NON_FINITE:
            out.finite_only.append((path, steps))
        else:
            out.problems.append(f"field {path!r} is {dt.simpleString()} but {why}")
            return


def _unknown(schema: dict[str, Any]) -> list[str]:
    found = {k for k in schema if k not in _ANNOTATIONS and k not in _VALUE_CHECKED}
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            if isinstance(branch, dict):
                found.update(_unknown(branch))
    return sorted(found)


def _refusal(schema: Any, kind: _Kind) -> str | None:
    """Why ``schema`` does not take every value of ``kind`` (None: it does)."""
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        return "the schema is false"
    written = f"to_json writes it as {kind.shown}" if kind.shown else ""
    given = schema.get("type")
    types = set(given) if isinstance(given, list) else {given} if given else None
    if types is not None and kind.json_type not in types and not (kind.json_type == "integer" and "number" in types):
        return f"{written + ', and ' if written else ''}the schema says {sorted(types)}: cast it"
    if "enum" in schema:
        if kind.free and not any(_json_type(v) == kind.json_type for v in schema["enum"]):
            return f"the schema's enum holds no {kind.json_type}"
        if kind.free:
            return f"the schema lists its values (enum), {_CANNOT}"
        lacking = [s for s in kind.samples or () if s not in schema["enum"]]
        if lacking:
            return f"the schema's enum lacks {lacking}: add them"
    if kind.json_type == "string":
        why = _text_refusal(schema, kind, written)
        if why:
            return why
    for key in ("anyOf", "oneOf"):
        if key not in schema:
            continue
        branches = [_refusal(b, kind) for b in schema[key]]
        taking = sum(1 for b in branches if b is None)
        unsure = [b for b in branches if b and _CANNOT in b]
        if key == "oneOf" and taking == 1 and unsure:  # maybe two take it: oneOf would refuse the value
            return unsure[0]
        if taking == 0:
            return f"no branch of the schema's {key} takes it ({'; '.join(str(b) for b in branches)})"
        if key == "oneOf" and taking > 1:
            return (
                f"{taking} branches of the schema's oneOf take it, where oneOf takes a value only one does: use anyOf"
            )
    return None


def _text_refusal(schema: dict[str, Any], kind: _Kind, written: str) -> str | None:
    """A string value against ``format``, ``contentEncoding`` and ``pattern``: text kafka2pc writes in a
    fixed form must meet them; a string column's text is the user's to vouch for, but for a pattern."""
    fmt, encoding, pattern = schema.get("format"), schema.get("contentEncoding"), schema.get("pattern")
    if fmt is not None and not kind.free and fmt != kind.format:
        return f"{written}, not format {fmt!r}: drop or fix the schema's format, or cast the column"
    if encoding is not None and not kind.free and encoding != kind.encoding:
        return f"{written}, not contentEncoding {encoding!r}: drop or fix the schema's contentEncoding"
    if pattern is None:
        return None
    if kind.free:
        return f"the schema gives a pattern, {_CANNOT}"
    unmatched = [s for s in kind.samples or () if not re.search(str(pattern), s)]
    if unmatched:
        return f"{written}, and the schema's pattern {pattern!r} does not match {unmatched[0]!r}: fix the pattern"
    return None


def _json_type(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, (int, float)):
        return "integer" if isinstance(value, int) else "number"
    return "string" if isinstance(value, str) else "object"


def _type_name(dt: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return "struct"
    if isinstance(dt, (T.ArrayType, T.MapType)):
        return "array" if isinstance(dt, T.ArrayType) else "map"
    name = str(dt.simpleString())
    return "decimal" if name.startswith("decimal") else name


__all__ = [
    "DRAFT",
    "NON_FINITE",
    "NTZ_PATTERN",
    "TO_JSON_OPTIONS",
    "Fit",
    "check",
    "derive",
    "fit",
    "non_finite_problem",
]
