"""Sources ``kafka2pc repair --source`` loads in the repair tests: the frame the run exported,
built again from the Parquet directory the test names in ``KAFKA2PC_TEST_REPAIR_PARQUET``, or the
Kafka source (topic and group in ``KAFKA2PC_TEST_REPAIR_TOPIC`` and ``..._GROUP``)."""

from __future__ import annotations

import os
from typing import Any


def parquet_frame(spark: Any) -> Any:
    """key and value of the test's Parquet files, one Spark partition per file."""
    return spark.read.parquet(os.environ["KAFKA2PC_TEST_REPAIR_PARQUET"]).select("key", "value")


def random_frame(spark: Any) -> Any:
    """A frame whose plan is not deterministic: a repair must refuse it before exporting."""
    from pyspark.sql import functions as F

    return parquet_frame(spark).withColumn("value", F.concat(F.col("value"), F.rand().cast("string")))


def kafka_source() -> Any:
    """The KafkaSource of the test's Kafka-sourced run (called here: the CLI takes the object)."""
    from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource

    return KafkaSource(
        topics=os.environ["KAFKA2PC_TEST_REPAIR_TOPIC"],
        group_id=os.environ["KAFKA2PC_TEST_REPAIR_GROUP"],
        transform=lambda df, _context: df.select("key", "value"),
    )


# The object the CLI loads (``--source tests.helpers.repair_sources:KAFKA_SOURCE``), in a process
# started with the test's topic and group.
KAFKA_SOURCE = kafka_source() if "KAFKA2PC_TEST_REPAIR_TOPIC" in os.environ else None
