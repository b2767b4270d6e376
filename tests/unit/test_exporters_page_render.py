"""The exporters page's open-transactions table says whose action it shows: an undecided
transaction is most often a live run's, which a run's own sensor never aborts but a prefix-wide
``kafka2pc resolve`` would."""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.plugins.page_html import render_page
from airflow_provider_kafka2pc.txn.protocol.records import Kind
from airflow_provider_kafka2pc.txn.two_phase.survey import plan_rows
from tests.unit.fakes import MemoryDecisionLog, decision_item, now_ms, ref, txn_state


def page(*undecided: str) -> str:
    """orders-0 ruled by a COMMIT, plus ``undecided`` ids open without a decision; rows as
    ``kafka2pc list`` builds them."""
    state = MemoryDecisionLog(initial=[decision_item(Kind.COMMIT, [ref("orders-0")])]).read()
    rows, _ = plan_rows([txn_state(t) for t in ("orders-0", *undecided)], state, now_ms())
    x: dict[str, Any] = {"prefix": "orders", "transactions": rows, "losses": [], "runs": []}
    topic = {"decision_topic": "kafka2pc_decisions", "decision_topic_exists": True, "known_prefixes": {}}
    return render_page("kafka2pc_default", ["orders"], {"exporters": [x], **topic}, False)


def test_an_undecided_transaction_is_explained_as_a_live_runs_and_resolve_is_named() -> None:
    html = page("orders-1")
    assert "<th>kafka2pc resolve would</th>" in html and "recovery would" not in html
    assert "<td>abort</td>" in html and "<td>roll forward</td>" in html
    assert "A run's own recovery sensor never aborts another live run's transactions" in html


def test_decided_transactions_need_no_such_note() -> None:
    html = page()
    assert "<td>roll forward</td>" in html and "never aborts another live run" not in html
