"""Kafka2PCHook against the real broker: the Test button, and one recovery pass through it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.kafka import KafkaEnv, generate, prepare_in_subprocess

pytestmark = pytest.mark.kafka


def test_test_connection_reaches_the_broker(kafka: KafkaEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": kafka.bootstrap}))
    ok, message = Kafka2PCHook().test_connection()
    assert ok, message
    assert message.startswith("connected to 1 broker(s); decision topic 'kafka2pc_decisions'")


def test_hook_recovery_pass_aborts_an_undecided_leftover(kafka: KafkaEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_K2",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap}}),  # official kafka type
    )
    topic = kafka.topic()
    prepare_in_subprocess(kafka, "hookleft-0", generate(topic, 25))
    assert kafka.open_transactions("hookleft") == ["hookleft-0"]
    result = Kafka2PCHook("k2").recover("hookleft", "test/run")
    assert result.done and "aborted 1" in result.describe()
    assert kafka.open_transactions("hookleft") == []
    assert kafka.read_committed(topic) == []


def test_the_topic_step_creates_a_missing_topic_once_and_leaves_an_existing_one(kafka: KafkaEnv) -> None:
    """The example DAG's first task on a fresh cluster: created with its partitions and leaders; a
    second run finds it and changes nothing (not even a different partition count)."""
    import uuid

    from airflow_provider_kafka2pc.txn.kafka.data_topic import create_topic_if_missing

    topic = f"made_{uuid.uuid4().hex[:8]}"
    assert topic not in kafka.wire.topics()
    made = create_topic_if_missing(kafka.config, topic, 5)
    assert (made.name, made.partitions, made.created) == (topic, 5, True)
    assert made.describe() == f"topic {topic} created: 5 partition(s)"
    again = create_topic_if_missing(kafka.config, topic, 9)
    assert (again.partitions, again.created) == (5, False)
    assert again.describe() == f"topic {topic} exists already, left as it is: 5 partition(s)"
    existing = kafka.topic(partitions=2)
    assert create_topic_if_missing(kafka.config, existing, 7).partitions == 2
