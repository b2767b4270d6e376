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
