"""Spark's Kafka source and spark-avro as the export operator asks for them: by the Maven coordinates
``kafka_source_package`` and ``avro_package`` name for the running Spark (its version and its
Scala suffix, 2.12 for PySpark 3.5, 2.13 for 4.x), resolved by Spark itself when its JVM starts.

The Airflow-level Kafka source (tests/e2e/test_kafka_source_dag.py) gives Spark the jars by path;
this is the path a user without them takes, and what ``scripts/test-compat`` runs on every Spark
line. Judged by Kafka: the range read is the committed records of ``[start, end)``, each once.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.jvm_options import stop_driver_jvm
from tests.helpers.kafka import KafkaEnv

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A session in a JVM of its own started with the two packages (a running JVM keeps its class path)."""
    from pyspark.sql import SparkSession

    from airflow_provider_kafka2pc.spark.kafka_source import kafka_source_package
    from airflow_provider_kafka2pc.spark.record_formats import avro_package

    os.environ["PYSPARK_PYTHON"] = sys.executable
    stop_driver_jvm()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafka2pc-kafka-source-tests")
        .config("spark.jars.packages", f"{kafka_source_package()},{avro_package()}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


def _transaction(kafka: KafkaEnv, topic: str, keys: list[str], end: str) -> Any:
    from confluent_kafka import Producer

    producer = Producer({**kafka.config, "transactional.id": f"src-{uuid.uuid4().hex[:6]}", "linger.ms": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, key in enumerate(keys):
        producer.produce(topic, key=key.encode(), value=b"v", partition=i % 2)
    producer.flush(30)
    if end == "commit":
        producer.commit_transaction(30)
    elif end == "abort":
        producer.abort_transaction(30)
    return producer  # "open": the caller aborts it


def test_the_named_packages_load_and_the_range_reads_its_committed_records_once(spark: Any, kafka: KafkaEnv) -> None:
    from airflow_provider_kafka2pc.spark.kafka_source import read_range
    from airflow_provider_kafka2pc.spark.record_formats import check_avro_loaded
    from airflow_provider_kafka2pc.spark.versions import spark_build
    from airflow_provider_kafka2pc.txn.protocol.source_range import PartitionRange, SourceRange

    scala = spark.sparkContext._jvm.scala.util.Properties.versionNumberString()
    assert scala.startswith(spark_build().scala + "."), (scala, spark_build())
    check_avro_loaded(spark)  # spark-avro's to_avro is analysed: refused if the package did not load

    topic = kafka.topic(partitions=2)
    # Per partition: 3 committed (offsets 0-2) and their marker (3), 2 aborted (4-5) and the marker
    # (6), 2 committed (7-8) and the marker (9), then 2 in a transaction left open (10-11).
    _transaction(kafka, topic, [f"a{i}" for i in range(6)], "commit")
    _transaction(kafka, topic, [f"x{i}" for i in range(4)], "abort")
    _transaction(kafka, topic, [f"b{i}" for i in range(4)], "commit")
    still_open = _transaction(kafka, topic, [f"o{i}" for i in range(4)], "open")
    try:
        # The last stable offset is 10 on both; partition 0 from offset 1: a0 (offset 0) is before it.
        parts = (PartitionRange(topic, 0, 1, 10, None), PartitionRange(topic, 1, 0, 10, None))
        rows = read_range(spark, kafka.config, SourceRange("g", parts)).select("key").collect()
    finally:
        still_open.abort_transaction(30)
    keys = sorted(bytes(r["key"]).decode() for r in rows)
    assert keys == sorted(["a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2", "b3"]), keys
