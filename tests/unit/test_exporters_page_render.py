"""The exporters page's open-transactions table says whose action it shows: an undecided
transaction is most often a live run's, which a run's own sensor never aborts but a prefix-wide
``kafka2pc resolve`` would."""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.plugins.page import render_page

COMMIT = {"kind": "COMMIT", "run": "dag/run-1", "decision_id": "d1"}


def exporter(*decisions: dict[str, Any] | None) -> dict[str, Any]:
    txns = [
        {"transactional_id": f"orders-{i}", "state": "Ongoing", "producer_id": i, "producer_epoch": 0,
         "partitions": [{"topic": "orders", "partition": 0}], "start_time_ms": 1_795_000_000_000,
         "timeout_ms": 900_000, "decision": d, "other_decision": None,
         "action": "abort" if d is None else "roll forward"}
        for i, d in enumerate(decisions)
    ]  # fmt: skip
    x = {"prefix": "orders", "transactions": txns, "losses": [], "runs": []}
    topic = {"decision_topic": "kafka2pc_decisions", "decision_topic_exists": True, "known_prefixes": {}}
    return {"exporters": [x], **topic}


def test_an_undecided_transaction_is_explained_as_a_live_runs_and_resolve_is_named() -> None:
    page = render_page("kafka2pc_default", ["orders"], exporter(None, COMMIT), False)
    assert "<th>kafka2pc resolve would</th>" in page
    assert "recovery would" not in page
    assert "A run's own recovery sensor never aborts another live run's transactions" in page


def test_decided_transactions_need_no_such_note() -> None:
    page = render_page("kafka2pc_default", ["orders"], exporter(COMMIT), False)
    assert "roll forward" in page and "never aborts another live run" not in page
