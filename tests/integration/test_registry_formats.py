"""Registry formats end to end: a real broker, a real Apicurio Registry (basic auth), real Spark with
spark-avro. Judged by a read_committed consumer that deserializes with confluent-kafka's
AvroDeserializer / JSONDeserializer, which fetch each record's schema from the registry by its id."""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import math
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.formats import AvroFormat, JsonSchemaFormat, default_record_name
from airflow_provider_kafka2pc.spark.job import export_dataframe
from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from tests.helpers.kafka import KafkaEnv
from tests.helpers.registry import RegistryEnv, spark_with_avro

pytestmark = pytest.mark.kafka

ROWS = 600


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with spark_with_avro() as session:
        yield session


def _orders(spark: Any) -> Any:
    """key: "order-<id>"; value: a struct with a non-null long and string, a double that is null for every
    third row, and an array of strings."""
    from pyspark.sql import functions as F

    i = F.col("id")
    return spark.range(ROWS, numPartitions=2).select(
        F.concat(F.lit("order-"), i.cast("string")).alias("key"),
        F.struct(
            i.alias("id"),
            F.concat(F.lit("n"), i.cast("string")).alias("name"),
            F.when(i % 3 == 0, F.lit(None)).otherwise(i * 1.5).alias("amount"),
            F.array(F.lit("a"), (i % 5).cast("string")).alias("tags"),
        ).alias("value"),
    )


def _expected(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}", "amount": None if i % 3 == 0 else i * 1.5, "tags": ["a", str(i % 5)]}


def _export_and_commit(
    kafka: KafkaEnv, df: Any, topic: str, formats: RecordFormats, rows: int = ROWS
) -> ExportSettings:
    settings = ExportSettings(f"r{uuid.uuid4().hex[:8]}", kafka.config, topic)
    result = export_dataframe(df, settings, formats=formats)
    assert result.records == rows and len(result.committables) == 2
    log = DecisionLog(kafka.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")
    commit_prepared(result.committables, kafka.wire, log, run="r1")
    return settings


def _schema_id(framed: bytes) -> int:
    assert framed[0] == 0, "magic byte"
    return int.from_bytes(framed[1:5], "big")


def test_avro_key_and_value_every_record_exactly_once(
    spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = kafka.topic(2)
    formats = RecordFormats(schema_registry.settings(), key=AvroFormat(), value=AvroFormat())
    settings = _export_and_commit(kafka, _orders(spark), topic, formats)

    records = kafka.read_committed(topic)
    sr = schema_registry.confluent_client()
    key_id = sr.get_latest_version(f"{topic}-key").schema_id
    value_id = sr.get_latest_version(f"{topic}-value").schema_id
    assert {_schema_id(r.key or b"") for r in records} == {key_id}
    assert {_schema_id(r.value or b"") for r in records} == {value_id}
    keys, values = AvroDeserializer(sr), AvroDeserializer(sr)
    decoded = {
        keys(r.key, SerializationContext(topic, MessageField.KEY)): values(
            r.value, SerializationContext(topic, MessageField.VALUE)
        )
        for r in records
    }
    assert len(records) == ROWS  # every record once: no duplicate, none missing
    assert decoded == {f"order-{i}": _expected(i) for i in range(ROWS)}
    assert kafka.open_transactions(settings.transactional_id_prefix) == []


def test_json_schema_value_every_record_exactly_once(spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = kafka.topic(2)
    formats = RecordFormats(schema_registry.settings(), value=JsonSchemaFormat())
    _export_and_commit(kafka, _orders(spark), topic, formats)

    records = kafka.read_committed(topic)
    sr = schema_registry.confluent_client()
    registered = sr.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "JSON"
    assert {_schema_id(r.value or b"") for r in records} == {registered.schema_id}
    values = JSONDeserializer(None, schema_registry_client=sr)
    decoded = {r.key: values(r.value, SerializationContext(topic, MessageField.VALUE)) for r in records}
    assert len(records) == ROWS
    # to_json leaves a null field out; the schema makes it optional.
    want = {f"order-{i}".encode(): {k: v for k, v in _expected(i).items() if v is not None} for i in range(ROWS)}
    assert decoded == want


VALUE_ROWS = 300
# 2026-01-31T18:29:59.123456Z; rows 3, 53, ... are in 1850, when Asia/Kolkata was +05:53:28 (an offset
# written as +05:53 would move the instant by 28 s).
BASE_US, OLD_US = 1_769_884_199_123_456, -3_786_825_599_999_999
NTZ_BASE = datetime.datetime(2026, 1, 31, 23, 59, 59, 123456)
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")


def _values(spark: Any) -> Any:
    """key: "v-<id>"; value: doubles and floats that are NaN, Infinity, -Infinity or i/4 (also in an
    array with nulls), a timestamp with microseconds, a timestamp_ntz, and binary with a 0xFF byte."""
    from pyspark.sql import functions as F

    i = F.col("id")
    d = (
        F.when(i % 7 == 0, F.lit(float("nan")))
        .when(i % 7 == 1, F.lit(float("inf")))
        .when(i % 7 == 2, F.lit(float("-inf")))
        .otherwise(i * 0.25)
    )
    micros = F.when(i % 50 == 3, F.lit(OLD_US)).otherwise(F.lit(BASE_US) + i * 1_000_001)
    return spark.range(VALUE_ROWS, numPartitions=2).select(
        F.concat(F.lit("v-"), i.cast("string")).alias("key"),
        F.struct(
            d.alias("d"),
            d.cast("float").alias("f"),
            F.array(d, F.when(i % 2 == 0, F.lit(None)).otherwise(i * 0.5)).alias("ds"),
            F.timestamp_micros(micros).alias("ts"),
            F.expr("timestamp_ntz'2026-01-31 23:59:59.123456' + make_dt_interval(0, 0, 0, id * 1.000001)").alias("ntz"),
            F.concat(F.unhex(F.lit("00FF")), i.cast("string").cast("binary")).alias("b"),
        ).alias("value"),
    )


def _d(i: int) -> float:
    return [math.nan, math.inf, -math.inf][i % 7] if i % 7 < 3 else i * 0.25


def _value_of(i: int) -> dict[str, Any]:
    """Row i's value as its Python values (doubles as repr: nan equals nan)."""
    micros = OLD_US if i % 50 == 3 else BASE_US + i * 1_000_001
    return {
        "d": repr(_d(i)),
        "f": repr(_d(i)),
        "ds": [repr(_d(i)), None if i % 2 == 0 else repr(i * 0.5)],
        "ts": datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=micros),
        "ntz": NTZ_BASE + datetime.timedelta(seconds=i, microseconds=i),
        "b": b"\x00\xff" + str(i).encode(),
    }


def _decoded(value: dict[str, Any]) -> dict[str, Any]:
    """A decoded record as Python values: "NaN"/"Infinity"/"-Infinity" are doubles, timestamps parsed
    (an instant must carry its offset, a local date-time none), binary from base64."""
    assert RFC3339.match(value["ts"]), value["ts"]
    instant, local = datetime.datetime.fromisoformat(value["ts"]), datetime.datetime.fromisoformat(value["ntz"])
    assert instant.tzinfo is not None and local.tzinfo is None, value
    return {
        "d": repr(float(value["d"])),
        "f": repr(float(value["f"])),
        "ds": [None if v is None else repr(float(v)) for v in value["ds"]],
        "ts": instant,
        "ntz": local,
        "b": base64.b64decode(value["b"], validate=True),
    }


@contextlib.contextmanager
def _session_time_zone(spark: Any, zone: str) -> Iterator[None]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_json_schema_non_finite_doubles_timestamps_and_binary_decode_to_the_source(
    spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv
) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = kafka.topic(2)
    formats = RecordFormats(schema_registry.settings(), value=JsonSchemaFormat())
    with _session_time_zone(spark, "Asia/Kolkata"):
        settings = _export_and_commit(kafka, _values(spark), topic, formats, rows=VALUE_ROWS)

    records = kafka.read_committed(topic)
    sr = schema_registry.confluent_client()
    registered = sr.get_latest_version(f"{topic}-value")
    properties = json.loads(registered.schema.schema_str)["properties"]
    assert [b.get("enum") for b in properties["d"]["anyOf"]] == [None, ["NaN", "Infinity", "-Infinity"]]
    assert properties["ts"]["format"] == "date-time" and "format" not in properties["ntz"]
    assert properties["b"] == {"type": "string", "contentEncoding": "base64"}
    values = JSONDeserializer(None, schema_registry_client=sr)  # validates each record against its schema
    decoded = {r.key: _decoded(values(r.value, SerializationContext(topic, MessageField.VALUE))) for r in records}
    assert len(records) == VALUE_ROWS
    assert decoded == {f"v-{i}".encode(): _value_of(i) for i in range(VALUE_ROWS)}
    assert kafka.open_transactions(settings.transactional_id_prefix) == []


def _given_values(case: str) -> str:
    """A schema for _values' frame that takes everything to_json writes, but for the case's field."""
    numbers = {"anyOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]}
    properties: dict[str, Any] = {
        "d": numbers,
        "f": numbers,
        "ds": {"type": "array", "items": {"anyOf": [*numbers["anyOf"], {"type": "null"}]}},
        "ts": {"type": "string", "format": "date-time"},
        "ntz": {"type": "string"},
        "b": {"type": "string", "contentEncoding": "base64"},
    }
    if case == "numbers only, NaN in the rows":
        properties["d"] = {"type": "number"}
    elif case == "date-time for a timestamp_ntz":
        properties["ntz"] = {"type": "string", "format": "date-time"}
    return json.dumps({"type": "object", "properties": properties, "additionalProperties": False})


GIVEN_JSON_REFUSED = {
    "numbers only, NaN in the rows": [
        f"field 'value.d' holds NaN, Infinity or -Infinity in {sum(1 for i in range(VALUE_ROWS) if i % 7 < 3)} "
        f"of {VALUE_ROWS} rows",
        "the schema does not take there",
    ],
    "date-time for a timestamp_ntz": ["field 'value.ntz' is timestamp_ntz", "not format 'date-time'"],
}


@pytest.mark.parametrize("case", list(GIVEN_JSON_REFUSED))
def test_a_given_json_schema_that_cannot_hold_the_values_is_refused_before_any_transaction(
    case: str, spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv, bad_topic: str
) -> None:
    subject = f"{bad_topic}-{uuid.uuid4().hex[:6]}"
    formats = RecordFormats(
        schema_registry.settings(), value=JsonSchemaFormat(schema=_given_values(case), subject=subject)
    )
    settings = ExportSettings(f"b{uuid.uuid4().hex[:8]}", kafka.config, bad_topic)

    with pytest.raises(errors.SchemaMismatchError) as raised:
        export_dataframe(_values(spark), settings, formats=formats)

    message = str(raised.value)
    assert all(w in message for w in [*GIVEN_JSON_REFUSED[case], errors.NOTHING_WRITTEN]), message
    assert subject not in schema_registry.client().subjects()  # refused before the registry was asked
    assert kafka.read_committed(bad_topic, timeout_s=10) == []
    assert kafka.open_transactions(settings.transactional_id_prefix, settle_s=0) == []


GIVEN_ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "amount", "type": "double"},
        ],
    }
)


def _bad_frame(spark: Any, case: str) -> Any:
    from pyspark.sql import functions as F

    i = F.col("id")
    fields = {
        "id": i,
        "name": F.concat(F.lit("n"), i.cast("string")),
        "amount": F.coalesce(i * 1.5, F.lit(0.0)),  # non-null
    }
    if case == "missing field":
        del fields["name"]
    elif case == "wrong type":
        fields["name"] = i.cast("int")
    elif case == "null in a non-null field":
        fields["amount"] = F.when(i % 2 == 0, F.lit(None)).otherwise(i * 1.5)
    elif case == "incompatible schema":
        fields["code"] = F.lit("x")  # a new field without a default: old readers cannot read it (BACKWARD)
    return spark.range(10, numPartitions=2).select(F.struct(*[c.alias(n) for n, c in fields.items()]).alias("value"))


BAD_INPUTS = {
    # case: (the error's type, words the message must hold)
    "missing field": (errors.SchemaMismatchError, ["'value.name'", "missing", "add it"]),
    "wrong type": (errors.SchemaMismatchError, ["'value.name'", "is int but the schema says string", "cast"]),
    "null in a non-null field": (errors.SchemaMismatchError, ["'value.amount'", "may hold nulls", "coalesce"]),
    "registry down": (errors.RegistryUnreachableError, ["cannot reach the schema registry", "Connection refused"]),
    "credentials refused": (errors.RegistryAuthError, ["refused the credentials", "HTTP 401", "login and password"]),
    "incompatible schema": (errors.IncompatibleSchemaError, ["incompatible", "BACKWARD", "evolves compatibly"]),
    "subject missing, registration forbidden": (errors.SubjectNotFoundError, ["does not exist", "auto_register"]),
}


@pytest.fixture(scope="module")
def bad_topic(kafka: KafkaEnv) -> str:
    return kafka.topic(2)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_before_any_transaction(
    case: str, spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv, bad_topic: str
) -> None:
    registry = schema_registry.settings()
    fmt = AvroFormat(schema=GIVEN_ORDER, subject=f"{bad_topic}-{uuid.uuid4().hex[:6]}")
    if case == "registry down":
        registry = schema_registry.settings(url="http://127.0.0.1:9/apis/ccompat/v7")
        fmt = AvroFormat()
    elif case == "credentials refused":
        registry = schema_registry.settings(password="not-the-password")
        fmt = AvroFormat()
    elif case == "incompatible schema":
        subject = f"{bad_topic}-{uuid.uuid4().hex[:6]}"
        first = {
            "type": "record",
            "name": default_record_name(bad_topic, "value"),
            "fields": [{"name": n, "type": t} for n, t in (("id", "long"), ("name", "string"), ("amount", "double"))],
        }
        client = schema_registry.client()
        client.register(subject, json.dumps(first), "AVRO")
        client.set_compatibility_level("BACKWARD", subject)
        fmt = AvroFormat(subject=subject)
    elif case == "subject missing, registration forbidden":
        fmt = AvroFormat(subject=f"missing-{uuid.uuid4().hex[:6]}", auto_register=False)
    settings = ExportSettings(f"b{uuid.uuid4().hex[:8]}", kafka.config, bad_topic)
    kind, words = BAD_INPUTS[case]

    with pytest.raises(kind) as raised:
        export_dataframe(_bad_frame(spark, case), settings, formats=RecordFormats(registry, value=fmt))

    message = str(raised.value)
    assert all(w in message for w in [*words, errors.NOTHING_WRITTEN]), message
    assert "not-the-password" not in message and schema_registry.password not in message
    assert kafka.read_committed(bad_topic, timeout_s=10) == []
    assert kafka.open_transactions(settings.transactional_id_prefix, settle_s=0) == []


def test_the_connection_test_button_against_the_registry(schema_registry: RegistryEnv) -> None:
    from airflow.sdk import Connection

    from airflow_provider_kafka2pc.hooks.schema_registry import SchemaRegistryHook

    def button(password: str) -> tuple[bool, str]:
        conn = Connection(
            conn_id="registry",
            conn_type="kafka2pc_schema_registry",
            host=schema_registry.url,
            login=schema_registry.user,
            password=password,
        )
        return SchemaRegistryHook(connection=conn).test_connection()

    ok, said = button(schema_registry.password)
    assert ok and said.startswith(f"connected to {schema_registry.url}: ") and "global compatibility" in said, said
    wrong = uuid.uuid4().hex
    ok, said = button(wrong)
    assert not ok and "refused the credentials (HTTP 401" in said and wrong not in said, said


def test_a_wrong_base_path_and_a_refusal_without_reasons_are_named_on_the_real_registry(
    spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv, bad_topic: str
) -> None:
    """Apicurio serves the API under /apis/ccompat/v7, and its compatibility answer gives no reason:
    the first says which URL to use, the second names the field (compared here); neither writes."""
    root = schema_registry.url.removesuffix("/apis/ccompat/v7")
    subject = f"{bad_topic}-{uuid.uuid4().hex[:6]}"
    latest = {
        "type": "record",
        "name": default_record_name(bad_topic, "value"),
        "fields": [{"name": n, "type": t} for n, t in (("id", "long"), ("name", "string"), ("amount", "double"))],
    }
    client = schema_registry.client()
    client.register(subject, json.dumps(latest), "AVRO")
    client.set_compatibility_level("FULL", subject)
    cases = [
        (schema_registry.settings(url=root), errors.RegistryAnswerError, f"Use {schema_registry.url} as the registry"),
        (schema_registry.settings(), errors.IncompatibleSchemaError, "field 'value.code' is new and has no default"),
    ]
    for registry, kind, words in cases:
        settings = ExportSettings(f"w{uuid.uuid4().hex[:8]}", kafka.config, bad_topic)
        formats = RecordFormats(registry, value=AvroFormat(subject=subject))
        with pytest.raises(kind) as raised:  # the frame adds a field "code" without a default
            export_dataframe(_bad_frame(spark, "incompatible schema"), settings, formats=formats)
        message = str(raised.value)
        assert words in message and errors.NOTHING_WRITTEN in message, message
        assert schema_registry.password not in message
        assert kafka.open_transactions(settings.transactional_id_prefix, settle_s=0) == []
    assert kafka.read_committed(bad_topic, timeout_s=10) == []
    assert [v.version for v in [client.version(subject)] if v is not None] == [1]  # nothing registered
