"""The one adapter to Spark's analyzed plan for a repair: can the frame give the same records again?

A repair computes a lost run's Spark partitions again and proves them identical by their digest
before anything becomes visible (DESIGN §6). The digest is the proof; this check refuses up front,
with the reason, a frame that cannot be expected to pass it:

- a **non-deterministic** plan (``rand()``, ``uuid()``, ``monotonically_increasing_id()``,
  ``input_file_name()``, a non-deterministic UDF): Spark itself marks these expressions;
- a frame that reads a **cache** (``df.cache()``, ``CACHE TABLE``): it holds what it read when it
  was filled, not what the run read.

Qualifying sources: a Kafka source (the run's range is stored and read again), a scan of files
that have not changed, and deterministic computations over them. PySpark has no public call for
either question, so this reaches Spark's JVM (``QueryExecution.analyzed``, ``withCachedData``,
``deterministic``, the nodes' classes and ``children``); ``tests/integration/test_repair_spark.py``
checks this surface on the pinned Spark.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def why_not_repeatable(df: Any) -> str | None:
    """Why ``df`` cannot be expected to give its records again, or None. On Spark Connect, whose
    client has no JVM, or if the internals moved, None: the digest alone decides."""
    try:
        execution = df._jdf.queryExecution()
    except Exception:
        return None
    try:
        if _has_node(execution.withCachedData(), "InMemoryRelation"):
            return (
                "the frame reads a cache (df.cache(), df.persist() or CACHE TABLE), which holds what it read when it "
                "was filled, not what the run read; build the source without the cache"
            )
        if not bool(execution.analyzed().deterministic()):
            return (
                "the frame's plan is not deterministic (it uses rand(), uuid(), monotonically_increasing_id(), "
                "input_file_name() or a non-deterministic UDF), so a re-computation gives other records"
            )
    except Exception as e:  # a moved internal: the digest still refuses a different re-computation
        log.debug("kafka2pc could not read Spark's analyzed plan: %r", e)
    return None


def _has_node(plan: Any, name: str) -> bool:
    pending = [plan]
    while pending:
        node = pending.pop()
        if str(node.getClass().getSimpleName()) == name:
            return True
        children = node.children().iterator()
        while children.hasNext():
            pending.append(children.next())
    return False


__all__ = ["why_not_repeatable"]
