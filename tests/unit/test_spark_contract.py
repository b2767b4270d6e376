"""The DataFrame contract and the session check, on pyspark types only (no JVM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark.sql import types as T

from airflow_provider_kafka2pc.spark.contract import validate_schema
from airflow_provider_kafka2pc.spark.errors import SchemaError, SpeculationError
from airflow_provider_kafka2pc.spark.job import check_session

HEADERS = T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))


def _schema(**cols: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in cols.items()])


@pytest.mark.parametrize(
    "schema",
    [
        _schema(value=T.BinaryType()),
        _schema(value=T.StringType(), key=T.StringType()),
        _schema(
            value=T.BinaryType(), key=T.BinaryType(), topic=T.StringType(), partition=T.IntegerType(), headers=HEADERS
        ),
    ],
)
def test_the_kafka_sink_columns_are_accepted(schema: T.StructType) -> None:
    validate_schema(schema, "default")


@pytest.mark.parametrize(
    "schema, topic, message",
    [
        (_schema(key=T.StringType()), "t", "'value' column is required"),
        (_schema(value=T.StringType(), extra=T.StringType()), "t", "unexpected column"),
        (_schema(value=T.LongType()), "t", "'value' must be binary or string"),
        (_schema(value=T.StringType(), key=T.DoubleType()), "t", "'key' must be binary or string, not double$"),
        (
            _schema(value=T.StructType([T.StructField("id", T.LongType())])),
            "t",
            r"'value' must be binary or string, not struct<id:bigint> \(a struct is encoded for a schema registry by "
            r"a format: the export's value_format, `kafka2pc repair --value-format`\)",
        ),
        (_schema(value=T.StringType(), topic=T.LongType()), "t", "'topic' must be string"),
        (_schema(value=T.StringType()), None, "no default topic"),
        (_schema(value=T.StringType(), partition=T.StringType()), "t", "'partition' must be int"),
        (_schema(value=T.StringType(), headers=T.ArrayType(T.StringType())), "t", "'headers' must be"),
    ],
)
def test_anything_else_is_a_schema_error(schema: T.StructType, topic: str | None, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        validate_schema(schema, topic)


def _session(speculation: str | None) -> SimpleNamespace:
    conf = {} if speculation is None else {"spark.speculation": speculation}
    return SimpleNamespace(conf=SimpleNamespace(get=lambda k, d=None: conf.get(k, d)))


def test_a_session_with_speculation_is_refused() -> None:
    with pytest.raises(SpeculationError, match=r"spark\.speculation=true"):
        check_session(_session("true"))
    check_session(_session("false"))
    check_session(_session(None))
