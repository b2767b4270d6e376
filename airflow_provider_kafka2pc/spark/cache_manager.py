"""The one adapter to Spark's cache manager: is a frame already stored, whole, so that writing it
computes nothing?

A frame whose whole plan is a cached query with every partition held now (``df.cache()`` and an
action, ``CACHE TABLE``), at a storage level that spills to disk rather than evicting, or a
checkpoint (``df.checkpoint()``, ``df.localCheckpoint()``), needs no staging: its write job reads
stored rows. PySpark has no public call for either question, so this reaches Spark's JVM
(``CacheManager.lookupCachedData``, ``CachedRDDBuilder.isCachedColumnBuffersLoaded``, the blocks
``SparkContext.getRDDStorageInfo`` counts now, ``LogicalRDD.rdd().isCheckpointed``);
``tests/integration/test_spark_export.py`` checks this surface on the pinned Spark and fails loudly
when an upgrade moves it. Anything unexpected answers "not stored", which costs only a staging pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredAlready:
    """How a frame is stored, for the task log, and its partition count."""

    how: str
    partitions: int


def stored_already(df: Any) -> StoredAlready | None:
    """How ``df`` is already stored whole, or None (not stored, partly loaded, or Spark Connect)."""
    try:
        jdf, jsession = df._jdf, df.sparkSession._jsparkSession
    except Exception:  # Spark Connect: the client has no JVM
        return None
    try:
        cached = jsession.sharedState().cacheManager().lookupCachedData(jdf)
        if not cached.isEmpty():
            builder = cached.get().cachedRepresentation().cacheBuilder()
            level = builder.storageLevel()
            if not builder.isCachedColumnBuffersLoaded():
                return None
            if not level.useDisk():  # an evicted partition would be computed again inside the window
                return None
            buffers = builder.cachedColumnBuffers()
            partitions = int(buffers.getNumPartitions())
            # Loaded once is a latch in Spark: the blocks a lost executor took are counted here, now.
            if _cached_partitions(df.sparkSession, int(buffers.id())) != partitions:
                return None
            return StoredAlready(f"a cached frame, every partition loaded ({level.description()})", partitions)
        plan = jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "LogicalRDD" and plan.rdd().isCheckpointed():
            return StoredAlready("a checkpoint", int(plan.rdd().getNumPartitions()))
    except Exception as e:  # a moved internal: stage instead, and say why in DEBUG
        log.debug("kafka2pc could not ask Spark's cache manager: %r", e)
    return None


def _cached_partitions(spark: Any, rdd_id: int) -> int:
    """How many partitions of RDD ``rdd_id`` the block managers hold now (SparkContext's storage info)."""
    for info in spark.sparkContext._jsc.sc().getRDDStorageInfo():
        if int(info.id()) == rdd_id:
            return int(info.numCachedPartitions())
    return 0


__all__ = ["StoredAlready", "stored_already"]
