"""The write rate an exporter showed, kept between its runs in the export task's XCom.

A prepare that wrote its frame from stored data without a retried task knows the rate this cluster
reached per task slot (``txn.protocol.window.WriteRate``); it keeps it under ``WRITE_RATE_KEY`` with
the exporter's prefix. The next run's window budget uses it when the user states no rate, so a run
that cannot finish within its transaction timeout is refused before any transaction opens. A rate
another exporter showed (the task's prefix changed, or is templated per run) is not used: the budget
says its rate came from this exporter.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.operators.payload import WRITE_RATE_KEY

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.window import WriteRate


def window_with_shown_rate(
    window: WindowSettings, ti: Any, task_id: str, prefix: str, log: logging.Logger | Any
) -> WindowSettings:
    """``window`` with the rate the exporter's last successful prepare showed, if there is one."""
    from airflow_provider_kafka2pc.txn.protocol.window import WriteRate

    try:
        kept = ti.xcom_pull(task_ids=task_id, key=WRITE_RATE_KEY, include_prior_dates=True)
    except Exception as e:  # a courtesy: without it nothing is refused up front
        log.info("kafka2pc: no earlier write rate readable (%s: %s)", type(e).__name__, e)
        kept = None
    if isinstance(kept, dict) and kept.get("exporter", prefix) != prefix:
        log.info(
            "kafka2pc: the last write rate of this task was shown by exporter %s, not %s: not used",
            kept.get("exporter"),
            prefix,
        )
        kept = None
    shown = WriteRate.from_json(kept)
    return dataclasses.replace(window, shown_rate=shown) if shown is not None else window


def keep_shown_rate(ti: Any, rate: WriteRate | None, run_id: str, prefix: str) -> None:
    """Keep the rate this run showed for the next run's budget (nothing when it showed none)."""
    if rate is not None:
        shown = dataclasses.replace(rate, source=f"shown by run {run_id}")
        ti.xcom_push(key=WRITE_RATE_KEY, value={**shown.to_json(), "exporter": prefix})


__all__ = ["keep_shown_rate", "window_with_shown_rate"]
