"""The exporters page marks an undecided transaction whose DAG run is still live (it runs inside
Airflow and asks the scheduler's database) instead of showing what a prefix-wide resolve would do."""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.plugins.live_runs import LIVE_ACTION, mark_live
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.records import Lease


def row(tid: str, decided: bool = False, started_ms: int | None = 10_000) -> dict[str, Any]:
    return {
        "transactional_id": tid,
        "decision": {"kind": "COMMIT"} if decided else None,
        "action": "abort",
        "start_time_ms": started_ms,
    }


def test_pooling_ids_belong_to_the_live_run_holding_the_exporter() -> None:
    queue = [Lease("orders", "dag", "old_run"), Lease("orders", "dag", "run_2", 9_000), Lease("orders", "dag", "run_3")]
    rows = [row("orders-0"), row("orders-1"), row("orders-2", decided=True), row("other-0")]
    mark_live("orders", rows, queue, {("dag", "run_2"), ("dag", "run_3"), ("dag2", "x")})
    assert [r.get("live_run") for r in rows] == ["dag/run_2", "dag/run_2", None, None]
    assert [r["action"] for r in rows] == [LIVE_ACTION, LIVE_ACTION, "abort", "abort"]


def test_no_live_holder_leaves_what_a_resolve_would_do() -> None:
    rows = [row("orders-0")]
    mark_live("orders", rows, [Lease("orders", "dag", "died")], {("dag", "other")})
    assert rows[0]["action"] == "abort" and "live_run" not in rows[0]


def test_incrementing_ids_belong_to_the_run_their_key_names() -> None:
    live_id = "scheduled__2026-11-26T00:00:00+00:00"
    mine = naming.transactional_id("orders", 0, naming.NamingStrategy.INCREMENTING, live_id)
    dead = naming.transactional_id("orders", 1, naming.NamingStrategy.INCREMENTING, "manual__died")
    rows = [row(mine), row(dead)]
    mark_live("orders", rows, [], {("dag", live_id)})
    assert rows[0]["live_run"] == f"dag/{live_id}" and rows[0]["action"] == LIVE_ACTION
    assert "live_run" not in rows[1] and rows[1]["action"] == "abort"


def test_a_leftover_opened_before_the_holder_queued_is_not_its_run() -> None:
    """A dead run's POOLING leftover, opened before the live holder queued, stays what a resolve
    would do (the holder's own recovery ends it)."""
    rows = [row("orders-0", started_ms=1_000), row("orders-1", started_ms=60_000)]
    mark_live("orders", rows, [Lease("orders", "dag", "run_2", 50_000)], {("dag", "run_2")})
    assert "live_run" not in rows[0] and rows[1]["live_run"] == "dag/run_2"


def test_only_runs_of_the_dag_that_claimed_the_prefix_count() -> None:
    """Scheduled run ids repeat across DAGs: another DAG's live run is not this exporter's."""
    same_id = "scheduled__2026-11-26T00:00:00+00:00"
    tid = naming.transactional_id("orders", 0, naming.NamingStrategy.INCREMENTING, same_id)
    rows = [row(tid)]
    mark_live("orders", rows, [], {("other_dag", same_id)}, owner="orders_dag.orders.prepare")
    assert "live_run" not in rows[0]
    mark_live("orders", rows, [], {("other_dag", same_id), ("orders_dag", same_id)}, owner="orders_dag.orders.prepare")
    assert rows[0]["live_run"] == f"orders_dag/{same_id}"
