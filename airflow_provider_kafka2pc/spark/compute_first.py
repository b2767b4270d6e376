"""Computing the source before any transaction opens, and the budget checked then (DESIGN §3b.1-2).

``prepare_window`` takes the cheapest way the session allows (a frame stored already, staged Arrow
files, a barrier stage, a checkpoint; ``compute_first``), says which and why in the task log, and refuses up front
what cannot fit at a rate this cluster is known to reach.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.spark.digest_column import digest_of
from airflow_provider_kafka2pc.spark.staging import ON_CONNECT, OTHER_HOSTS, STAGING_UNUSABLE
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.window import WindowBudget

log = logging.getLogger(__name__)


def prepare_window(
    df: Any, settings: ExportSettings, window: WindowSettings, writers: int | None = None
) -> tuple[Any, WindowBudget]:
    """Materialize (unless turned off) and check the budget, all before any transaction opens.
    ``writers``: at most that many partitions hold rows (a repair's lost ones), for the headroom."""
    from airflow_provider_kafka2pc.spark.window import task_slots
    from airflow_provider_kafka2pc.txn.protocol.window import (
        NO_RATE,
        NOT_MATERIALIZED,
        WindowBudget,
        WriteEstimate,
        commit_headroom_ms,
    )

    assert settings.transaction_timeout_ms is not None
    stored, estimate, unknown = None, None, NOT_MATERIALIZED
    if window.materialize:
        stored = compute_first(df, window, digest_of(settings), may_deal=writers is None)
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
        elif rate is None:
            unknown = NO_RATE
        else:
            unknown = stored.unsized()
    else:
        log.warning(
            "kafka2pc materialize=False: the source is computed inside the transaction window, by the write job"
        )
    if stored is None:
        from airflow_provider_kafka2pc.spark.window import partition_count

        transactions = partition_count(df)
    elif stored.sizes is None:
        transactions = stored.partitions
    else:
        transactions = sum(1 for s in stored.sizes if s.records > 0)
    if writers is not None:
        transactions = min(transactions, writers)
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


def compute_first(
    df: Any, window: WindowSettings, hash_rows: Callable[[Any], Any] | None = None, may_deal: bool = True
) -> Any:
    """The source computed before any transaction opens: nothing to do for a frame stored already or
    a plain scan of columnar files, else staged in Arrow files where the cluster allows it (one
    pass), else computed by a barrier stage where the executors are out of the driver's sight (other
    hosts, Spark Connect; one pass and a shuffle), else stored with a checkpoint; the task log says
    which, and why. Every way records the
    digest ``hash_rows`` adds (``spark/digest_column.py``) unless it is None or the frame is stored
    already (a repair cannot read it again): a column computed with the rest, or for a plain scan a hash per
    row in the write job. ``may_deal`` False (a repair, which writes the run's own partitions) never
    deals the frame again in a barrier stage: where the executors are on other hosts or behind Spark
    Connect it is stored with a checkpoint instead."""
    from airflow_provider_kafka2pc.spark.cache_manager import stored_already

    def with_digest(frame: Any) -> Any:
        return hash_rows(frame) if hash_rows is not None else frame

    from airflow_provider_kafka2pc.spark.file_scan import plain_file_scan
    from airflow_provider_kafka2pc.spark.staging import StagedFrame, stage, staging_unavailable
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
        # No digest: a repair cannot read a cache or a checkpoint again (spark/repeatable_source.py),
        # so hashing its rows (a third of the time of writing them) would buy nothing.
        where = f"{already.how}, stored already"
        return Materialized(df, sizes, time.monotonic() - started, where, already.partitions)
    if window.store == "auto" and (scan := plain_file_scan(df)) is not None:
        # Writing it reads the files, as writing staged files would: staging would read them twice.
        # Sizing it costs a pass too, so only a rate the user states buys one (not a shown rate).
        started = time.monotonic()
        sizes = partition_sizes(df) if window.rate_stated else None
        log.info(
            "kafka2pc writes %s as they are stored (%d partition(s)): the write job reads and decodes them, "
            "nothing else is computed in the window (store='arrow' stages them first)",
            scan.how,
            scan.partitions,
        )
        where = f"{scan.how}, read by the write job"
        return Materialized(with_digest(df), sizes, time.monotonic() - started, where, scan.partitions)
    # The barrier stage deals the frame without the digest round-robin over the task slots the
    # cluster has now, then hashes each slot's rows: a repair deals them again over as many slots.
    # It is the one pass where the executors are out of the driver's sight: on other hosts, or behind
    # a Spark Connect server (whose client is not the driver at all).
    plain, df = df, with_digest(df)
    why_not = staging_unavailable(df.sparkSession, window.store, window.checkpoint_dir)
    refused: BaseException | None = None
    elsewhere = why_not is not None and why_not.startswith((OTHER_HOSTS, ON_CONNECT))
    if window.store == "barrier" or (window.store == "auto" and elsewhere):
        return _barrier_or_raise(plain, df, window, why_not or "store='barrier'", hash_rows, may_deal)
    if why_not is None:
        try:
            staged = stage(df)
        except Exception as e:
            # The executors could not use the driver's directory (another user, another /tmp, a full
            # disk): no transaction is open yet, so a checkpoint can still serve. Any other failure
            # is the source's own, and raised as it is.
            why_not, refused = _staging_directory_refused(e), e
            if why_not is None:
                raise
        else:
            if isinstance(staged, StagedFrame):
                return staged
            if window.store == "auto" and staged.startswith(OTHER_HOSTS):
                return _barrier_or_raise(plain, df, window, staged, hash_rows, may_deal)
            why_not = staged
    if window.store == "arrow":
        raise Kafka2PCError(f"store='arrow' cannot be used: {why_not}; use store='auto' or 'checkpoint'") from refused
    log.info("kafka2pc stores the frame with a checkpoint instead of staging Arrow files: %s", why_not)
    return materialize(df, window)


def _barrier_or_raise(
    plain: Any,
    df: Any,
    window: WindowSettings,
    why_not_staged: str,
    hash_rows: Callable[[Any], Any] | None,
    may_deal: bool,
) -> Any:
    """The barrier plan of ``plain`` (no digest) where staging cannot serve because the executors are
    elsewhere (DESIGN §13: never silently the slower checkpoint); else the checkpoint of ``df``, or for
    ``store='barrier'`` an error."""
    from airflow_provider_kafka2pc.spark.barrier_job import BarrierPlan, plan_barrier
    from airflow_provider_kafka2pc.spark.window import materialize

    if not may_deal:
        log.info(
            "kafka2pc stores the repair's partitions with a checkpoint (%s): a barrier would deal them anew",
            why_not_staged,
        )
        return materialize(df, window)
    plan = plan_barrier(plain, why_not_staged, hash_rows)
    if isinstance(plan, BarrierPlan):
        log.info(
            "kafka2pc computes the frame in the write job's barrier stage, before any transaction opens, on %s",
            plan.where,
        )
        return plan
    if window.store == "barrier":
        raise Kafka2PCError(f"store='barrier' cannot be used: {plan}; use store='auto' or 'checkpoint'")
    log.info("kafka2pc stores the frame with a checkpoint instead: %s", plan)
    return materialize(df, window)


def _staging_directory_refused(error: BaseException) -> str | None:
    """What the staging tasks said of the staging directory (``STAGING_UNUSABLE``), or None when the
    job failed for another reason."""
    text = str(error)
    at = text.find(STAGING_UNUSABLE)
    if at < 0:
        return None
    said = text[at:].splitlines()[0]
    return f"the staging tasks could not write it: {said}"


__all__ = ["compute_first", "prepare_window"]
