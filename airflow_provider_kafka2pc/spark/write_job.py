"""The write job: the transactions' side of the window (DESIGN §3b.3).

``run_write_job`` runs the write job of the export's way (``spark/export_way.py``: the frame as stored,
staged files, a barrier stage, or computed in the window) through the partition writer, watched against
the budget: a job that fails or overruns is stopped and what it opened is aborted at once.
``check_window_left`` refuses a prepare that ends too close to its broker deadline. Every message
here says what became of the opened transactions.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.progress import Progress, ProgressReporter
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.export_result import ExportResult
    from airflow_provider_kafka2pc.spark.export_way import ExportWay
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.window import WindowBudget

log = logging.getLogger(__name__)


ARROW_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"

ARROW_MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
# Spark skips its per-row size check of an Arrow batch for exactly this byte bound (Int.MaxValue).

ARROW_BYTES_UNCHECKED = 2**31 - 1


def arrow_batch_bounds(spark: Any) -> str:
    """How Spark bounds the Arrow batches it hands the writers, said in the task log: Spark checks
    the byte bound after every row, ~40 % of its JVM's CPU in that hop (docs/design.md), and the
    user guide says when to turn the check off. Read only, never changed here: without the byte
    bound, large records make batches of hundreds of MB, or fail Arrow's 2 GiB buffer limit.
    Spark 3.5 has no byte bound (``spark/versions.py``): its batches are bounded by records only,
    which the user guide says to lower for large records."""
    from airflow_provider_kafka2pc.spark.versions import has_arrow_byte_bound

    try:
        records = int(spark.conf.get(ARROW_MAX_RECORDS_PER_BATCH))
        count = f"{records} records" if records > 0 else "no record bound"
        if not has_arrow_byte_bound(spark.version):  # asking 3.5 for the setting logs a Py4J error
            return (
                f"{count}, no byte bound (Spark {spark.version} has no {ARROW_MAX_BYTES_PER_BATCH}): for records "
                f"larger than a few KB, lower {ARROW_MAX_RECORDS_PER_BATCH} so that a batch stays far below "
                "Arrow's 2 GiB (see the user guide)"
            )
        size = str(spark.conf.get(ARROW_MAX_BYTES_PER_BATCH))
    except Exception as e:  # a courtesy: never fail the export for it
        return f"unknown ({e!r})"
    if size.rstrip("b") == str(ARROW_BYTES_UNCHECKED):
        return f"{count}, bytes unchecked ({ARROW_MAX_BYTES_PER_BATCH}={size})"
    return (
        f"{count} or {size}, the bytes checked after every row (for records of a few KB, "
        f"{ARROW_MAX_BYTES_PER_BATCH}={ARROW_BYTES_UNCHECKED} skips the check: see the user guide)"
    )


def run_write_job(
    way: ExportWay,
    spark: Any,
    settings: ExportSettings,
    window: WindowSettings,
    budget: WindowBudget | None,
    on_progress: Callable[[Progress], None] | None,
    progress_interval_s: float,
    abort_opened: Callable[[], bool] | None,
) -> tuple[list[Any], float, int]:
    """The write job of ``way`` (``spark/export_way.py``), watched against the budget; on failure
    what it opened is aborted at once. A barrier job's tasks compute, agree on the budget and then
    write (``spark/barrier_job.py``): they watch the budget themselves, from the moment they open.
    Returns the way's answer: its rows, the write's duration and its start (wall-clock ms on the
    driver)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_provider_kafka2pc.spark.errors import BarrierSlotsError, ExecutorLostError
    from airflow_provider_kafka2pc.spark.export_way import WriteJobEnd
    from airflow_provider_kafka2pc.spark.window import WriteWatch, is_executor_lost
    from airflow_provider_kafka2pc.txn.protocol.errors import WindowExceededError
    from airflow_provider_kafka2pc.txn.two_phase.export_try import superseded_error

    reporter = ProgressReporter(spark, on_progress, progress_interval_s) if on_progress else None
    task = way.write_task(settings, window, reporter.written if reporter is not None else None)
    frame = way.write_frame(spark)
    log.info("kafka2pc Arrow batches to the writers: %s", arrow_batch_bounds(spark))
    # A barrier job computes before it opens anything: its tasks watch the write's budget, the
    # driver's watch only holds the job's tag (to wait for its tasks after a failure).
    watch_ms = _COMPUTING_MS if task.barrier else budget.write_ms if budget is not None else None
    watch = WriteWatch(spark, watch_ms) if watch_ms is not None else None
    started, started_ms = time.monotonic(), int(time.time() * 1000)
    try:
        with reporter or contextlib.nullcontext(), watch or contextlib.nullcontext():
            if task.barrier:
                log.info("kafka2pc barrier job started: its tasks compute first, then open their transactions")
            elif watch is not None:
                log.info("kafka2pc write phase started: transactions open from %s", iso(watch.started_ms))
            rows = frame.mapInArrow(task.function, from_arrow_schema(task.schema), barrier=task.barrier).collect()
    except Exception as e:
        if (superseded := superseded_error(settings)) is not None:
            # Its writers stood down, and what it may have opened is the newer try's to end: no abort here.
            raise superseded from e
        if watch is None:
            raise
        seconds = time.monotonic() - started
        ended = watch.wait_tasks_ended()
        aborted = abort_now(abort_opened, ended)
        assert budget is not None
        if watch.overran:
            raise WindowExceededError(
                f"the write phase ran past its budget: {budget.write_ms} ms of transaction.timeout.ms="
                f"{budget.timeout_ms} (commit headroom {budget.headroom_ms} ms, hand-over {budget.handover_ms} ms). "
                f"The job was stopped after {seconds:.1f} s and {aborted}: nothing of the run is visible. "
                + overrun_fix(budget)
            ) from e
        if BARRIER_SLOTS_REFUSED in str(e):
            raise BarrierSlotsError(
                f"Spark refused the barrier stage of {way.write_slots()} task(s): the cluster has fewer free task "
                f"slots now (Spark's slot check, spark.scheduler.barrier.maxConcurrentTasksCheck.*), and {aborted}: "
                "nothing of the run is visible. Over Spark Connect the slots are the splits spark.range takes (the "
                "server's spark.default.parallelism or spark.sql.leafNodeDefaultParallelism where set, else its "
                "cores) over spark.task.cpus: give the server the cores they say, or export with store='checkpoint'; "
                "on a cluster that lost executors, clear the DAG run once they are back"
            ) from e
        if is_executor_lost(e):
            raise ExecutorLostError(
                f"an executor holding materialized partitions was lost during the write ({seconds:.1f} s in); "
                f"the write job failed and {aborted}: nothing of the run is visible. Clear the DAG run to export "
                "it again; to survive a lost executor without recomputing, give the export a reliable "
                "checkpoint_dir (HDFS, S3, a shared disk)."
            ) from e
        raise
    return way.answered(WriteJobEnd(rows, time.monotonic() - started, started_ms, budget, abort_opened))


# Spark's words when its slot check refuses a barrier stage wider than the cluster (SPARK-24819).
BARRIER_SLOTS_REFUSED = "SPARK-24819"

# The driver's watch over a barrier job never fires: the job computes the source for as long as it
# takes (a year, in ms), and its tasks stop their own write at the budget.
_COMPUTING_MS = 365 * 24 * 3600 * 1000


def overrun_fix(budget: WindowBudget) -> str:
    from airflow_provider_kafka2pc.txn.protocol.window import NOT_MATERIALIZED

    if budget.estimate is None and budget.unknown == NOT_MATERIALIZED:
        return (
            "The source was computed inside the window (materialize=False): turn materialize on (the default) so "
            "that it is computed before any transaction opens, then clear the DAG run."
        )
    expected = (
        f"It was expected to take {budget.estimate.expected_ms / 1000:.1f} s"
        if budget.estimate is not None
        else f"Its time could not be estimated ({budget.unknown})"
    )
    return (
        f"{expected}: a task was slow or queued (fewer task slots than partitions, a lost executor, a slow or "
        "throttled broker). Clear the DAG run to try again; give the export more task slots, or split it into "
        "several exports feeding one commit."
    )


def check_window_left(
    result: ExportResult, budget: WindowBudget, abort_opened: Callable[[], bool] | None, write_started_ms: int
) -> None:
    """A prepare never ends green holding transactions the commit can no longer commit in time.
    The window is counted from the write job's start on the driver's clock, or from the first
    record if an executor's clock says earlier."""
    from airflow_provider_kafka2pc.txn.protocol.errors import WindowExceededError

    if not result.committables:
        return
    first = min(write_started_ms, result.first_write_ms or write_started_ms)
    now = int(time.time() * 1000)
    left = first + budget.timeout_ms - now
    log.info(
        "kafka2pc prepared %d transaction(s): the first opened %s; they must be committed by %s (%d ms from now, "
        "the commit keeps %d ms of headroom)",
        len(result.committables),
        iso(first),
        iso(first + budget.timeout_ms),
        left,
        budget.headroom_ms,
    )
    if left >= budget.headroom_ms + budget.handover_ms:
        return
    aborted = abort_now(abort_opened, True)
    raise WindowExceededError(
        f"the write phase ended {_before_or_after(left)} the broker's deadline of its first transaction, with less "
        f"than the commit's headroom ({budget.headroom_ms} ms) and the hand-over ({budget.handover_ms} ms) left: the "
        "commit could not end in time. "
        f"It prepared {len(result.committables)} transaction(s) with {result.records} records, and "
        f"{aborted}: nothing of the run is visible. " + overrun_fix(budget)
    )


def _before_or_after(left_ms: int) -> str:
    return f"{left_ms} ms before" if left_ms >= 0 else f"{-left_ms} ms after"


def abort_now(abort_opened: Callable[[], bool] | None, tasks_ended: bool) -> str:
    """Abort what the write job opened, now; says truthfully what became of it."""
    if abort_opened is None:
        return "the abort task aborts every transaction it opened"
    if abort_opened() and tasks_ended:
        return "every transaction it opened was aborted at once"
    return (
        "what it opened could not all be aborted at once (see the log above): the abort task aborts the rest, "
        "and until then read_committed readers of its partitions wait"
    )


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


__all__ = [
    "ARROW_BYTES_UNCHECKED",
    "ARROW_MAX_BYTES_PER_BATCH",
    "ARROW_MAX_RECORDS_PER_BATCH",
    "abort_now",
    "arrow_batch_bounds",
    "check_window_left",
    "iso",
    "overrun_fix",
    "run_write_job",
]
