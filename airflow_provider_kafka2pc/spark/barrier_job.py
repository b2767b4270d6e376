"""One pass where executors run on other hosts than the driver: a barrier stage (DESIGN §3b.6, §13).

Staging (``spark/staging.py``) writes each partition into an Arrow file on the executor that
computed it, then a second job writes the files: that needs every write task on the host of its
file, which Spark prefers but does not enforce, so staging serves one host only. A barrier stage
removes the hand-over: the task that computes a partition also writes it.

1. Every task computes its partition into an Arrow file in its own executor's local directory
   (spilled to disk, never held in memory) and counts its records and bytes. No transaction is open.
2. ``allGather``: every task learns every partition's size, and decides the run's budget for itself
   (``txn.protocol.window.WindowBudget.of_sizes``, the same pure function on every task, so all
   decide alike). A run that cannot fit is refused by every task before any opens a transaction.
3. Each task then opens its transaction and writes its own file (the window starts here, after all
   of the source is computed), watching the budget from that moment: a task still writing past it
   stops, and the driver aborts what the tasks opened.

A barrier stage runs all of its tasks at once, so it has at most as many partitions as the cluster
has task slots. Spark refuses a barrier stage whose own chain changes the number of partitions
(``coalesce``: SPARK-24820), so the frame is repartitioned to the slots: the source is computed by
the shuffle's map tasks, spread over every slot, and each barrier task fetches its share from
wherever Spark's block manager holds it, then stages it on its own host. A task that fails (its
source, its broker, its lost host) fails the job at once: Spark does not run a failed barrier result
stage again ("Could not recover from a failed barrier ResultStage"), and the driver aborts what the
tasks opened, as after any failed write job.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.column_functions import functions_for
from airflow_provider_kafka2pc.spark.export_way import WindowTerms, WriteJobEnd, WriteTask, write_rows
from airflow_provider_kafka2pc.spark.window import Materialized, classic_context, partition_count, task_slots
from airflow_provider_kafka2pc.txn.protocol.window import PartitionSize, WindowBudget, WriteRate
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing

log = logging.getLogger(__name__)

# What a task says, in its result row, when it opened nothing because the run does not fit, or when
# it stopped writing because the write ran past the budget.
REFUSED, OVERRAN = "refused", "overran"


@dataclass
class BarrierPlan(Materialized):
    """The source, to be computed by the write job's own tasks: nothing is stored before it runs."""

    slots: int = 0
    inputs: int | None = None  # the frame's own Spark partitions before the deal

    def write_task(self, settings: ExportSettings, window: WindowTerms, written: Any) -> WriteTask:
        """Each task stages, agrees the budget with the others, then writes (``barrier_task``)."""
        assert settings.transaction_timeout_ms is not None
        rate = window.rate()
        terms = BudgetTerms(
            settings.transaction_timeout_ms,
            window.commit_headroom_ms,
            window.handover_ms,
            self.slots,
            rate.to_json() if rate is not None else None,
        )
        return WriteTask(barrier_function(settings.to_json(), terms, written), barrier_schema(), barrier=True)

    def answered(self, job: WriteJobEnd) -> tuple[list[Any], float, int]:
        """The write rows, or the refusal or overrun the tasks reported (what they opened aborted).
        The write's start is when the first transaction opened, on the driver's clock."""
        from airflow_provider_kafka2pc.spark.write_job import abort_now, iso, overrun_fix
        from airflow_provider_kafka2pc.txn.protocol.errors import WindowExceededError, WindowRefusedError

        collected_ms = int(time.time() * 1000)
        written, opened_ms, said = split_rows(job.rows, collected_ms)
        refused = [s for s in said if s.startswith(REFUSED)]
        if refused:
            abort_now(job.abort_opened, True)  # nothing was opened; the failure line then says so too
            raise WindowRefusedError(refused[0][len(REFUSED) + 2 :])
        if any(s.startswith(OVERRAN) for s in said):
            budget = job.budget
            assert budget is not None
            aborted = abort_now(job.abort_opened, True)
            raise WindowExceededError(
                f"the write phase ran past its budget: a task was {said[0][len(OVERRAN) + 2 :]} "
                f"(transaction.timeout.ms={budget.timeout_ms}). The tasks stopped writing and {aborted}: nothing of "
                "the run is visible. " + overrun_fix(budget)
            )
        first = opened_ms if opened_ms is not None else job.started_ms
        if opened_ms is not None:
            log.info("kafka2pc write phase: transactions open from %s (the barrier passed)", iso(opened_ms))
        # The stage's time before its first transaction opened computed and staged the source: the
        # export reports it as this way's time before the window, beside the write's.
        self.seconds = max(first - job.started_ms, 0) / 1000
        return written, max(collected_ms - first, 0) / 1000, first

    def dealing(self) -> Dealing | None:
        from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing

        return Dealing(self.slots, self.inputs)

    def write_slots(self) -> int | None:
        return self.slots

    def unsized(self) -> str:
        return "sized by the write job's own tasks: they check this budget with the sizes before any opens"


def barrier_slots(spark: Any) -> int:
    """The tasks a barrier stage can run at once: what Spark's own slot check counts (its executors'
    cores over the default profile's task cpus; private to Spark, read through the JVM), never more
    than the default parallelism; the default parallelism alone where that cannot be read (no
    executor registered yet); over Spark Connect, ``connect_slots``."""
    if classic_context(spark) is None:
        return connect_slots(spark)
    slots = task_slots(spark)
    try:
        jsc = spark.sparkContext._jsc.sc()
        concurrent = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception as e:  # a courtesy: Spark's check still refuses too many tasks, by waiting
        log.debug("Spark's concurrent task slots unavailable: %r", e)
        return slots
    return min(slots, concurrent) if concurrent > 0 else slots


# Rows of the probe job below: more than any cluster's default parallelism, so that every split holds
# a row, and few enough to cost nothing.
_PROBE_ROWS = 1 << 20


def connect_slots(spark: Any) -> int:
    """The task slots of a Spark Connect server, whose scheduler the client cannot reach: the splits
    ``spark.range`` takes when not told (the server's default parallelism, which is its executors'
    cores unless the server sets ``spark.default.parallelism``), over ``spark.task.cpus``. One small
    job (a max over a range), run before anything is computed or opened."""
    F = functions_for(spark)
    # The partition id is projected first: Spark refuses a nondeterministic argument to an aggregate.
    ids = spark.range(0, _PROBE_ROWS).select(F.spark_partition_id().alias("split"))
    row = ids.agg(F.max("split").alias("last")).first()
    splits = int(row["last"]) + 1 if row is not None and row["last"] is not None else 1
    try:
        cpus = max(int(spark.conf.get("spark.task.cpus", "1") or 1), 1)
    except (TypeError, ValueError):
        cpus = 1
    return max(splits // cpus, 1)


def plan_barrier(df: Any, why_not_staged: str, hash_rows: Callable[[Any], Any] | None = None) -> BarrierPlan | str:
    """The barrier plan for ``df``, or why it cannot serve (dynamic allocation). ``hash_rows`` adds
    the digest to the dealt frame: each slot's transaction records the digest of the rows dealt to
    it, which a repair deals again over as many slots (``txn.protocol.source_files``). Over Spark
    Connect the frame's own partition count is unknown without computing it, so the dealing records
    none (a repair then checks the rows' digests only)."""
    spark = df.sparkSession
    sc = classic_context(spark)
    setting = sc.getConf().get if sc is not None else spark.conf.get
    if str(setting("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return f"{why_not_staged}, and with dynamic allocation a barrier stage may wait for executors"
    slots = barrier_slots(spark)
    where = (
        f"each task's own executor ({why_not_staged}): the source is shuffled into {slots} partition(s), one "
        f"per task slot; each task stages its partition in an Arrow file on its host, all agree the run fits, "
        "then each writes the file it staged"
    )
    dealt = df.repartition(slots)
    stored = hash_rows(dealt) if hash_rows is not None else dealt
    inputs = partition_count(df) if sc is not None else None
    return BarrierPlan(stored, None, 0.0, where, slots, slots=slots, inputs=inputs)


@dataclass(frozen=True)
class BudgetTerms:
    """What a task needs to decide the run's budget from the gathered sizes (plain JSON values)."""

    timeout_ms: int
    headroom_ms: int | None
    handover_ms: int
    slots: int
    rate: dict[str, Any] | None

    def budget(self, sizes: list[PartitionSize]) -> WindowBudget:
        rate = WriteRate.from_json(self.rate) if self.rate is not None else None
        return WindowBudget.of_sizes(self.timeout_ms, self.headroom_ms, self.handover_ms, sizes, self.slots, rate)


def task_directory() -> str:
    """A directory of this executor's host for one task's file: the executor's local directories
    (standalone: SPARK_EXECUTOR_DIRS; local mode: SPARK_LOCAL_DIRS), else the system's temp dir."""
    dirs = os.environ.get("SPARK_EXECUTOR_DIRS", "").split(os.pathsep)[0]
    dirs = dirs or os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    parent = dirs or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="kafka2pc-barrier-", dir=parent)


class _Overran(Exception):
    pass


def _until(deadline: float, batches: Iterator[Any]) -> Iterator[Any]:
    for batch in batches:
        if time.monotonic() > deadline:
            raise _Overran()
        yield batch


def barrier_task(
    payload: str,
    terms: BudgetTerms,
    ctx: Any,
    batches: Iterator[Any],
    gather: Callable[[str], list[str]],
    written: Any = None,
) -> Iterator[Any]:
    """The body of one barrier task: stage, agree, write. ``gather`` is the barrier's ``allGather``
    (all tasks exchange one message each). Yields result rows with ``open_for_ms`` (how long its
    transaction had been open when the row was made: a duration, free of the executors' clock skew)
    and ``outcome``; ``written`` (an accumulator) counts the records for the progress lines."""
    import shutil

    from airflow_provider_kafka2pc.spark.staging import stage_partition, staged_batches

    partition, attempt = ctx.partitionId(), ctx.attemptNumber()
    directory = task_directory()
    try:
        summary = next(stage_partition(directory, partition, ctx.taskAttemptId(), batches)).to_pylist()[0]
        mine = {"partition": partition, "records": summary["records"], "bytes": summary["bytes"]}
        told = [json.loads(m) for m in gather(json.dumps(mine))]
        sizes = [PartitionSize(int(m["partition"]), int(m["records"]), int(m["bytes"])) for m in told]
        budget = terms.budget(sizes)
        if not budget.fits:
            yield _row(partition, attempt, 0, REFUSED + ": " + str(budget.refusal()))
            return
        opened = time.monotonic()
        staged = staged_batches(directory, partition, summary["file"], summary["records"], summary["machine"])
        deadline = time.monotonic() + budget.write_ms / 1000
        try:
            for out in write_rows(payload, ctx, _until(deadline, staged), written):
                yield _with(out, _since(opened))
        except _Overran:
            # Left open: the driver aborts what the run opened once every task has answered.
            yield _row(
                partition, attempt, _since(opened), f"{OVERRAN}: still writing {budget.write_ms} ms after it opened"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def barrier_schema() -> Any:
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import result_schema

    return result_schema().append(pa.field("open_for_ms", pa.int64())).append(pa.field("outcome", pa.string()))


def _since(opened: float) -> int:
    return max(int((time.monotonic() - opened) * 1000), 1)


def _with(batch: Any, open_for_ms: int) -> Any:
    import pyarrow as pa

    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([open_for_ms] * n, pa.int64()), pa.array([None] * n, pa.string())],
        schema=barrier_schema(),
    )


def _row(partition: int, attempt: int, open_for_ms: int, outcome: str) -> Any:
    import pyarrow as pa

    row = {
        "slot": partition,
        "attempt": attempt,
        "records": 0,
        "bytes": 0,
        "counts": "{}",
        "committable": None,
        "open_for_ms": open_for_ms,
        "outcome": outcome,
    }
    return pa.RecordBatch.from_pylist([row], schema=barrier_schema())


def barrier_function(payload: str, terms: BudgetTerms, written: Any = None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function ``mapInArrow(..., barrier=True)`` runs in each task."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        yield from barrier_task(payload, terms, ctx, batches, ctx.allGather, written)

    return run


def split_rows(rows: list[Any], collected_ms: int) -> tuple[list[Any], int | None, list[str]]:
    """The write rows, when the first transaction opened (on the driver's clock: the rows were
    ``collected_ms``, each says how long its transaction had been open), and what the tasks that
    opened nothing or stopped said."""
    said = sorted({str(r["outcome"]) for r in rows if r["outcome"]})
    written = [r for r in rows if not r["outcome"] and r["records"] > 0]
    open_for = [int(r["open_for_ms"]) for r in rows if int(r["open_for_ms"] or 0) > 0]
    return written, collected_ms - max(open_for) if open_for else None, said


__all__ = [
    "OVERRAN",
    "REFUSED",
    "BarrierPlan",
    "BudgetTerms",
    "barrier_function",
    "barrier_schema",
    "barrier_task",
    "connect_slots",
    "plan_barrier",
    "split_rows",
    "task_directory",
]
