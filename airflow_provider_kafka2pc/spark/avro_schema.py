"""Spark types and Avro schemas: an Avro schema derived from a column's type, and a column checked
against a given Avro schema, by the pairs spark-avro's ``to_avro`` encodes.

A field Spark may fill with null is a union ``["null", T]`` (default null) when derived; against a given
schema it must meet a union with null, or ``to_avro`` would fail on the first null inside a task.
"""

from __future__ import annotations

from typing import Any

# Avro type -> the Spark type names spark-avro's serializer writes as it (AvroSerializer.newConverter).
_ENCODES: dict[str, tuple[str, ...]] = {
    "boolean": ("boolean",),
    "int": ("byte", "short", "int", "date"),
    "long": ("bigint", "timestamp", "timestamp_ntz"),
    "float": ("float",),
    "double": ("double",),
    "string": ("string",),
    "enum": ("string",),
    "bytes": ("binary", "decimal"),
    "fixed": ("binary", "decimal"),
}
_NULLABLE_FIX = (
    "make the column non-null (F.coalesce(col, default), or df.where(col.isNotNull()) before the struct), "
    'or make the schema\'s field a union with "null"'
)


def derive(data_type: Any, record_name: str) -> Any:
    """The Avro schema (as JSON-ready data) of a column of ``data_type``; the column's own nullability
    is not part of it (a null column value is a null record)."""
    return _avro(data_type, record_name)


def _avro(dt: Any, name: str) -> Any:
    from pyspark.sql import types as T

    simple = {
        T.BooleanType: "boolean",
        T.ByteType: "int",
        T.ShortType: "int",
        T.IntegerType: "int",
        T.LongType: "long",
        T.FloatType: "float",
        T.DoubleType: "double",
        T.StringType: "string",
        T.BinaryType: "bytes",
    }
    for spark_type, avro in simple.items():
        if isinstance(dt, spark_type):
            return avro
    if isinstance(dt, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(dt, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(dt, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(dt, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dt.precision, "scale": dt.scale}
    if isinstance(dt, T.ArrayType):
        return {"type": "array", "items": _nullable(_avro(dt.elementType, f"{name}_item"), dt.containsNull)}
    if isinstance(dt, T.MapType):
        if not isinstance(dt.keyType, T.StringType):
            raise TypeError(f"Avro maps have string keys; {name} is {dt.simpleString()}")
        return {"type": "map", "values": _nullable(_avro(dt.valueType, f"{name}_value"), dt.valueContainsNull)}
    if isinstance(dt, T.StructType):
        namespace, _, short = name.rpartition(".")
        fields = []
        for f in dt.fields:
            avro = _nullable(_avro(f.dataType, f"{short}_{f.name}"), f.nullable)
            field: dict[str, Any] = {"name": f.name, "type": avro}
            if f.nullable:
                field["default"] = None
            fields.append(field)
        record: dict[str, Any] = {"type": "record", "name": short, "fields": fields}
        if namespace:
            record["namespace"] = namespace
        return record
    raise TypeError(f"{name}: Spark type {dt.simpleString()} has no Avro counterpart kafka2pc derives")


def _nullable(avro: Any, nullable: bool) -> Any:
    return ["null", avro] if nullable else avro


def check(data_type: Any, schema: Any, path: str) -> list[str]:
    """Why a column of ``data_type`` cannot be encoded with Avro ``schema`` (empty: it can). Each
    problem names the field, the cause and the fix."""
    problems: list[str] = []
    _check(data_type, schema, False, path, problems)
    return problems


def _check(dt: Any, schema: Any, nullable: bool, path: str, problems: list[str]) -> None:
    from pyspark.sql import types as T

    if isinstance(schema, list):  # a union: kafka2pc encodes null + one type
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            problems.append(f'field {path!r}: a union of {schema} is not supported; use ["null", T] or T')
            return
        _check(dt, branches[0], False, path, problems)
        return
    if nullable:
        problems.append(f"field {path!r} may hold nulls but the schema's field is not nullable: {_NULLABLE_FIX}")
    avro_type = schema.get("type") if isinstance(schema, dict) else schema
    if isinstance(avro_type, (dict, list)):  # {"type": {"type": "record", ...}}
        _check(dt, avro_type, False, path, problems)
        return
    if avro_type == "record":
        if not isinstance(dt, T.StructType):
            problems.append(f"field {path!r} is {dt.simpleString()} but the schema has a record: make it a struct")
            return
        columns = {f.name: f for f in dt.fields}
        names = [str(f["name"]) for f in schema.get("fields", [])]
        for f in schema.get("fields", []):
            sub = f"{path}.{f['name']}"
            column = columns.get(str(f["name"]))
            if column is None:
                problems.append(f"field {sub!r} of the schema is missing from the DataFrame: add it to the struct")
                continue
            _check(column.dataType, f["type"], column.nullable, sub, problems)
        for extra in [n for n in columns if n not in names]:
            problems.append(f"field '{path}.{extra}' is not in the schema: drop it from the struct")
        return
    if avro_type == "array":
        if not isinstance(dt, T.ArrayType):
            problems.append(f"field {path!r} is {dt.simpleString()} but the schema has an array")
            return
        _check(dt.elementType, schema["items"], dt.containsNull, f"{path}[]", problems)
        return
    if avro_type == "map":
        if not isinstance(dt, T.MapType) or not isinstance(dt.keyType, T.StringType):
            problems.append(f"field {path!r} is {dt.simpleString()} but the schema has a map with string keys")
            return
        _check(dt.valueType, schema["values"], dt.valueContainsNull, f"{path}{{}}", problems)
        return
    allowed = _ENCODES.get(str(avro_type))
    if allowed is None:
        problems.append(f"field {path!r}: Avro type {avro_type!r} is not supported")
    elif _type_name(dt) not in allowed:
        problems.append(
            f"field {path!r} is {dt.simpleString()} but the schema says {avro_type}: cast it to {' or '.join(allowed)}"
        )


def _type_name(dt: Any) -> str:
    name = dt.simpleString()
    return "decimal" if name.startswith("decimal") else name


__all__ = ["check", "derive"]
