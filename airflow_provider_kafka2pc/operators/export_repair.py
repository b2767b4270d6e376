"""The export task repairing its run: a clear of a run LOST after its COMMIT (DESIGN §6).

Spark exports the lost partitions again (``spark/repair_export.py``) with the export's own frame,
formats and Spark settings; the transaction core compares them with what the run lost and commits
them (``txn/two_phase/repair.py``). The task pushes no committables: the commit answers from the
run's record, and emits the "repaired" asset events when this try repaired it (``SKIPPED_KEY``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

# (the run's stored Kafka source range or None) -> (a SparkSession the caller stops, the run's frame)
FrameOf = Callable[["SourceRange | None"], "tuple[Any, Any]"]


def repair_in_task(
    session: PrepareSession,
    settings: ExportSettings,
    window: WindowSettings,
    formats: RecordFormats | None,
    frame_of: FrameOf,
    reads_kafka: bool,
    actor: str,
    ti: Any,
    log: logging.Logger | Any,
    seen: dict[str, Any],
) -> None:
    """Repair ``session``'s run; ``seen`` learns how far it got (the failure line reads it)."""
    from airflow_provider_kafka2pc.spark.repair_export import repair_exporter
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus

    sessions: list[Any] = []

    def frame(plan: Any) -> Any:
        read = plan.record.source
        if reads_kafka and read is None:
            raise Kafka2PCError(
                f"run {session.run} of exporter {session.prefix} has no stored Kafka source range to read again"
            )
        spark, df = frame_of(read)
        sessions.append(spark)
        seen["writing"] = True
        return df

    def abort_now() -> bool:
        seen["aborted"] = session.abort_repair_attempts(actor)
        return bool(seen["aborted"])

    log.warning("kafka2pc: run %s of %s is LOST: repairing it (repair_lost=True)", session.run, session.prefix)
    seen["repairing"] = True
    export_again = repair_exporter(frame, settings, window, formats, abort_now)
    try:
        report = session.repair(export_again, actor, export_again.files_now)
    finally:
        for spark in sessions:
            spark.stop()
    log.info("kafka2pc: %s", report.note)
    if report.record.status is not RunStatus.REPAIRED:  # decided, not all ended: not green yet
        raise Kafka2PCError(report.note)
    repaired = {"status": report.record.status.value, "prefix": session.prefix, "repaired_now": report.repaired_now}
    ti.xcom_push(key=SKIPPED_KEY, value=repaired)


__all__ = ["repair_in_task"]
