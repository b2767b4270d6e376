"""The prepare job: every Spark partition writes one Kafka transaction and reports its committable.

Runs ``mapInArrow`` over the DataFrame. Each task opens a writer lazily (an empty partition opens
nothing and leaves no transaction), produces its rows, flushes, and yields one row: the
committable as JSON (EXACTLY_ONCE) or just its counts. The driver collects those rows, checks
that they are exactly one per non-empty partition, and returns them with a summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.contract import validate_schema
from airflow_provider_kafka2pc.txn import naming
from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.window import WindowBudget, WriteRate
    from airflow_provider_kafka2pc.txn.writer import DeliveryWriter

log = logging.getLogger(__name__)


class DeliveryGuarantee(StrEnum):
    EXACTLY_ONCE = "EXACTLY_ONCE"  # one transaction per partition, committed by the coordinator
    AT_LEAST_ONCE = "AT_LEAST_ONCE"  # idempotent producer, flushed; a retried task may duplicate
    NONE = "NONE"  # acks=1, no idempotence


class SpeculationError(Kafka2PCError):
    """Speculative execution would let a late task attempt fence a finished one."""


class CollectError(Kafka2PCError):
    """The collected set is not exactly one committable per non-empty partition."""


@dataclass(frozen=True)
class ExportSettings:
    transactional_id_prefix: str
    producer_config: Mapping[str, Any]
    topic: str | None = None
    naming_strategy: naming.NamingStrategy = naming.NamingStrategy.POOLING
    run_key: str | None = None
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    transaction_timeout_ms: int | None = None
    # Testing aid: the first attempt of this partition raises after writing N records.
    fail_first_attempt: tuple[int, int] | None = None
    # "auto": the native path (Arrow buffers into librdkafka's batch API, txn/native.py) where it
    # can write the frame, the Python loop otherwise; "native" or "python" force one (native fails
    # loudly where it cannot).
    writer: str = "auto"

    def to_json(self) -> str:
        d = asdict(self)
        d["producer_config"] = dict(self.producer_config)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ExportSettings:
        d = json.loads(text)
        d["naming_strategy"] = naming.NamingStrategy(d["naming_strategy"])
        d["delivery_guarantee"] = DeliveryGuarantee(d["delivery_guarantee"])
        if d.get("fail_first_attempt") is not None:
            d["fail_first_attempt"] = tuple(d["fail_first_attempt"])
        return cls(**d)

    def transactional_id(self, slot: int) -> str:
        return naming.transactional_id(self.transactional_id_prefix, slot, self.naming_strategy, self.run_key)


@dataclass(frozen=True)
class ExportResult:
    committables: tuple[Committable, ...]
    records: int
    bytes: int
    partitions: int  # non-empty Spark partitions written
    counts_by_topic: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    retried: tuple[int, ...] = ()  # partitions whose successful attempt was a retry
    budget: WindowBudget | None = None  # EXACTLY_ONCE: the window the write phase had
    materialize_s: float = 0.0  # computing and storing the frame, before any transaction opened
    write_s: float = 0.0  # the write job: transactions open from its start
    write_rate: WriteRate | None = None  # what a task slot wrote per second (materialized frames only)
    staged_bytes: int = 0  # the Arrow files the source was staged in (spark/staging.py), if it was

    @property
    def first_write_ms(self) -> int | None:
        """Wall-clock ms of the run's first transactional record (its window opens there)."""
        return min((c.first_write_ms for c in self.committables if c.first_write_ms), default=None)

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "bytes": self.bytes,
            "partitions": self.partitions,
            "transactions": len(self.committables),
            "counts_by_topic": dict(self.counts_by_topic),
            "duration_s": round(self.duration_s, 3),
            "retried_partitions": list(self.retried),
            "materialize_s": round(self.materialize_s, 3),
            "write_rate": self.write_rate.to_json() if self.write_rate is not None else None,
            "staged_bytes": self.staged_bytes,
            "write_s": round(self.write_s, 3),
            "first_write_ms": self.first_write_ms,
            # With first_write_ms, a lower bound of the broker deadline that a failed commit can name
            # without asking Kafka (the XCom's committables do not carry it).
            "transaction_timeout_ms": min(
                (c.transaction_timeout_ms for c in self.committables if c.transaction_timeout_ms), default=None
            ),
        }


@dataclass(frozen=True)
class Progress:
    """Where the prepare job stands; records count the partitions that finished."""

    partitions_done: int
    partitions: int
    running: int
    failed_attempts: int
    records: int
    elapsed_s: float

    def describe(self) -> str:
        rate = self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"prepare: {self.partitions_done} of {self.partitions} partitions done ({self.running} running, "
            f"{self.failed_attempts} failed attempts), {self.records} records written, {rate:.0f} records/s, "
            f"{self.elapsed_s:.0f} s"
        )


class _ProgressReporter:
    """Reports the job every ``interval_s`` and once at the end, from Spark's status tracker and an
    accumulator of the records of finished partitions (Spark merges it as each task succeeds).
    Classic sessions only: Spark Connect has neither."""

    def __init__(self, spark: Any, on_progress: Callable[[Progress], None], interval_s: float) -> None:
        try:
            sc = spark.sparkContext
            self.written: Any = sc.accumulator(0)
            self._tracker: Any = sc.statusTracker()
        except Exception:  # Spark Connect: no SparkContext on the client
            sc, self.written, self._tracker = None, None, None
        self._sc = sc
        # The job runs in a job group of its own, so that the last report finds its stages even when
        # the job ended before the first poll saw it active (the report then said "0 of 0").
        self._group = f"kafka2pc-prepare-{uuid.uuid4().hex[:12]}"
        self._previous_group: str | None = None
        self._on_progress = on_progress
        self._interval_s = interval_s
        self._started = time.monotonic()
        self._stages: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka2pc-progress", daemon=True)

    def __enter__(self) -> _ProgressReporter:
        if self._tracker is not None:
            self._previous_group = self._sc.getLocalProperty("spark.jobGroup.id")
            self._sc.setLocalProperty("spark.jobGroup.id", self._group)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._tracker is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", self._previous_group)
            self._thread.join()
            if exc[0] is None:
                self._report()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._report()

    def _report(self) -> None:
        try:
            for job_id in self._tracker.getJobIdsForGroup(self._group):
                job = self._tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    if (info := self._tracker.getStageInfo(stage_id)) is not None:
                        self._stages[stage_id] = info
            # Stages seen active, as last seen or as they ended (the status store keeps them).
            infos = [self._tracker.getStageInfo(i) or info for i, info in self._stages.items()]
            self._on_progress(
                Progress(
                    partitions_done=sum(i.numCompletedTasks for i in infos),
                    partitions=sum(i.numTasks for i in infos),
                    running=sum(i.numActiveTasks for i in infos),
                    failed_attempts=sum(i.numFailedTasks for i in infos),
                    records=int(self.written.value),
                    elapsed_s=time.monotonic() - self._started,
                )
            )
        except Exception as e:  # progress is a courtesy: never fail the export for it
            log.debug("progress report failed: %r", e)


def _out_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("slot", pa.int32()),
            ("attempt", pa.int32()),
            ("records", pa.int64()),
            ("bytes", pa.int64()),
            ("counts", pa.string()),
            ("committable", pa.string()),
        ]
    )


def _encode_column(col: Any) -> list[bytes | None]:
    """A string or binary column as Python bytes (None for null); strings are UTF-8 already.

    Casting string to binary only relabels the buffers, so no per-row ``str.encode()``."""
    import pyarrow as pa

    if pa.types.is_string(col.type):
        col = col.cast(pa.binary())
    elif pa.types.is_large_string(col.type):
        col = col.cast(pa.large_binary())
    return col.to_pylist()  # type: ignore[no-any-return]


def _byte_count(*cols: Any) -> int:
    """Bytes of keys plus values (nulls count 0), computed by Arrow instead of per record."""
    import pyarrow.compute as pc

    return sum(int(pc.sum(pc.binary_length(c)).as_py() or 0) for c in cols if c is not None)


def _headers_column(col: Any) -> list[list[tuple[str, bytes | None]] | None]:
    """Each row's headers as (key, value bytes) pairs; None for a null or empty list."""
    import pyarrow.compute as pc

    flat = col.flatten()  # the header structs of all rows, this slice only
    names = pc.struct_field(flat, "key").to_pylist()
    values = _encode_column(pc.struct_field(flat, "value"))
    out: list[list[tuple[str, bytes | None]] | None] = []
    start = 0
    for n in pc.list_value_length(col).fill_null(0).to_pylist():
        out.append(list(zip(names[start : start + n], values[start : start + n], strict=True)) if n else None)
        start += n
    return out


WRITERS = ("auto", "native", "python")
_told: set[str] = set()


def validate_writer(writer: str) -> str:
    """``writer`` when it names a path of ``WRITERS``; else a ValueError naming the choices."""
    if writer not in WRITERS:
        raise ValueError(f"writer={writer!r}: choose one of {list(WRITERS)}")
    return writer


def choose_writer(settings: ExportSettings, columns: list[str]) -> tuple[bool, str]:
    """(use the native path?, why), for a frame with these columns; raises when ``writer="native"``
    cannot be honoured."""
    if validate_writer(settings.writer) == "python":
        return False, "writer='python'"
    from airflow_provider_kafka2pc.txn import native

    why_not = (
        "the frame has a headers column, which rd_kafka_produce_batch cannot carry"
        if "headers" in columns
        else native.unavailable_reason() or native.unsupported_setting(settings.producer_config)
    )
    if why_not is None:
        return True, "Arrow batches into librdkafka's batch API (confluent-kafka's librdkafka through ctypes)"
    if settings.writer == "native":
        raise native.NativeUnsupportedError(f"writer='native' cannot be used: {why_not}")
    return False, f"the Python loop, because {why_not}"


def _tell_once(native_path: bool, why: str) -> None:
    """One INFO line per process for each choice made, the first time it is made."""
    if why not in _told:
        _told.add(why)
        log.info("kafka2pc writer: %s: %s", "native" if native_path else "python", why)


def _open_writer(settings: ExportSettings, slot: int, native_path: bool = False) -> DeliveryWriter:
    from airflow_provider_kafka2pc.txn.writer import DeliveryWriter, TransactionalWriter

    if native_path:
        from airflow_provider_kafka2pc.txn.native import NativeDeliveryWriter, NativeTransactionalWriter

        DeliveryWriter, TransactionalWriter = NativeDeliveryWriter, NativeTransactionalWriter  # type: ignore[misc]
    if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        return TransactionalWriter(
            settings.producer_config,
            settings.transactional_id(slot),
            settings.transaction_timeout_ms,
            id_prefix=settings.transactional_id_prefix,
        ).open()
    extra = (
        {"enable.idempotence": True, "acks": "all"}
        if settings.delivery_guarantee is DeliveryGuarantee.AT_LEAST_ONCE
        else {"enable.idempotence": False, "acks": 1}
    )
    return DeliveryWriter({**settings.producer_config, **extra}, f"partition {slot}").open()


def _write_batch_native(writer: Any, batch: Any, default_topic: str | None, slot: int) -> None:
    """One Arrow batch into librdkafka's batch API: per topic (a topic column is grouped, order
    within each topic kept), explicit partitions per record, no headers (``choose_writer``)."""
    import pyarrow.compute as pc

    names = batch.schema.names

    def column(name: str) -> Any:
        return batch.column(names.index(name)) if name in names else None

    if "topic" not in names:
        if default_topic is None:
            raise Kafka2PCError(f"partition {slot} has no topic column and there is no default topic")
        values, keys = column("value"), column("key")
        writer.produce_arrow(default_topic, values, keys, column("partition"), _byte_count(values, keys))
        return
    topics = column("topic")
    unset = pc.fill_null(pc.equal(topics, ""), True)  # as the Python loop: null or "" is the default topic
    if default_topic is not None:
        topics = pc.if_else(unset, default_topic, topics)
    elif pc.any(unset).as_py():
        row = pc.index(unset, True).as_py()
        raise Kafka2PCError(f"row {row} of partition {slot} has no topic and there is no default topic")
    for topic in pc.unique(topics).to_pylist():
        part = batch.filter(pc.equal(topics, topic))
        values = part.column(names.index("value"))
        keys = part.column(names.index("key")) if "key" in names else None
        partitions = part.column(names.index("partition")) if "partition" in names else None
        writer.produce_arrow(topic, values, keys, partitions, _byte_count(values, keys))


def _write_batch(writer: DeliveryWriter, batch: Any, default_topic: str | None, slot: int) -> None:
    """One Arrow batch through the writer: a tight loop when every record goes to the default
    topic through librdkafka's partitioner without headers (Spark's usual key/value frame), the
    general loop when there is a topic, partition or headers column."""
    import pyarrow.compute as pc

    n = batch.num_rows
    names = batch.schema.names
    value_col = batch.column(names.index("value"))
    key_col = batch.column(names.index("key")) if "key" in names else None
    values = _encode_column(value_col)
    keys = _encode_column(key_col) if key_col is not None else None
    nbytes = _byte_count(value_col, key_col)
    if not {"topic", "partition", "headers"} & set(names):
        if default_topic is None:
            raise Kafka2PCError(f"partition {slot} has no topic column and there is no default topic")
        writer.produce_batch(default_topic, values, keys, nbytes)
        return
    topics: list[Any] = (
        [t or default_topic for t in batch.column(names.index("topic")).to_pylist()]
        if "topic" in names
        else [default_topic] * n
    )
    if None in topics:
        raise Kafka2PCError(f"row {topics.index(None)} of partition {slot} has no topic and there is no default topic")
    # -1 (null or negative, as before) lets librdkafka's partitioner choose.
    partitions = (
        pc.max_element_wise(batch.column(names.index("partition")), -1).to_pylist()
        if "partition" in names
        else [-1] * n
    )
    headers = _headers_column(batch.column(names.index("headers"))) if "headers" in names else [None] * n
    writer.produce_rows(topics, values, keys if keys is not None else [None] * n, partitions, headers, nbytes)


def write_partition(settings: ExportSettings, slot: int, attempt: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one Spark task; also callable without Spark (tests, other engines)."""
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.writer import TransactionalWriter

    writer: DeliveryWriter | None = None
    write = _write_batch
    fail_after = (
        settings.fail_first_attempt[1]
        if settings.fail_first_attempt and settings.fail_first_attempt[0] == slot and attempt == 0
        else None
    )
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if writer is None:
            native_path, why = choose_writer(settings, batch.schema.names)
            _tell_once(native_path, why)
            write = _write_batch_native if native_path else _write_batch
            writer = _open_writer(settings, slot, native_path)
        if fail_after is not None and writer.records + batch.num_rows >= fail_after:
            write(writer, batch.slice(0, fail_after - writer.records), settings.topic, slot)
            writer.flush_and_verify()  # the records reach the broker inside the open transaction
            raise RuntimeError(f"injected failure in partition {slot}, attempt {attempt}")
        try:
            write(writer, batch, settings.topic, slot)
        except BaseException:
            writer.abandon()  # a failed write can never be prepared: its transaction ends now
            raise
    if writer is None:
        return
    committable_json: str | None = None
    if isinstance(writer, TransactionalWriter):
        c = writer.prepare()
        committable_json = c.to_json() if c is not None else None
    else:
        writer.finish()
    row = {
        "slot": slot,
        "attempt": attempt,
        "records": writer.records,
        "bytes": writer.bytes,
        "counts": json.dumps(writer.counts_by_topic),
        "committable": committable_json,
    }
    yield pa.RecordBatch.from_pylist([row], schema=_out_arrow_schema())


ARROW_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
# Spark skips its per-row size check of an Arrow batch for exactly this byte bound (Int.MaxValue).
ARROW_BYTES_UNCHECKED = 2**31 - 1


def arrow_batch_bounds(spark: Any) -> str:
    """How Spark bounds the Arrow batches it hands the writers, said in the task log: Spark checks
    the byte bound after every row, ~40 % of its JVM's CPU in that hop (docs/design.md), and the
    user guide says when to turn the check off. Read only, never changed here: without the byte
    bound, large records make batches of hundreds of MB, or fail Arrow's 2 GiB buffer limit."""
    try:
        records = int(spark.conf.get(ARROW_MAX_RECORDS_PER_BATCH))
        size = str(spark.conf.get(ARROW_MAX_BYTES_PER_BATCH))
    except Exception as e:  # a courtesy: never fail the export for it
        return f"unknown ({e!r})"
    count = f"{records} records" if records > 0 else "no record bound"
    if size.rstrip("b") == str(ARROW_BYTES_UNCHECKED):
        return f"{count}, bytes unchecked ({ARROW_MAX_BYTES_PER_BATCH}={size})"
    return (
        f"{count} or {size}, the bytes checked after every row (for records of a few KB, "
        f"{ARROW_MAX_BYTES_PER_BATCH}={ARROW_BYTES_UNCHECKED} skips the check: see the user guide)"
    )


def check_session(spark: Any) -> None:
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise SpeculationError(
            "spark.speculation=true: a speculative task attempt would re-initialise a transactional id "
            "and fence the attempt that already finished; run the export in a session with speculation off"
        )


def export_dataframe(
    df: Any,
    settings: ExportSettings,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 5.0,
    window: WindowSettings | None = None,
    abort_opened: Callable[[], bool] | None = None,
) -> ExportResult:
    """Run the prepare job; returns committables (EXACTLY_ONCE) and the summary.

    EXACTLY_ONCE keeps computation out of the transaction window (DESIGN §3b): the frame is
    materialized first (``window.materialize``), the budget checked before any transaction opens
    (``WindowRefusedError``), and a write job that runs past it is stopped. When the write job
    fails or is stopped, ``abort_opened`` is called (once its tasks have ended) to abort what they
    opened at once, and answers whether nothing is left open; then the error is raised
    (``WindowExceededError`` for an overrun).

    ``on_progress`` is called every ``progress_interval_s`` while the job runs and once when it
    has succeeded (classic Spark sessions; Spark Connect reports nothing)."""
    from airflow_provider_kafka2pc.spark.staging import StagedFrame
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    started = time.monotonic()
    window = window or WindowSettings()
    naming.validate_prefix(settings.transactional_id_prefix)
    validate_schema(df.schema, settings.topic)
    check_session(df.sparkSession)
    # Said once in the task's log; each executor decides again for itself (and falls back, with a
    # line in its own log, when its Python lacks what the driver's has).
    native_path, why = choose_writer(settings, list(df.schema.names))
    log.info("kafka2pc writer: %s: %s", "native" if native_path else "python", why)
    transactional = settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
    if transactional and settings.transaction_timeout_ms is None:
        from airflow_provider_kafka2pc.txn.writer import broker_max_transaction_timeout_ms

        configured = settings.producer_config.get("transaction.timeout.ms")
        # Read the broker's cap once on the driver instead of once per task, and only when the user
        # set no timeout: reading it needs the Cluster DescribeConfigs ACL (docs/acls.md).
        timeout_ms = int(configured) if configured else broker_max_transaction_timeout_ms(settings.producer_config)
        settings = replace(settings, transaction_timeout_ms=timeout_ms)
    stored, budget = _prepare_window(df, settings, window) if transactional else (None, None)
    staged_dir, staged_bytes = None, 0
    if isinstance(stored, StagedFrame):
        df, staged_dir, staged_bytes = stored.write_frame(df.sparkSession), stored.directory, stored.disk_bytes
    elif stored is not None:
        df = stored.df
    try:
        rows, write_s, write_started_ms = _write(
            df, settings, budget, on_progress, progress_interval_s, abort_opened, staged_dir
        )
    finally:
        if stored is not None:
            stored.release()
    result = _collect(rows, settings, time.monotonic() - started)
    result = replace(
        result,
        budget=budget,
        materialize_s=stored.seconds if stored else 0.0,
        write_s=write_s,
        staged_bytes=staged_bytes,
    )
    if stored is not None:
        from airflow_provider_kafka2pc.spark.window import task_slots
        from airflow_provider_kafka2pc.txn.window import WriteRate

        parallel = min(task_slots(df.sparkSession), result.partitions)
        shown = WriteRate.shown(
            result.records, result.bytes, write_s, result.partitions, parallel, "shown by an earlier write"
        )
        result = replace(result, write_rate=shown)
    if budget is not None:
        _check_window_left(result, budget, abort_opened, write_started_ms)
    return result


def _prepare_window(df: Any, settings: ExportSettings, window: WindowSettings) -> tuple[Any, WindowBudget]:
    """Materialize (unless turned off) and check the budget, all before any transaction opens."""
    from airflow_provider_kafka2pc.spark.window import task_slots
    from airflow_provider_kafka2pc.txn.window import NOT_MATERIALIZED, WindowBudget, WriteEstimate, commit_headroom_ms

    assert settings.transaction_timeout_ms is not None
    stored, estimate, unknown = None, None, NOT_MATERIALIZED
    if window.materialize:
        stored = _compute_first(df, window)
        if stored.sizes is not None:
            busy = [s for s in stored.sizes if s.records > 0]
            log.info(
                "kafka2pc materialized the frame in %.1f s, before any transaction opened (%s): %d records, "
                "%d bytes, %d non-empty partition(s)",
                stored.seconds,
                stored.where,
                sum(s.records for s in busy),
                sum(s.bytes for s in busy),
                len(busy),
            )
        rate = window.rate()
        if rate is not None and stored.sizes is not None:
            estimate = WriteEstimate.of(stored.sizes, task_slots(df.sparkSession), rate)
        else:
            unknown = "no write rate stated, and none shown by an earlier run of this exporter"
    else:
        log.warning(
            "kafka2pc materialize=False: the source is computed inside the transaction window, by the write job"
        )
    if stored is None:
        transactions = _partition_count(df)
    elif stored.sizes is None:
        transactions = stored.partitions
    else:
        transactions = sum(1 for s in stored.sizes if s.records > 0)
    budget = WindowBudget(
        settings.transaction_timeout_ms,
        commit_headroom_ms(settings.transaction_timeout_ms, transactions, override_ms=window.commit_headroom_ms),
        window.handover_ms,
        estimate,
        unknown,
    )
    log.info("kafka2pc window budget: %s", budget.describe())
    if not budget.fits:
        if stored is not None:
            stored.release()
        raise budget.refusal()
    return stored, budget


def _compute_first(df: Any, window: WindowSettings) -> Any:
    """The source computed before any transaction opens: staged in Arrow files where the cluster
    allows it (one pass), else stored with a checkpoint; the task log says which, and why."""
    from airflow_provider_kafka2pc.spark.cache_manager import stored_already
    from airflow_provider_kafka2pc.spark.staging import machine_id, stage, staging_unavailable
    from airflow_provider_kafka2pc.spark.window import Materialized, materialize, partition_sizes

    if window.store == "auto" and (already := stored_already(df)) is not None:
        # Writing it computes nothing: no copy. Its size is counted only when a rate can budget it.
        started = time.monotonic()
        sizes = partition_sizes(df) if window.rate() is not None else None
        log.info(
            "kafka2pc writes %s as it is stored (%d partition(s)): nothing is computed in the window",
            already.how,
            already.partitions,
        )
        return Materialized(df, sizes, time.monotonic() - started, f"{already.how}, stored already", already.partitions)
    why_not = staging_unavailable(df.sparkSession, window.store, window.checkpoint_dir)
    if why_not is None:
        staged = stage(df)
        if staged.machines <= {machine_id()}:
            return staged
        staged.release()  # this host's files; another host's stay in its temporary directory
        why_not = f"staging tasks ran on {len(staged.machines)} machine(s), not only the driver's"
    if window.store == "arrow":
        raise Kafka2PCError(f"store='arrow' cannot be used: {why_not}; use store='auto' or 'checkpoint'")
    log.info("kafka2pc stores the frame with a checkpoint instead of staging Arrow files: %s", why_not)
    return materialize(df, window)


def _partition_count(df: Any) -> int:
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:  # Spark Connect has no RDDs; the headroom then counts one EndTxn wave
        return 1


def _write(
    df: Any,
    settings: ExportSettings,
    budget: WindowBudget | None,
    on_progress: Callable[[Progress], None] | None,
    progress_interval_s: float,
    abort_opened: Callable[[], bool] | None,
    staged_dir: str | None = None,
) -> tuple[list[Any], float, int]:
    """The write job, watched against the budget; on failure what it opened is aborted at once.
    With ``staged_dir``, task ``p`` writes the Arrow file staged for partition ``p`` instead of its
    input rows. Returns its rows, its duration and its start (wall-clock ms on the driver)."""
    from airflow_provider_kafka2pc.spark.window import ExecutorLostError, WriteWatch, is_executor_lost
    from airflow_provider_kafka2pc.txn.window import WindowExceededError

    payload = settings.to_json()
    reporter = _ProgressReporter(df.sparkSession, on_progress, progress_interval_s) if on_progress else None
    written = reporter.written if reporter is not None else None

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        if staged_dir is not None:
            from airflow_provider_kafka2pc.spark.staging import staged_batches

            for _ in batches:  # the write frame's one placeholder row
                pass
            batches = staged_batches(staged_dir, ctx.partitionId())
        for out in write_partition(ExportSettings.from_json(payload), ctx.partitionId(), ctx.attemptNumber(), batches):
            if written is not None:
                written.add(sum(out.column("records").to_pylist()))
            yield out

    from pyspark.sql.pandas.types import from_arrow_schema

    log.info("kafka2pc Arrow batches to the writers: %s", arrow_batch_bounds(df.sparkSession))
    watch = WriteWatch(df.sparkSession, budget.write_ms) if budget is not None else None
    started, started_ms = time.monotonic(), int(time.time() * 1000)
    try:
        with reporter or contextlib.nullcontext(), watch or contextlib.nullcontext():
            if watch is not None:
                log.info("kafka2pc write phase started: transactions open from %s", _iso(watch.started_ms))
            rows = df.mapInArrow(run, from_arrow_schema(_out_arrow_schema())).collect()
    except Exception as e:
        if watch is None:
            raise
        seconds = time.monotonic() - started
        ended = watch.wait_tasks_ended()
        aborted = _abort_now(abort_opened, ended)
        assert budget is not None
        if watch.overran:
            raise WindowExceededError(
                f"the write phase ran past its budget: {budget.write_ms} ms of transaction.timeout.ms="
                f"{budget.timeout_ms} (commit headroom {budget.headroom_ms} ms, hand-over {budget.handover_ms} ms). "
                f"The job was stopped after {seconds:.1f} s and {aborted}: nothing of the run is visible. "
                + _overrun_fix(budget)
            ) from e
        if is_executor_lost(e):
            raise ExecutorLostError(
                f"an executor holding materialized partitions was lost during the write ({seconds:.1f} s in); "
                f"the write job failed and {aborted}: nothing of the run is visible. Clear the DAG run to export "
                "it again; to survive a lost executor without recomputing, give the export a reliable "
                "checkpoint_dir (HDFS, S3, a shared disk)."
            ) from e
        raise
    return rows, time.monotonic() - started, started_ms


def _overrun_fix(budget: WindowBudget) -> str:
    from airflow_provider_kafka2pc.txn.window import NOT_MATERIALIZED

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


def _check_window_left(
    result: ExportResult, budget: WindowBudget, abort_opened: Callable[[], bool] | None, write_started_ms: int
) -> None:
    """A prepare never ends green holding transactions the commit can no longer commit in time.
    The window is counted from the write job's start on the driver's clock, or from the first
    record if an executor's clock says earlier."""
    from airflow_provider_kafka2pc.txn.window import WindowExceededError

    if not result.committables:
        return
    first = min(write_started_ms, result.first_write_ms or write_started_ms)
    now = int(time.time() * 1000)
    left = first + budget.timeout_ms - now
    log.info(
        "kafka2pc prepared %d transaction(s): the first opened %s; they must be committed by %s (%d ms from now, "
        "the commit keeps %d ms of headroom)",
        len(result.committables),
        _iso(first),
        _iso(first + budget.timeout_ms),
        left,
        budget.headroom_ms,
    )
    if left >= budget.headroom_ms + budget.handover_ms:
        return
    aborted = _abort_now(abort_opened, True)
    raise WindowExceededError(
        f"the write phase ended {_before_or_after(left)} the broker's deadline of its first transaction, with less "
        f"than the commit's headroom ({budget.headroom_ms} ms) and the hand-over ({budget.handover_ms} ms) left: the "
        "commit could not end in time. "
        f"It prepared {len(result.committables)} transaction(s) with {result.records} records, and "
        f"{aborted}: nothing of the run is visible. " + _overrun_fix(budget)
    )


def _before_or_after(left_ms: int) -> str:
    return f"{left_ms} ms before" if left_ms >= 0 else f"{-left_ms} ms after"


def _abort_now(abort_opened: Callable[[], bool] | None, tasks_ended: bool) -> str:
    """Abort what the write job opened, now; says truthfully what became of it."""
    if abort_opened is None:
        return "the abort task aborts every transaction it opened"
    if abort_opened() and tasks_ended:
        return "every transaction it opened was aborted at once"
    return (
        "what it opened could not all be aborted at once (see the log above): the abort task aborts the rest, "
        "and until then read_committed readers of its partitions wait"
    )


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _collect(rows: list[Any], settings: ExportSettings, duration_s: float) -> ExportResult:
    slots = [r["slot"] for r in rows]
    if len(set(slots)) != len(slots):
        raise CollectError(f"more than one result for a partition: {sorted(slots)}")
    committables: list[Committable] = []
    counts: dict[str, int] = {}
    for r in rows:
        for topic, n in json.loads(r["counts"]).items():
            counts[topic] = counts.get(topic, 0) + n
        if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            if r["committable"] is None or r["records"] <= 0:
                raise CollectError(f"partition {r['slot']} reported no committable for {r['records']} records")
            c = Committable.from_json(r["committable"])
            if c.transactional_id != settings.transactional_id(r["slot"]) or c.records != r["records"]:
                raise CollectError(f"partition {r['slot']} reported a committable that is not its own: {c}")
            committables.append(c)
    return ExportResult(
        committables=tuple(sorted(committables, key=lambda c: c.transactional_id)),
        records=sum(r["records"] for r in rows),
        bytes=sum(r["bytes"] for r in rows),
        partitions=len(rows),
        counts_by_topic=counts,
        duration_s=duration_s,
        retried=tuple(sorted(r["slot"] for r in rows if r["attempt"] > 0)),
    )
