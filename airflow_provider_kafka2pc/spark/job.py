"""The prepare job, driver glue: validate, compute first, write, collect (DESIGN §3.2, §3b).

``export_dataframe`` checks the frame and the session, computes the source before any transaction
opens and checks the budget (``spark/compute_first.py``), runs the write job over the partition
writer of the core (``spark/write_job.py``, ``txn/two_phase/partition_writer.py``), and collects
exactly one committable per non-empty partition.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.contract import validate_schema
from airflow_provider_kafka2pc.spark.errors import CollectError, SpeculationError
from airflow_provider_kafka2pc.spark.export_result import ExportResult
from airflow_provider_kafka2pc.spark.export_way import ExportWay, InWindow
from airflow_provider_kafka2pc.spark.progress import Progress
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.partition_writer import choose_writer

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

log = logging.getLogger(__name__)


def check_session(spark: Any) -> None:
    from airflow_provider_kafka2pc.spark.versions import check_supported

    check_supported()  # a PySpark, an install or a pyarrow outside the tested ones, refused by name
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
    formats: RecordFormats | None = None,
    only_slots: tuple[int, ...] | None = None,
    dealt: Dealing | None = None,
    record_dealing: Callable[[Dealing], None] | None = None,
) -> ExportResult:
    """Run the prepare job; returns committables (EXACTLY_ONCE) and the summary.

    EXACTLY_ONCE keeps computation out of the transaction window (DESIGN §3b): the frame is
    materialized first (``window.materialize``), the budget checked before any transaction opens
    (``WindowRefusedError``), and a write job that runs past it is stopped. When the write job
    fails or is stopped, ``abort_opened`` is called (once its tasks have ended) to abort what they
    opened at once, and answers whether nothing is left open; then the error is raised
    (``WindowExceededError`` for an overrun).

    ``on_progress`` is called every ``progress_interval_s`` while the job runs and once when it
    has succeeded (classic Spark sessions; Spark Connect reports nothing).

    ``formats`` encodes the key and/or value for a schema registry first (``spark/record_formats.py``):
    the schemas are resolved, checked and registered before anything else, and the columns become
    framed binary computed in Spark's JVM.

    EXACTLY_ONCE records a digest of each transaction's keys and values (``spark/digest_column.py``),
    what a repair proves its re-computation with; ``only_slots`` (a repair) writes only those Spark
    partitions of the frame. A frame the barrier stage deals round-robin over the task slots is
    reported to ``record_dealing`` before any transaction opens; a repair of such a run gives that
    ``dealt`` and the frame is dealt over as many slots again, then written from that
    shuffle, whose map stage computes it before any write task opens a transaction (a barrier stage
    of its own would deal it over the slots the cluster has now)."""
    from airflow_provider_kafka2pc.spark.compute_first import prepare_window
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.spark.write_job import check_window_left, run_write_job

    started = time.monotonic()
    window = window or WindowSettings()
    naming.validate_prefix(settings.transactional_id_prefix)
    if formats is not None:
        from airflow_provider_kafka2pc.spark.record_formats import apply_formats

        df, _ = apply_formats(df, formats, settings.topic)
    validate_schema(df.schema, settings.topic)
    check_session(df.sparkSession)
    # Said once in the task's log; each executor decides again for itself (and falls back, with a
    # line in its own log, when its Python lacks what the driver's has).
    native_path, why = choose_writer(settings, list(df.schema.names))
    log.info("kafka2pc writer: %s: %s", "native" if native_path else "python", why)
    transactional = settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
    if transactional and settings.transaction_timeout_ms is None:
        from airflow_provider_kafka2pc.txn.kafka.transactions import broker_max_transaction_timeout_ms

        configured = settings.producer_config.get("transaction.timeout.ms")
        # Read the broker's cap once on the driver instead of once per task, and only when the user
        # set no timeout: reading it needs the Cluster DescribeConfigs ACL (docs/acls.md).
        timeout_ms = int(configured) if configured else broker_max_transaction_timeout_ms(settings.producer_config)
        settings = replace(settings, transaction_timeout_ms=timeout_ms)
    if dealt is not None:
        df, window = df.repartition(dealt.slots), replace(window, materialize=False)
    if only_slots is not None:
        from airflow_provider_kafka2pc.spark.digest_column import only_partitions

        df = only_partitions(df, only_slots)
    writers = len(only_slots) if only_slots is not None else None
    stored, budget = prepare_window(df, settings, window, writers) if transactional else (None, None)
    # The way was chosen once, above (``spark/export_way.py``); from here every way takes the same steps.
    way: ExportWay = stored if stored is not None else InWindow(_hashed(df, settings) if transactional else df)
    if record_dealing is not None and (dealing := way.dealing()) is not None:
        record_dealing(dealing)
    spark = df.sparkSession
    try:
        staged_bytes = way.staged_bytes
        rows, write_s, write_started_ms = run_write_job(
            way, spark, settings, window, budget, on_progress, progress_interval_s, abort_opened
        )
    finally:
        way.release()
    result = _collect(rows, settings, time.monotonic() - started)
    result = replace(result, budget=budget, materialize_s=way.seconds, write_s=write_s, staged_bytes=staged_bytes)
    if way.shows_rate and not result.retried:  # a retried task's time is not the cluster's rate
        from airflow_provider_kafka2pc.spark.window import task_slots
        from airflow_provider_kafka2pc.txn.protocol.window import PartitionSize, WriteRate

        sizes = [PartitionSize(int(r["slot"]), int(r["records"]), int(r["bytes"])) for r in rows]
        slots = way.write_slots() or task_slots(spark)
        shown = WriteRate.shown(sizes, write_s, slots, "shown by an earlier write")
        result = replace(result, write_rate=shown)
    if budget is not None:
        check_window_left(result, budget, abort_opened, write_started_ms)
    return result


def export_run(
    session: PrepareSession,
    df: Any,
    settings: ExportSettings,
    *,
    window: WindowSettings | None,
    abort_opened: Callable[[], bool],
    on_progress: Callable[[Progress], None] | None = None,
    formats: RecordFormats | None = None,
    writing: Callable[[], None] = lambda: None,
) -> ExportResult:
    """The prepare job of one run, as the export task and a Spark application run it once the
    session holds the prefix: the source's files recorded with the run before its window (what a
    repair reads again), a barrier's dealing recorded as it is chosen, the session's clients idle
    (closed) through the Spark job, then ``export_dataframe`` (``writing`` is called as it begins:
    from then on transactions may be open)."""
    from airflow_provider_kafka2pc.spark.source_listing import dealing_recorder, record_source_files

    prefix, run = session.prefix, session.run
    record_source_files(df, settings, session.clients.decision_log, prefix, run)
    session.clients.close()  # idle through the write job: the steps after it connect afresh
    dealing = dealing_recorder(settings, session.clients.decision_log, prefix, run, session.clients.close)
    writing()
    return export_dataframe(
        df, settings, on_progress=on_progress, window=window, abort_opened=abort_opened, formats=formats,
        record_dealing=dealing,
    )  # fmt: skip


def _hashed(df: Any, settings: ExportSettings) -> Any:
    """``df`` with the digest column where the export records one, computed in the window
    (``materialize=False``)."""
    from airflow_provider_kafka2pc.spark.digest_column import digest_of

    hash_rows = digest_of(settings)
    return hash_rows(df) if hash_rows is not None else df


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


__all__ = [
    "CollectError",
    "ExportResult",
    "SpeculationError",
    "check_session",
    "export_dataframe",
]
