"""Which brokers kafka2pc refuses, and how it says so (txn/kafka/broker_support.py)."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.kafka.broker_support import NEEDS, UnsupportedBrokerError, check_api_versions, gaps

# What Kafka 3.0 advertises for the APIs of NEEDS (its ApiVersions answer).
KAFKA_3_0 = {10: (0, 4), 65: (0, 0), 66: (0, 0), 22: (0, 4), 24: (0, 3), 25: (0, 3), 28: (0, 3), 26: (0, 3)}


def test_kafka_3_0_serves_every_api_the_transactions_need() -> None:
    assert {n.api_key for n in NEEDS} == set(KAFKA_3_0)
    assert gaps(KAFKA_3_0) == []
    check_api_versions("b:9092", KAFKA_3_0, "3.0")


def test_kafka_2_8_is_refused_naming_what_it_lacks_its_version_and_the_version_needed() -> None:
    kafka_2_8 = {k: v for k, v in KAFKA_3_0.items() if k not in (65, 66)} | {10: (0, 3)}
    with pytest.raises(UnsupportedBrokerError) as refused:
        check_api_versions("b:9092", kafka_2_8, "2.8")
    assert str(refused.value) == (
        "the Kafka broker at b:9092 answers FindCoordinator up to v3 (v4 needed), DescribeTransactions and "
        "ListTransactions not at all: Kafka 2.8, by its API versions. kafka2pc needs Kafka 3.0 or newer: it "
        "ends and recovers transactions from another process with batched FindCoordinator (KIP-699), "
        "DescribeTransactions and ListTransactions (KIP-664); upgrade the brokers. Refused before this step "
        "opened or ended any transaction: nothing was written"
    )


def test_a_broker_that_dropped_the_pinned_end_txn_versions_is_refused_too() -> None:
    assert gaps(KAFKA_3_0 | {26: (5, 5)}) == ["EndTxn from v5 only (v4 or lower needed)"]
    assert gaps({k: v for k, v in KAFKA_3_0.items() if k != 22}) == ["InitProducerId not at all"]


def test_no_api_versions_read_yet_is_not_an_old_broker() -> None:
    check_api_versions("b1:9092", {}, None)  # kafka-python had no answer yet: nothing is refused
