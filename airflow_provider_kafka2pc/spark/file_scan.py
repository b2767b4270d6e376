"""The one adapter to Spark's physical plan: is a frame a plain scan of columnar files?

A frame whose executed plan only reads Parquet or ORC files (``spark.read.parquet``, a table stored
in them) and keeps, renames, casts or filters their columns with Spark's built-in expressions does
no computation worth keeping out of the transaction window: writing it reads the files, as writing
staged Arrow files does, and decodes them on the way. Staging it first would cost a second pass over
the same bytes (DESIGN §3b.6: about 0.7 times the speed of writing it directly, measured on two cores), so the
export writes it as it is stored and says so in the task log.

Anything else (an exchange, a join, an aggregation, a sort, a window, a Python or Scala UDF, a
subquery, another source such as Kafka or JDBC) answers None and is staged. PySpark has no public
call for the physical plan, so this reaches Spark's JVM (``QueryExecution.executedPlan``, the nodes'
classes, ``children``, ``expressions``, and ``FileSourceScanExec.relation().fileFormat()``);
``tests/integration/test_spark_export.py`` checks this surface on the pinned Spark and fails loudly
when an upgrade moves it. Anything unexpected answers "not a plain scan", which costs only a
staging pass.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_kafka2pc.spark.cache_manager import StoredAlready
from airflow_provider_kafka2pc.txn.protocol.source_files import FileSplit

log = logging.getLogger(__name__)

# Physical nodes that only read, convert or keep rows of a file scan, one input row at most per
# output row. An AdaptiveSparkPlan means an exchange (Spark adds it only then): not here.
_PLAIN_NODES = frozenset({"WholeStageCodegenExec", "InputAdapter", "ColumnarToRowExec", "ProjectExec", "FilterExec"})
# File formats decoded column by column at a rate close to reading staged Arrow files.
_COLUMNAR_FORMATS = ("parquet", "orc")
# Expressions that run user code or another query per row: the row's cost is then unbounded.
_COSTLY_EXPRESSIONS = ("udf", "udaf", "subquery", "python", "pandas")


def plain_file_scan(df: Any) -> StoredAlready | None:
    """How ``df`` reads columnar files with nothing computed on the way, or None (also on Spark
    Connect, whose client has no JVM)."""
    try:
        plan = df._jdf.queryExecution().executedPlan()
        formats: list[str] = []
        if not _plain(plan, formats) or not formats:
            return None
        partitions = int(plan.execute().getNumPartitions())
        kinds = " and ".join(sorted(set(formats)))
        return StoredAlready(f"a plain scan of {kinds} files ({len(formats)} scan(s))", partitions)
    except Exception as e:  # a moved internal: stage instead, and say why in DEBUG
        log.debug("kafka2pc could not read Spark's physical plan: %r", e)
    return None


def _plain(node: Any, formats: list[str]) -> bool:
    """Whether the subtree at ``node`` only scans columnar files and keeps their rows, collecting
    the formats it reads into ``formats``."""
    name = str(node.getClass().getSimpleName())
    if name == "FileSourceScanExec":
        file_format = str(node.relation().fileFormat().getClass().getSimpleName()).lower()
        kind = next((k for k in _COLUMNAR_FORMATS if k in file_format), None)
        if kind is None:
            return False
        formats.append(kind)
        return _cheap(node.expressions())
    if name not in _PLAIN_NODES or not _cheap(node.expressions()):
        return False
    children = node.children().iterator()
    while children.hasNext():
        if not _plain(children.next(), formats):
            return False
    return True


def _cheap(expressions: Any) -> bool:
    """Whether none of ``expressions`` (a Scala sequence), at any depth, runs user code or a query."""
    pending = []
    items = expressions.iterator()
    while items.hasNext():
        pending.append(items.next())
    while pending:
        expression = pending.pop()
        kind = str(expression.getClass().getSimpleName()).lower()
        if any(word in kind for word in _COSTLY_EXPRESSIONS):
            return False
        children = expression.children().iterator()
        while children.hasNext():
            pending.append(children.next())
    return True


def file_splits(df: Any) -> dict[int, tuple[FileSplit, ...]] | None:
    """The file splits each Spark partition of ``df`` reads, when ``df`` is a plain scan of one set
    of columnar files (its partitions are the scan's); None otherwise (also on Spark Connect). Reads
    the scan's planned partitions (``FileSourceScanExec.inputRDD``: ``FilePartition.files``, each a
    ``PartitionedFile``); nothing is read from the files."""
    try:
        plan = df._jdf.queryExecution().executedPlan()
        formats: list[str] = []
        if not _plain(plan, formats) or len(formats) != 1:
            return None
        scan = _scan_of(plan)
        splits: dict[int, tuple[FileSplit, ...]] = {}
        for partition in scan.inputRDD().partitions():
            splits[int(partition.index())] = tuple(
                FileSplit(str(f.filePath().toString()), int(f.start()), int(f.length()), int(f.fileSize()),
                          int(f.modificationTime()))
                for f in partition.files()
            )  # fmt: skip
        return splits
    except Exception as e:  # a moved internal: the refusal then names no file
        log.debug("kafka2pc could not read the files of Spark's scan: %r", e)
    return None


def _scan_of(node: Any) -> Any:
    """The one FileSourceScanExec under a plain scan's ``node``."""
    while str(node.getClass().getSimpleName()) != "FileSourceScanExec":
        node = node.children().iterator().next()
    return node


__all__ = ["file_splits", "plain_file_scan"]
