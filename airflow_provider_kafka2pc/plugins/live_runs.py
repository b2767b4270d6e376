"""Which open transactions belong to a DAG run that is still live: the page runs inside Airflow and
can ask the scheduler's database, so a run awaiting its commit is shown as live, not as something
a prefix-wide resolve would abort."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_kafka2pc.hooks.kafka2pc import LIVE_DAG_RUN_STATES
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.records import Lease

log = logging.getLogger(__name__)

LIVE_ACTION = "nothing: its DAG run is live (exporting or awaiting its commit)"
# The lease's time is the Airflow worker's clock, a transaction's start the broker's.
CLOCK_SLACK_MS = 5_000


def live_dag_runs() -> set[tuple[str, str]]:
    """(dag_id, run_id) of every queued or running DAG run, from the metadata database; empty when
    it cannot be read (the page then shows what a prefix-wide resolve would do, as before)."""
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(select(DagRun.dag_id, DagRun.run_id).where(DagRun.state.in_(LIVE_DAG_RUN_STATES)))
            return {(str(dag_id), str(run_id)) for dag_id, run_id in rows}
    except Exception as e:  # a courtesy of the page, never its failure
        log.warning("kafka2pc page: the live DAG runs are unknown (%s: %s)", type(e).__name__, e)
        return set()


def mark_live(
    prefix: str,
    rows: Sequence[dict[str, Any]],
    queue: Sequence[Lease],
    live: Iterable[tuple[str, str]],
    owner: str | None = None,
) -> None:
    """Mark each undecided transaction whose DAG run is live (``live_run``, and its action).

    Only runs of the DAG that claimed the prefix count (``owner``, "dag_id.task_id", when known):
    another DAG's run may carry the same run id. A POOLING id belongs to the run holding the
    exporter (the first live lease of its queue) only if it opened after that run queued: what an
    earlier run left behind stays what it is. An INCREMENTING id names its run's key."""
    live = {(dag_id, run_id) for dag_id, run_id in live if owner is None or owner.startswith(f"{dag_id}.")}
    holder = next((lease for lease in queue if (lease.dag_id, lease.run_id) in live), None)
    by_key = {naming.sanitize_run_key(run_id): (dag_id, run_id) for dag_id, run_id in live}
    for row in rows:
        if row.get("decision") is not None:
            continue
        parsed = naming.parse_transactional_id(str(row["transactional_id"]))
        if parsed is None or parsed.prefix != prefix:
            continue
        if parsed.run_key is not None:
            found = by_key.get(parsed.run_key)
        else:
            started = row.get("start_time_ms")
            opened_after = holder is not None and started is not None and started >= holder.at_ms - CLOCK_SLACK_MS
            found = _of(holder) if opened_after else None
        if found is not None:
            row["live_run"] = f"{found[0]}/{found[1]}"
            row["action"] = LIVE_ACTION


def _of(lease: Lease | None) -> tuple[str, str] | None:
    return (lease.dag_id, lease.run_id) if lease is not None else None


__all__ = ["LIVE_ACTION", "live_dag_runs", "mark_live"]
