"""Keeping computation out of the transaction window (DESIGN §3b), on the Spark side.

1. ``materialize``: the DataFrame is computed and stored before any transaction opens with a local
   checkpoint on the executors, or a reliable one in ``checkpoint_dir``, and its size per partition
   is read from the stored data; the write job then only moves stored rows into Kafka. This is the
   way where staging Arrow files cannot serve (``spark/compute_first.py`` chooses).
2. ``WriteWatch``: the driver stops the write job when it runs past the budget of
   ``txn.protocol.window.WindowBudget``, so that a prepare never ends holding doomed transactions.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.spark.column_functions import functions_for
from airflow_provider_kafka2pc.spark.errors import ExecutorLostError
from airflow_provider_kafka2pc.spark.export_way import ExportWay, validate_store
from airflow_provider_kafka2pc.txn.protocol.window import DEFAULT_HANDOVER_MS, PartitionSize, WriteRate

log = logging.getLogger(__name__)

# How long the driver waits for the tasks of a stopped write job to end before it aborts what they
# opened: a killed task's Python worker is destroyed after spark.python.task.killTimeout (2 s).
STOPPED_TASKS_WAIT_S = 20.0
# spark.python.task.killTimeout (2 s) and a second: a killed task's worker is destroyed by then.
PYTHON_WORKER_KILL_S = 3.0


@dataclass(frozen=True)
class WindowSettings:
    """How an export keeps its window short; the defaults are what the operator uses.

    :param materialize: compute and store the DataFrame before any transaction opens.
    :param store: how: ``auto`` stages Arrow files on the executors' host where the driver and the
        executors share one (``spark/staging.py``), a barrier stage where they do not
        (``spark/barrier_job.py``), else a checkpoint; ``arrow``, ``barrier`` or ``checkpoint``
        force one (``arrow`` and ``barrier`` fail where they cannot).
    :param checkpoint_dir: store it there (a reliable checkpoint: survives a lost executor) instead
        of on the executors (a local checkpoint). Its files are deleted after the export.
    :param commit_headroom_ms: what the commit keeps before the broker deadline; derived when None.
    :param handover_ms: allowance between the prepare's end and the commit's first EndTxn.
    :param write_records_per_s: the rate per task slot the user states for the budget (records/s).
    :param write_bytes_per_s: likewise in bytes/s; with neither, the rate an earlier run showed.
    :param shown_rate: the rate per slot an earlier run of the exporter showed (the operator passes it).
    """

    materialize: bool = True
    store: str = "auto"
    checkpoint_dir: str | None = None
    commit_headroom_ms: int | None = None
    handover_ms: int = DEFAULT_HANDOVER_MS
    write_records_per_s: int | None = None
    write_bytes_per_s: int | None = None
    shown_rate: WriteRate | None = None

    def __post_init__(self) -> None:
        # Checked when the DAG is parsed, not after hours of materializing.
        validate_store(self.store)
        if self.commit_headroom_ms is not None and self.commit_headroom_ms < 0:
            raise ValueError(f"commit_headroom_ms={self.commit_headroom_ms}: must be >= 0")
        if self.handover_ms < 0:
            raise ValueError(f"handover_ms={self.handover_ms}: must be >= 0")
        if any(r is not None and r <= 0 for r in (self.write_records_per_s, self.write_bytes_per_s)):
            raise ValueError("write_records_per_s and write_bytes_per_s must be positive")

    @property
    def rate_stated(self) -> bool:
        """Whether the user states a rate (not only one an earlier run showed)."""
        return self.write_records_per_s is not None or self.write_bytes_per_s is not None

    def rate(self) -> WriteRate | None:
        """The rate the budget refuses by: the one the user states, else one an earlier run showed."""
        if not self.rate_stated:
            return self.shown_rate
        stated = ", ".join(
            f"{name}={value}"
            for name, value in (
                ("write_records_per_s", self.write_records_per_s),
                ("write_bytes_per_s", self.write_bytes_per_s),
            )
            if value is not None
        )
        return WriteRate(self.write_records_per_s, self.write_bytes_per_s, f"stated: {stated}")


@dataclass
class Materialized(ExportWay):
    """The source stored before the window (a checkpoint), or found stored already (a cache, a
    checkpoint, plain files): the write job maps it as it is."""

    df: Any
    sizes: list[PartitionSize] | None  # None: not counted (a frame stored already, and no rate to budget by)
    seconds: float
    where: str
    partitions: int = 0  # of the stored frame, when its sizes were not counted
    _cleanup_dir: str | None = None
    _spark: Any = None
    _stored_rdds: tuple[int, ...] = ()

    def write_frame(self, spark: Any) -> Any:
        return self.df

    def release(self) -> None:
        """Free what was stored: the local checkpoint's blocks, or the reliable checkpoint's files."""
        _release(self._spark, self._stored_rdds, self._cleanup_dir)


def _persistent_rdds(spark: Any) -> set[int]:
    """The ids of the session's persisted RDDs (classic only: through the JVM, PySpark has no call)."""
    sc = classic_context(spark)
    if sc is None:
        return set()
    try:
        return {int(k) for k in sc._jsc.getPersistentRDDs().keySet()}
    except Exception as e:
        log.debug("persisted RDDs unavailable: %r", e)
        return set()


def _release(spark: Any, stored: tuple[int, ...], cleanup_dir: str | None) -> None:
    """A local checkpoint's blocks belong to an RDD that ``DataFrame.unpersist`` does not reach (it is
    no cached query): drop that RDD's blocks by id, through SparkContext.unpersistRDD (RDD.unpersist
    would log a WARNING that a locally checkpointed RDD cannot be recomputed: known, and no longer
    needed here). A Connect server frees them when the frame is gone."""
    sc = classic_context(spark)
    for rdd_id in stored if sc is not None else ():
        try:
            sc._jsc.sc().unpersistRDD(rdd_id, False)
        except Exception as e:  # freed with the session anyway
            log.debug("unpersist of RDD %d failed: %r", rdd_id, e)
    if cleanup_dir is not None:
        _delete_dir(spark, cleanup_dir)


def _delete_dir(spark: Any, path: str) -> None:
    """Delete a checkpoint directory through Hadoop's FileSystem (any scheme Spark can write).

    PySpark has no public call for it: this reaches the JVM through the SparkContext (classic only)."""
    try:
        sc = spark.sparkContext
        jvm_path = sc._jvm.org.apache.hadoop.fs.Path(path)
        jvm_path.getFileSystem(sc._jsc.hadoopConfiguration()).delete(jvm_path, True)
        log.info("kafka2pc deleted the export's checkpoint files in %s", path)
    except Exception as e:
        log.warning("kafka2pc could not delete the export's checkpoint files in %s: %r; delete them by hand", path, e)


def materialize(df: Any, settings: WindowSettings) -> Materialized:
    """Compute ``df`` and store it before any transaction opens; read its size per partition.

    A local checkpoint keeps the rows on the executors (memory, spilling to their local disks) and
    cuts the lineage, so the write job never recomputes the source: if an executor is lost while
    writing, its partitions fail the job (then the export aborts) instead of recomputing inside the
    window. A reliable checkpoint in ``checkpoint_dir`` survives a lost executor."""
    started = time.monotonic()
    spark = df.sparkSession
    before = _persistent_rdds(spark)
    cleanup: str | None = None
    sc = classic_context(spark)
    if settings.checkpoint_dir and sc is not None:
        # A directory of the export's own (setCheckpointDir adds one more below it): deleted after.
        cleanup = settings.checkpoint_dir.rstrip("/") + f"/kafka2pc-{uuid.uuid4().hex[:12]}"
        sc.setCheckpointDir(cleanup)
    try:
        stored, where, sizes = _store_and_measure(df, settings, here=cleanup is not None)
    except BaseException:
        # What a failed materializing stored (say the checkpoint done, the size job failed) goes too.
        _release(spark, tuple(_persistent_rdds(spark) - before), cleanup)
        raise
    stored_rdds = tuple(sorted(_persistent_rdds(spark) - before))
    return Materialized(stored, sizes, time.monotonic() - started, where, 0, cleanup, spark, stored_rdds)


def _store_and_measure(df: Any, settings: WindowSettings, here: bool) -> tuple[Any, str, list[PartitionSize]]:
    if settings.checkpoint_dir:
        stored = df.checkpoint(eager=True)
        where = (
            f"a reliable checkpoint in {settings.checkpoint_dir}"
            if here
            else "a reliable checkpoint in the Spark Connect server's spark.checkpoint.dir"
        )
    else:
        stored = df.localCheckpoint(eager=True)
        where = "a local checkpoint on the executors"
    return stored, where, partition_sizes(stored)


def partition_sizes(stored: Any) -> list[PartitionSize]:
    """Records and key + value bytes of each non-empty partition of a stored frame (one small job)."""
    F = functions_for(stored)
    size = F.octet_length(F.col("value"))
    if "key" in stored.columns:
        size = size + F.coalesce(F.octet_length(F.col("key")), F.lit(0))
    rows = (
        stored.groupBy(F.spark_partition_id().alias("p"))
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.coalesce(size, F.lit(0))).alias("b"))
        .collect()
    )
    return sorted((PartitionSize(int(r["p"]), int(r["n"]), int(r["b"] or 0)) for r in rows), key=lambda s: s.partition)


def classic_context(spark: Any) -> Any:
    """The session's SparkContext, or None over Spark Connect (the client has none)."""
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect: the server's spark.checkpoint.dir applies
        return None


def task_slots(spark: Any) -> int:
    """How many tasks the session runs at once: the default parallelism (classic), else
    spark.default.parallelism if the session says, else 1 (a budget that errs on the safe side)."""
    sc = classic_context(spark)
    if sc is not None:
        return max(int(sc.defaultParallelism), 1)
    try:
        return max(int(spark.conf.get("spark.default.parallelism")), 1)
    except Exception:
        return 1


class WriteWatch:
    """Stops the write job if it is still running ``budget_ms`` after it started.

    The job runs under a tag of its own: a SparkContext job tag with interrupt-on-cancel on classic
    sessions (``SparkSession.interruptTag`` does not reach a DataFrame's jobs there: measured), an
    operation tag on Spark Connect. At the deadline the watch cancels that tag; the caller then
    waits for the tasks to end (``wait_tasks_ended``) and aborts what they opened."""

    def __init__(self, spark: Any, budget_ms: int) -> None:
        self.spark = spark
        self.sc = classic_context(spark)
        self.budget_ms = budget_ms
        self.tag = f"kafka2pc-write-{uuid.uuid4().hex[:12]}"
        self.started_ms = 0
        self.overran = False
        self._interrupt: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kafka2pc-window", daemon=True)

    def __enter__(self) -> WriteWatch:
        if self.sc is not None:
            self._interrupt = self.sc.getLocalProperty("spark.job.interruptOnCancel")
            self.sc.addJobTag(self.tag)
            self.sc.setInterruptOnCancel(True)  # a Python UDF or writer blocked in a call stops too
        else:
            self.spark.addTag(self.tag)
        self.started_ms = int(time.time() * 1000)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        if self.sc is not None:
            self.sc.removeJobTag(self.tag)
            self.sc.setLocalProperty("spark.job.interruptOnCancel", self._interrupt)
        else:
            self.spark.removeTag(self.tag)

    def _watch(self) -> None:
        if self._done.wait(max(self.budget_ms, 0) / 1000):
            return
        self.overran = True
        log.error(
            "kafka2pc write phase still running %d ms after it started, its budget: stopping the job", self.budget_ms
        )
        try:
            if self.sc is not None:
                self.sc.cancelJobsWithTag(self.tag)
            else:
                self.spark.interruptTag(self.tag)
        except Exception as e:
            log.warning("stopping the write job failed: %r", e)

    def wait_tasks_ended(self, timeout_s: float = STOPPED_TASKS_WAIT_S) -> bool:
        """After the job failed or was stopped: wait until no task of the session runs any more,
        then the Python workers' kill time. A cancelled stage leaves the active stages at once,
        while its killed tasks (and their writers) may still run: the executors' running tasks
        are what counts (read through the JVM's status tracker: PySpark does not expose it)."""
        sc = classic_context(self.spark)
        if sc is None:
            # Spark Connect: a failure on the client's side (a lost stream) leaves the server's job
            # running, so it is interrupted by its tag (a no-op for a job that ended); the server kills
            # the tasks, which are given the kill timeout.
            try:
                self.spark.interruptTag(self.tag)
            except Exception as e:
                log.warning("stopping the write job on the Spark Connect server failed: %r", e)
            time.sleep(min(5.0, timeout_s))
            return True
        deadline = time.monotonic() + timeout_s
        tracker = sc._jsc.sc().statusTracker()
        while time.monotonic() < deadline:
            try:
                running = sum(int(e.numRunningTasks()) for e in tracker.getExecutorInfos())
            except Exception as e:  # the status tracker is a courtesy: fall back to the kill timeout
                log.debug("executor infos unavailable: %r", e)
                time.sleep(PYTHON_WORKER_KILL_S)
                return True
            if running == 0:
                time.sleep(PYTHON_WORKER_KILL_S)  # a killed task's Python worker may outlive the task
                return True
            time.sleep(0.2)
        return False


def is_executor_lost(error: BaseException) -> bool:
    """The write job failed because stored partitions went with a lost executor."""
    text = str(error)
    return "Checkpoint block" in text and "not found" in text


def partition_count(df: Any) -> int:
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:  # Spark Connect has no RDDs; the headroom then counts one EndTxn wave
        return 1


__all__ = [
    "ExecutorLostError",
    "Materialized",
    "WindowSettings",
    "WriteWatch",
    "classic_context",
    "is_executor_lost",
    "materialize",
    "partition_count",
    "partition_sizes",
    "task_slots",
]
