"""Registry formats end to end: a real broker, a real Apicurio Registry (basic auth), real Spark with
spark-avro. Judged by a read_committed consumer that deserializes with confluent-kafka's
AvroDeserializer / JSONDeserializer, which fetch each record's schema from the registry by its id."""

from __future__ import annotations

import json
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


def _export_and_commit(kafka: KafkaEnv, df: Any, topic: str, formats: RecordFormats) -> ExportSettings:
    settings = ExportSettings(f"r{uuid.uuid4().hex[:8]}", kafka.config, topic)
    result = export_dataframe(df, settings, formats=formats)
    assert result.records == ROWS and len(result.committables) == 2
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
