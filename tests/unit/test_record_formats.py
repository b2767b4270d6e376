"""Schemas derived from Spark types, Spark types checked against given schemas, and the registry
header: pure, no JVM (pyspark's type classes only)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from pyspark.sql import types as T

from airflow_provider_kafka2pc.registry.formats import default_record_name
from airflow_provider_kafka2pc.spark import avro_schema, json_schema
from airflow_provider_kafka2pc.spark.record_formats import header, needs_avro_package

ORDER = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("name", T.StringType(), False),
        T.StructField("amount", T.DoubleType(), True),
        T.StructField("tags", T.ArrayType(T.StringType(), False), False),
        T.StructField("day", T.DateType(), True),
        T.StructField("price", T.DecimalType(10, 2), False),
        T.StructField("attrs", T.MapType(T.StringType(), T.IntegerType(), True), False),
        T.StructField("ship", T.StructType([T.StructField("city", T.StringType(), False)]), True),
    ]
)


def test_the_header_is_magic_byte_zero_then_the_id_big_endian() -> None:
    assert header(1) == b"\x00\x00\x00\x00\x01"
    assert header(0x01020304) == b"\x00\x01\x02\x03\x04"
    assert struct.unpack(">bI", header(2**31 + 5)) == (0, 2**31 + 5)


def test_an_avro_schema_derived_from_a_struct_is_valid_avro_and_nullable_fields_are_unions() -> None:
    import fastavro

    schema = avro_schema.derive(ORDER, "shop.Order")
    fastavro.parse_schema(schema)  # raises on an invalid schema
    fields = {f["name"]: f for f in schema["fields"]}
    assert (schema["name"], schema["namespace"]) == ("Order", "shop")
    assert fields["id"] == {"name": "id", "type": "long"}
    assert fields["amount"] == {"name": "amount", "type": ["null", "double"], "default": None}
    assert fields["tags"]["type"] == {"type": "array", "items": "string"}
    assert fields["day"]["type"] == ["null", {"type": "int", "logicalType": "date"}]
    assert fields["price"]["type"] == {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    assert fields["attrs"]["type"] == {"type": "map", "values": ["null", "int"]}
    assert fields["ship"]["type"][1]["type"] == "record" and fields["ship"]["default"] is None
    assert avro_schema.check(ORDER, schema, "value") == []  # a derived schema fits its frame
    assert avro_schema.derive(T.StringType(), "k") == "string"


def test_a_json_schema_derived_from_a_struct_is_valid_and_null_fields_are_optional() -> None:
    import jsonschema

    schema = json_schema.derive(ORDER, "Order")
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["title"] == "Order" and schema["additionalProperties"] is False
    assert schema["required"] == ["id", "name", "tags", "price", "attrs"]
    assert schema["properties"]["day"] == {"type": "string", "format": "date"}
    assert schema["properties"]["attrs"]["additionalProperties"] == {"type": ["integer", "null"]}
    assert json_schema.check(ORDER, schema, "value") == []
    with pytest.raises(TypeError, match="must be a struct"):
        json_schema.derive(T.StringType(), "k")


GIVEN = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}


def _struct(**fields: tuple[Any, bool]) -> T.StructType:
    return T.StructType([T.StructField(n, t, nullable) for n, (t, nullable) in fields.items()])


@pytest.mark.parametrize(
    ("frame", "said"),
    [
        (
            _struct(id=(T.LongType(), False), amount=(T.DoubleType(), False)),
            "field 'value.name' of the schema is missing",
        ),
        (
            _struct(id=(T.LongType(), False), name=(T.IntegerType(), False), amount=(T.DoubleType(), False)),
            "field 'value.name' is int but the schema says string: cast it to string",
        ),
        (
            _struct(id=(T.LongType(), False), name=(T.StringType(), False), amount=(T.DoubleType(), True)),
            "field 'value.amount' may hold nulls but the schema's field is not nullable: make the column non-null",
        ),
        (
            _struct(
                id=(T.LongType(), False),
                name=(T.StringType(), False),
                amount=(T.DoubleType(), False),
                x=(T.LongType(), False),
            ),
            "field 'value.x' is not in the schema",
        ),
    ],
)
def test_a_frame_that_does_not_fit_a_given_avro_schema_is_named_field_by_field(frame: T.StructType, said: str) -> None:
    [problem] = avro_schema.check(frame, GIVEN, "value")
    assert problem.startswith(said), problem


def test_a_nullable_column_fits_a_union_with_null() -> None:
    given = json.loads(json.dumps(GIVEN))
    given["fields"][2]["type"] = ["null", "double"]
    frame = _struct(id=(T.LongType(), False), name=(T.StringType(), False), amount=(T.DoubleType(), True))
    assert avro_schema.check(frame, given, "value") == []


def test_a_frame_that_does_not_fit_a_given_json_schema_is_named() -> None:
    given = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
        "additionalProperties": False,
    }
    frame = _struct(id=(T.StringType(), False), name=(T.StringType(), True), extra=(T.LongType(), False))
    problems = json_schema.check(frame, given, "value")
    assert problems == [
        "field 'value.name' is required but may hold nulls, which to_json leaves out: make the column non-null "
        "(F.coalesce(col, default), or df.where(col.isNotNull()) before the struct), or drop it from the schema's "
        '"required"',
        "field 'value.id' is string but the schema says ['integer']: cast it",
        "field 'value.extra' is not in the schema, which allows no other: drop it from the struct",
    ]
    assert json_schema.check(frame, {"oneOf": [given]}, "value") == [
        "field 'value': the schema uses ['oneOf'], which kafka2pc cannot check against a DataFrame"
    ]


def test_default_record_names_are_valid_avro_names_and_the_package_is_added_once() -> None:
    assert default_record_name("orders.v1-eu", "value") == "orders_v1_eu_value"
    assert default_record_name("1orders", "key") == "_1orders_key"
    assert needs_avro_package({"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"})
    assert not needs_avro_package({"spark.jars": "/jars/spark-avro_2.13-4.2.0.jar"})


VALUES = _struct(
    d=(T.DoubleType(), False),
    f=(T.FloatType(), True),
    ds=(T.ArrayType(T.DoubleType(), True), False),
    ts=(T.TimestampType(), False),
    ntz=(T.TimestampNTZType(), False),
    b=(T.BinaryType(), False),
    day=(T.DateType(), False),
)
# What to_json writes for VALUES with TO_JSON_OPTIONS, as Spark 4.2 wrote it (session time zone
# Asia/Kolkata): the non-finite doubles as strings, the instant in UTC with its microseconds.
WRITTEN = [
    '{"d":"NaN","f":"-Infinity","ds":["Infinity",null,1.0E300],"ts":"2026-01-31T18:29:59.123456Z",'
    '"ntz":"2026-01-31T23:59:59.123456","b":"AAH/","day":"2026-01-31"}',
    '{"d":-2.5,"ds":[],"ts":"0001-01-01T00:00:00.000001Z","ntz":"0001-01-01T00:00:00.000000","b":"","day":"0001-01-01"}',
]


def test_a_derived_json_schema_takes_what_to_json_writes_non_finite_doubles_timestamps_and_binary() -> None:
    import jsonschema

    schema = json_schema.derive(VALUES, "Values")
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    for text in WRITTEN:
        validator.validate(json.loads(text))  # raises on a record the schema does not take
    numbers = {"anyOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}]}
    properties = schema["properties"]
    assert properties["d"] == properties["f"] == numbers
    assert properties["ds"]["items"] == {"anyOf": [*numbers["anyOf"], {"type": "null"}]}
    assert properties["ts"] == {"type": "string", "format": "date-time"}
    assert properties["ntz"] == {"type": "string", "pattern": json_schema.NTZ_PATTERN}  # no date-time: no offset
    assert properties["b"] == {"type": "string", "contentEncoding": "base64"}
    assert not validator.is_valid({**json.loads(WRITTEN[0]), "d": "nan"})
    assert not validator.is_valid({**json.loads(WRITTEN[0]), "ntz": "2026-01-31T23:59:59.123+05:30"})
    assert json_schema.fit(VALUES, schema, "value") == json_schema.Fit()  # a derived schema fits its frame
    assert json_schema.TO_JSON_OPTIONS["timestampFormat"] == "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


NON_FINITE = ("NaN", "Infinity", "-Infinity")
OK = "fits"
ROWS_DECIDE = "the rows decide"


@pytest.mark.parametrize(
    ("column", "given", "said"),
    [
        (T.TimestampType(), {"type": "string", "format": "date-time"}, OK),
        (
            T.TimestampType(),
            {"type": "number"},
            "field 'value.x' is timestamp but to_json writes it as '2026-01-31T18:29:59.123456Z' (an instant, in "
            "UTC), and the schema says ['number']: cast it",
        ),
        (T.TimestampType(), {"type": "string", "format": "date"}, "field 'value.x' is timestamp but to_json writes"),
        (
            T.TimestampNTZType(),
            {"type": "string", "format": "date-time"},
            "field 'value.x' is timestamp_ntz but to_json writes it as '2026-01-31T23:59:59.123456' (a local "
            "date-time, without offset), not format 'date-time': drop or fix the schema's format, or cast the column",
        ),
        (
            T.TimestampNTZType(),
            {"type": "string", "pattern": "Z$"},
            "field 'value.x' is timestamp_ntz but to_json writes it as '2026-01-31T23:59:59.123456' (a local "
            "date-time, without offset), and the schema's pattern 'Z$' does not match '2026-01-31T23:59:59.123456'",
        ),
        (T.TimestampNTZType(), {"type": "string"}, OK),
        (T.BinaryType(), {"type": "string"}, OK),
        (T.BinaryType(), {"type": "string", "contentEncoding": "base64"}, OK),
        (T.BinaryType(), {"type": "string", "contentEncoding": "base16"}, "field 'value.x' is binary but to_json"),
        (T.BinaryType(), {"type": "integer"}, "field 'value.x' is binary but to_json writes it as base64 text"),
        (T.DateType(), {"type": "string", "format": "date"}, OK),
        (T.DoubleType(), {"type": "number"}, ROWS_DECIDE),
        (T.FloatType(), {"type": "number"}, ROWS_DECIDE),
        (T.DoubleType(), {"type": ["number", "string"]}, OK),
        (T.DoubleType(), {"oneOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]}, OK),
        (T.DoubleType(), {"oneOf": [{"type": "number"}, {"enum": ["NaN"]}]}, ROWS_DECIDE),  # Infinity missing
        (T.DoubleType(), {"oneOf": [{"type": "number"}, {"type": "string"}, {"enum": list(NON_FINITE)}]}, ROWS_DECIDE),
        (
            T.LongType(),
            {"oneOf": [{"type": "integer"}, {"enum": [1, "a"]}]},
            "field 'value.x' is bigint but the schema lists its values (enum), which kafka2pc cannot check",
        ),
        (
            T.DoubleType(),
            {"type": "string"},
            "field 'value.x' is double but the schema says ['string']: cast it",
        ),
        (
            T.LongType(),
            {"oneOf": [{"type": "number"}, {"type": "integer"}]},
            "field 'value.x' is bigint but 2 branches of the schema's oneOf take it, where oneOf takes a value only "
            "one does: use anyOf",
        ),
        (T.LongType(), {"type": "number"}, OK),
        (T.BooleanType(), {"enum": [True]}, "field 'value.x' is boolean but the schema's enum lacks [False]: add them"),
        (T.StringType(), {"type": "string", "format": "email"}, OK),  # a string column's text is the user's
        (
            T.StringType(),
            {"type": "string", "pattern": "^a"},
            "field 'value.x' is string but the schema gives a pattern, which kafka2pc cannot check",
        ),
        (
            T.DoubleType(),
            {"type": "number", "minimum": 0},
            "field 'value.x': the schema uses ['minimum'], which kafka2pc cannot check against a DataFrame",
        ),
    ],
)
def test_a_value_is_checked_against_a_given_json_schema_by_what_to_json_writes(
    column: Any, given: dict[str, Any], said: str
) -> None:
    schema = {"type": "object", "properties": {"x": given}, "required": ["x"]}
    found = json_schema.fit(_struct(x=(column, False)), schema, "value")
    if said == OK:
        assert found == json_schema.Fit()
    elif said == ROWS_DECIDE:
        assert found == json_schema.Fit(finite_only=[("value.x", ("x",))])
    else:
        [problem] = found.problems
        assert problem.startswith(said), problem


def test_non_finite_values_inside_arrays_and_maps_are_found_by_their_steps() -> None:
    frame = _struct(
        xs=(T.ArrayType(T.DoubleType(), True), False),
        m=(T.MapType(T.StringType(), _struct(y=(T.FloatType(), False)), False), False),
    )
    given = {
        "type": "object",
        "properties": {
            "xs": {"type": "array", "items": {"type": "number"}},
            "m": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"y": {"type": "number"}}},
            },
        },
    }
    found = json_schema.fit(frame, given, "value")
    assert found.finite_only == [("value.xs[]", ("xs", None)), ("value.m{}.y", ("m", None, "y"))]
    assert found.problems == [
        "field 'value.xs[]' may hold nulls but the schema does not allow null there: make the column non-null "
        "(F.coalesce(col, default), or df.where(col.isNotNull()) before the struct), or drop it from the schema's "
        '"required"'
    ]
    said = json_schema.non_finite_problem("value.xs[]", 3, 300)
    assert said.startswith("field 'value.xs[]' holds NaN, Infinity or -Infinity in 3 of 300 rows"), said
