"""The digest column: a hash of each row's key and value, computed in Spark's JVM (DESIGN §6).

An EXACTLY_ONCE export records, per transaction, a digest of the records it holds, so that a
repair of a lost transaction can prove its re-computation identical before anything becomes
visible (``txn/protocol/record_digest.py``). Hashing in Python would cost the writer a call per
record; Spark's ``xxhash64`` runs in generated code beside the computation, before the window
opens, and the writer only sums one int64 column per batch and drops it before producing.
"""

from __future__ import annotations

from typing import Any

# Not a column of the contract (``spark/contract.py``): added after the frame is checked, removed by
# the partition writer (``txn/two_phase/partition_writer.py``), never produced to Kafka.
from airflow_provider_kafka2pc.txn.two_phase.partition_writer import DIGEST_COLUMN


def with_digest(df: Any) -> Any:
    """``df`` with the digest column: Spark's xxhash64 of (the key is null, key, value). The key's
    nullness is hashed because xxhash64 skips null inputs: (null, v) and (v, null) stay apart."""
    from pyspark.sql import functions as F

    names = df.schema.names
    parts = [F.col("key").isNull(), F.col("key")] if "key" in names else [F.lit(True)]
    return df.withColumn(DIGEST_COLUMN, F.xxhash64(*parts, F.col("value")))


def only_partitions(df: Any, slots: tuple[int, ...]) -> Any:
    """``df`` with rows only in the Spark partitions ``slots`` (a repair's lost ones): the other
    partitions come out empty, so their writers open no transaction. The filter is narrow, so every
    partition keeps its number, which the transactional ids are named after."""
    from pyspark.sql import functions as F

    return df.where(F.spark_partition_id().isin(list(slots)))


__all__ = ["DIGEST_COLUMN", "only_partitions", "with_digest"]
