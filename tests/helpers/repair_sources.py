"""Sources ``kafka2pc repair --source`` loads in the repair tests: the frame the run exported,
built again from the Parquet directory the test names in ``KAFKA2PC_TEST_REPAIR_PARQUET`` (with a
topic column, or with it swapped, or with Avro values), or the Kafka source (topic and group in
``KAFKA2PC_TEST_REPAIR_TOPIC`` and ``..._GROUP``)."""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_kafka2pc.registry.formats import AvroFormat


def parquet_frame(spark: Any) -> Any:
    """key and value of the test's Parquet files, one Spark partition per file."""
    return spark.read.parquet(os.environ["KAFKA2PC_TEST_REPAIR_PARQUET"]).select("key", "value")


def with_two_topics(df: Any, even: str, odd: str) -> Any:
    """``df`` with a topic column: records whose key ends in an even number to ``even``, the rest to ``odd``."""
    from pyspark.sql import functions as F

    parity = F.substring_index(F.col("key"), "/", -1).cast("int") % 2
    return df.withColumn("topic", F.when(parity == 0, F.lit(even)).otherwise(F.lit(odd)))


def two_topic_frame(spark: Any) -> Any:
    """The multi-topic run's frame: the topics in ``KAFKA2PC_TEST_REPAIR_TOPICS`` (even, odd)."""
    even, odd = os.environ["KAFKA2PC_TEST_REPAIR_TOPICS"].split(",")
    return with_two_topics(parquet_frame(spark), even, odd)


def swapped_topic_frame(spark: Any) -> Any:
    """The same records, each to the other topic: every transaction still writes both topics."""
    even, odd = os.environ["KAFKA2PC_TEST_REPAIR_TOPICS"].split(",")
    return with_two_topics(parquet_frame(spark), odd, even)


def random_frame(spark: Any) -> Any:
    """A frame whose plan is not deterministic: a repair must refuse it before exporting."""
    from pyspark.sql import functions as F

    return parquet_frame(spark).withColumn("value", F.concat(F.col("value"), F.rand().cast("string")))


def avro_frame(spark: Any) -> Any:
    """The Avro-valued run's frame: each value a record of its text and length."""
    from pyspark.sql import functions as F

    text = F.col("value")
    return parquet_frame(spark).select(
        "key", F.struct(text.alias("text"), F.length(text).alias("length")).alias("value")
    )


# The Avro-valued run's value_format, as a DAG file keeps it (``--value-format ...:AVRO_VALUE``).
AVRO_VALUE = AvroFormat()


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
