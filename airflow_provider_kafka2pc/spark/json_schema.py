"""Spark types and JSON Schemas: a JSON Schema derived from a struct column, and a column checked
against a given JSON Schema, by what Spark's ``to_json`` writes.

``to_json`` leaves a null field out of its object, so a field Spark may fill with null is optional
(not ``required``) when derived, and must be optional in a given schema. Only the keywords that say
what ``to_json`` writes are understood (``type``, ``properties``, ``required``, ``items``,
``additionalProperties``); a schema built with others (``oneOf``, ``$ref``, ...) is refused by name
rather than half-checked.
"""

from __future__ import annotations

from typing import Any

DRAFT = "http://json-schema.org/draft-07/schema#"
# JSON Schema type -> the Spark type names to_json writes as it.
_WRITES: dict[str, tuple[str, ...]] = {
    "string": ("string", "date", "timestamp", "timestamp_ntz", "binary"),
    "integer": ("tinyint", "smallint", "int", "bigint"),
    "number": ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal"),
    "boolean": ("boolean",),
    "object": ("struct", "map"),
    "array": ("array",),
}
_CHECKED = {"type", "properties", "required", "items", "additionalProperties"}
_ANNOTATIONS = {"$schema", "$id", "title", "description", "default", "examples", "format", "contentEncoding"}
_NULLABLE_FIX = (
    "make the column non-null (F.coalesce(col, default), or df.where(col.isNotNull()) before the struct), "
    'or drop it from the schema\'s "required"'
)


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
    for json_type in ("boolean", "integer", "string", "number"):
        if name in _WRITES[json_type]:
            extra = {"date": {"format": "date"}, "timestamp": {"format": "date-time"}}.get(name, {})
            return {"type": json_type, **extra}
    raise TypeError(f"Spark type {dt.simpleString()} has no JSON Schema counterpart kafka2pc derives")


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def check(data_type: Any, schema: Any, path: str) -> list[str]:
    """Why a column of ``data_type`` cannot be written as ``schema`` requires (empty: it can)."""
    problems: list[str] = []
    _check(data_type, schema, False, path, problems)
    return problems


def _types(schema: dict[str, Any]) -> tuple[set[str], bool]:
    given = schema.get("type")
    names = set(given) if isinstance(given, list) else {given} if given else set(_WRITES)
    return names - {"null"}, "null" in names or not given


def _check(dt: Any, schema: Any, nullable: bool, path: str, problems: list[str]) -> None:
    from pyspark.sql import types as T

    if not isinstance(schema, dict):
        return  # true/false schemas: nothing to check field by field
    unknown = sorted(k for k in schema if k not in _ANNOTATIONS and k not in _CHECKED)
    if unknown:
        problems.append(f"field {path!r}: the schema uses {unknown}, which kafka2pc cannot check against a DataFrame")
        return
    types, allows_null = _types(schema)
    if nullable and not allows_null:
        problems.append(f"field {path!r} may hold nulls but the schema does not allow null there: {_NULLABLE_FIX}")
    name = _type_name(dt)
    if not any(name in _WRITES.get(t, ()) for t in types):
        problems.append(f"field {path!r} is {dt.simpleString()} but the schema says {sorted(types)}: cast it")
        return
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
                _check(column.dataType, properties[field_name], False, sub, problems)
            elif schema.get("additionalProperties") is False:
                problems.append(f"field {sub!r} is not in the schema, which allows no other: drop it from the struct")
    elif isinstance(dt, T.ArrayType) and isinstance(schema.get("items"), dict):
        _check(dt.elementType, schema["items"], dt.containsNull, f"{path}[]", problems)
    elif isinstance(dt, T.MapType) and isinstance(schema.get("additionalProperties"), dict):
        _check(dt.valueType, schema["additionalProperties"], dt.valueContainsNull, f"{path}{{}}", problems)


def _type_name(dt: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return "struct"
    if isinstance(dt, (T.ArrayType, T.MapType)):
        return "array" if isinstance(dt, T.ArrayType) else "map"
    name = str(dt.simpleString())
    return "decimal" if name.startswith("decimal") else name


__all__ = ["DRAFT", "check", "derive"]
