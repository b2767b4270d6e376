"""The digest column: a hash of each row's key and value, computed in Spark's JVM (DESIGN §6).

An EXACTLY_ONCE export records, per transaction, a digest of the records it holds, so that a
repair of a lost transaction can prove its re-computation identical before anything becomes
visible (``txn/protocol/record_digest.py``). Hashing in Python would cost the writer a call per
record; Spark's ``xxhash64`` runs in generated code beside the computation, before the window
opens, and the writer only sums one int64 column per batch and drops it before producing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Not a column of the contract (``spark/contract.py``): added after the frame is checked, removed by
# the partition writer (``txn/two_phase/partition_writer.py``), never produced to Kafka.
from airflow_provider_kafka2pc.spark.column_functions import functions_for
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.protocol.record_digest import SPARK_SCHEME, SPARK_SCHEMES
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.partition_writer import DIGEST_COLUMN


def with_digest(df: Any, scheme: str, default_topic: str | None) -> Any:
    """``df`` with the digest column of ``scheme`` (``txn/protocol/record_digest.py``).

    Spark's xxhash64 of (the key is null, key, value), and for ``xxh64t`` of where the record goes:
    its topic (the column's, or ``default_topic`` where there is none, as the writer sends it) and its partition column
    when the frame has one. The key's nullness is hashed because xxhash64 skips null inputs: (null, v)
    and (v, null) stay apart; for the same reason a null partition (the producer's choice) hashes as
    no partition column."""
    F = functions_for(df)

    if scheme not in SPARK_SCHEMES:
        raise Kafka2PCError(f"digest scheme {scheme!r}: Spark computes only {', '.join(SPARK_SCHEMES)}")
    names = df.schema.names
    parts = [F.col("key").isNull(), F.col("key")] if "key" in names else [F.lit(True)]
    parts.append(F.col("value"))
    if scheme == SPARK_SCHEME:
        topic = F.col("topic") if "topic" in names else F.lit(default_topic)
        if "topic" in names and default_topic:  # the writer sends a null or empty topic to the default
            topic = F.when(topic.isNull() | (topic == ""), F.lit(default_topic)).otherwise(topic)
        parts.append(topic)
        if "partition" in names:
            parts.append(F.col("partition").cast("int"))
    return df.withColumn(DIGEST_COLUMN, F.xxhash64(*parts))


def digest_of(settings: ExportSettings) -> Callable[[Any], Any] | None:
    """What adds the digest column to a frame of this export; None when it records no digest."""
    if not settings.repairable:
        return None
    return lambda df: with_digest(df, settings.digest_scheme, settings.topic)


def only_partitions(df: Any, slots: tuple[int, ...]) -> Any:
    """``df`` with rows only in the Spark partitions ``slots`` (a repair's lost ones): the other
    partitions come out empty, so their writers open no transaction. The filter is narrow, so every
    partition keeps its number, which the transactional ids are named after."""
    F = functions_for(df)

    return df.where(F.spark_partition_id().isin(list(slots)))


__all__ = ["DIGEST_COLUMN", "digest_of", "only_partitions", "with_digest"]
