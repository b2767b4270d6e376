"""Driver glue: record what each Spark partition of a run reads, before its window opens.

A repair whose re-computation differs names the changed, added or removed file, or a different
packing of the same files (``txn/protocol/source_files.py``). That needs what the run read: the
export of a plain scan of columnar files (``spark/file_scan.py``) lists its planned splits on the
driver (nothing is read from the files) and appends them to the decision topic's history
partition before any transaction opens. Anything else records nothing, and a failure to record
only costs the explanation: the export goes on.

A frame the barrier stage deals round-robin over the task slots records how (its slots and its own
partitions before the deal; ``dealing_recorder``), which a repair needs to deal it again: a failure
to record leaves the run unrepairable (its repair is refused), so it is logged as a warning, and
the export goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.file_scan import file_splits
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing

log = logging.getLogger(__name__)


def record_source_files(
    df: Any, settings: ExportSettings, decision_log: Callable[[], DecisionLog], prefix: str, run: str
) -> None:
    """List the splits each Spark partition of ``df`` reads and record them for ``run``, when the
    export records a digest (a repair can follow) and ``df`` is a plain scan of files; the decision
    log (``decision_log()``, the caller's to close) is used only then."""
    if not _repairable(settings):
        return
    splits = file_splits(df)
    if splits is None:
        return
    files = len({f.path for s in splits.values() for f in s})
    try:
        recorded = decision_log().record_source_files(prefix, run, splits)
    except Kafka2PCError as e:  # only an explanation is lost; the window has not opened
        log.warning("kafka2pc: the files run %s reads are not recorded (a repair's refusal names none): %s", run, e)
        return
    if recorded:
        log.info("kafka2pc: recorded the %d file(s) the %d Spark partition(s) of run %s read", files, len(splits), run)
    else:
        log.info(
            "kafka2pc: the files run %s reads are not recorded (%d splits: more than a record holds, or a decision "
            "topic of one partition)",
            run,
            sum(len(s) for s in splits.values()),
        )


def _repairable(settings: ExportSettings) -> bool:
    """Whether the export records digests, so that a repair can follow: only then is its input recorded."""
    return settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE and settings.repairable


def dealing_recorder(
    settings: ExportSettings,
    decision_log: Callable[[], DecisionLog],
    prefix: str,
    run: str,
    idle: Callable[[], None] = lambda: None,
) -> Callable[[Dealing], None] | None:
    """What ``export_dataframe`` reports a barrier's dealing to, when the export records a digest;
    ``idle`` is called after recording (the caller's clients sit idle through the write job)."""
    if not _repairable(settings):
        return None

    def record(dealing: Dealing) -> None:
        slots = dealing.slots
        try:
            recorded = decision_log().record_dealt(prefix, run, dealing)
        except Kafka2PCError as e:
            recorded = False
            log.warning("kafka2pc: the dealing of run %s is not recorded: %s", run, e)
        finally:
            idle()
        if recorded:
            log.info("kafka2pc: recorded that run %s deals its frame over %d task slot(s)", run, slots)
        else:
            log.warning(
                "kafka2pc: run %s deals its frame over %d task slot(s) unrecorded (a decision topic of one "
                "partition, or the error above): a repair of it will be refused",
                run,
                slots,
            )

    return record


__all__ = ["dealing_recorder", "record_source_files"]
