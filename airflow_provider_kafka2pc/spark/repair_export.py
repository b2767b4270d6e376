"""The re-export of a repair, driver glue: only the lost Spark partitions, into the repair's ids.

``repair_exporter`` builds the ``export_again`` step of ``txn/two_phase/repair.py`` for the export
operator and for ``kafka2pc repair``: the frame is built again (a Kafka source reads the run's stored
range), refused up front when it cannot be expected to give the same records
(``spark/repeatable_source.py``), then written as any EXACTLY_ONCE export is (computed first, the
budget and deadline watched, a digest per transaction), but only in the lost partitions and under
the repair attempt's transactional ids. The repair compares the digests before anything is visible.

A run whose frame the barrier stage dealt round-robin over N task slots (``plan.dealt``) is dealt
again over N (``export_dataframe``'s ``dealt``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import RepairRefusedError
from airflow_provider_kafka2pc.txn.protocol.record_digest import SPARK_SCHEMES, scheme_of
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.progress import Progress
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.protocol.source_files import Splits
    from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan

log = logging.getLogger(__name__)

FrameOfPlan = Callable[["RepairPlan"], Any]  # the run's frame again (a Kafka source: the plan's stored range)


@dataclass(frozen=True)
class ReExport:
    """A repair's ``export_again``, and the file splits its frame reads (``spark/file_scan.py``;
    None before it ran or for a frame that is not a plain scan), which a refusal compares with the
    run's (``txn.protocol.source_files``): listed only then, while the repair's Spark session lives."""

    export_again: Callable[[RepairPlan], Sequence[Committable]]
    files_now: Callable[[], Splits | None]

    def __call__(self, plan: RepairPlan) -> Sequence[Committable]:
        return self.export_again(plan)


def repair_exporter(
    frame: FrameOfPlan,
    settings: ExportSettings,
    window: WindowSettings | None = None,
    formats: RecordFormats | None = None,
    abort_opened: Callable[[], bool] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> ReExport:
    """The ``export_again`` of a repair: ``settings`` as the run's export had them (prefix, producer
    config, topic, writer, timeout); the ids and the delivery guarantee are the repair's."""
    from airflow_provider_kafka2pc.spark.file_scan import file_splits
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.repeatable_source import why_not_repeatable

    frames: list[Any] = []  # the frame of the last call: its splits are listed only for a refusal

    def export_again(plan: RepairPlan) -> Sequence[Committable]:
        scheme = _recorded_scheme(plan)
        df = frame(plan)
        frames[:] = [df]
        why = why_not_repeatable(df)
        if why is not None:
            raise RepairRefusedError(
                f"run {plan.run} of exporter {plan.prefix} cannot be repaired from this source: {why}. Nothing was "
                f"written, and the run stays LOST. Export the missing part in a run of its own and acknowledge the "
                f"loss (`kafka2pc acknowledge --prefix {plan.prefix} --run {plan.run}`), or make the source "
                "repeatable and repair again"
            )
        if plan.dealt is not None and plan.dealt.inputs is not None:
            _same_inputs(plan, df)
        attempt = dataclasses.replace(
            settings,
            naming_strategy=naming.NamingStrategy.INCREMENTING,
            run_key=plan.attempt_key,
            delivery_guarantee=DeliveryGuarantee.EXACTLY_ONCE,
            repairable=True,  # the digests are what the repair compares
            digest_scheme=scheme,  # as the run recorded them
        )
        result = export_dataframe(
            df, attempt, on_progress=on_progress, window=window, abort_opened=abort_opened, formats=formats,
            only_slots=plan.slots, dealt=plan.dealt,
        )  # fmt: skip
        log.info(
            "kafka2pc repair of run %s: exported %d record(s) again in %d transaction(s) (Spark partitions %s)",
            plan.run,
            result.records,
            len(result.committables),
            ", ".join(map(str, plan.slots)),
        )
        return result.committables

    return ReExport(export_again, lambda: file_splits(frames[0]) if frames else None)


def _same_inputs(plan: RepairPlan, df: Any) -> None:
    """A dealt run's frame must come in as many Spark partitions as the run's did, or the deal puts
    other rows in each slot: refused before anything is written."""
    from airflow_provider_kafka2pc.spark.window import partition_count

    assert plan.dealt is not None
    now = partition_count(df)
    if now != plan.dealt.inputs:
        raise RepairRefusedError(
            f"run {plan.run} of exporter {plan.prefix} cannot be repaired from this frame: the barrier stage dealt "
            f"the run's {plan.dealt.inputs} Spark partition(s) over {plan.dealt.slots} task slot(s), and this frame "
            f"has {now} (another parallelism, cluster size or spark.sql.files.* setting), so the same rows would "
            "not land in the same slots. Nothing was written, and the run stays LOST. Repair with the run's Spark "
            "settings"
        )


def _recorded_scheme(plan: RepairPlan) -> str:
    """The scheme of the run's recorded digests, which the re-export computes again: an export before
    ``xxh64t`` recorded ``xxh64``. Refused before anything is read when Spark cannot compute it."""
    schemes = sorted({scheme_of(t.covered.digest or "") or "none" for t in plan.lost})
    if len(schemes) == 1 and schemes[0] in SPARK_SCHEMES:
        return schemes[0]
    raise RepairRefusedError(
        f"run {plan.run} of exporter {plan.prefix} cannot be repaired by Spark: its lost transactions recorded "
        f"digests of scheme {', '.join(schemes)}, and Spark computes {' or '.join(SPARK_SCHEMES)}. Nothing was "
        "written, and the run stays LOST. Repair it with the writer that exported it, or export the missing part "
        f"in a run of its own and acknowledge the loss (`kafka2pc acknowledge --prefix {plan.prefix} --run {plan.run}`)"
    )


__all__ = ["FrameOfPlan", "ReExport", "repair_exporter"]
