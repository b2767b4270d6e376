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
