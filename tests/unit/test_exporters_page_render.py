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


def test_a_lost_run_says_how_to_repair_it_and_a_repaired_run_says_who_repaired_what() -> None:
    from airflow_provider_kafka2pc.plugins.page import run_rows
    from airflow_provider_kafka2pc.txn.protocol.records import Covered, LostTxn, Repair, RunRecord, RunStatus
    from airflow_provider_kafka2pc.txn.two_phase import survey

    gone = LostTxn(Covered("orders-1", 7, 0, 10, ("events-1",), 1_000, "xxh64:10:00"), "timeout")
    lost = RunRecord("orders", "dag/r1", RunStatus.LOST, 2, 20, 5_000, "d-1", (gone,))
    loss = {
        "run": "dag/r1", "prefix": "orders", "final": True, "visible_transactions": 1, "transactions": 2,
        "visible_records": 10, "records": 20, "lost_transactions": 1, "lost_records": 10, "pending_transactions": 0,
        "acknowledge": "kafka2pc acknowledge --prefix orders --run dag/r1",
        "repair": "kafka2pc repair --prefix orders --run dag/r1 --source MODULE:NAME",
        "lost": [{"transactional_id": "orders-1", "producer_id": 7, "producer_epoch": 0, "records": 10,
                  "partitions": ["events-1"], "reason": "timeout"}],
    }  # fmt: skip
    repaired = RunRecord("orders", "dag/r0", RunStatus.REPAIRED, 2, 20, 4_000, "d-0",
                         repair=Repair("d-9", "orders_dag.prepare (try 2)", 9_000, 1, 10, 10))  # fmt: skip
    runs = run_rows({"runs": [survey.run_json(repaired), survey.run_json(lost)], "decisions": []}, [])
    x: dict[str, Any] = {"prefix": "orders", "transactions": [], "losses": [loss], "runs": runs}
    topic = {"decision_topic": "kafka2pc_decisions", "decision_topic_exists": True, "known_prefixes": {}}
    html = render_page("kafka2pc_default", ["orders"], {"exporters": [x], **topic}, True)
    assert "<b>No clear repairs this run</b>: it was not exported by an export task; repair it from a shell: " in html
    assert "from a shell: kafka2pc repair --prefix orders --run dag/r1 --source MODULE:NAME." in html
    assert "Acknowledge loss</button>" in html
    assert "repaired by orders_dag.prepare (try 2) at 1970-01-01T00:00:09Z: 10 lost records exported again" in html


def _loss_page(**more: Any) -> str:
    loss = {
        "run": "dag/r1", "prefix": "orders", "final": True, "visible_transactions": 1, "transactions": 2,
        "visible_records": 10, "records": 20, "lost_transactions": 1, "lost_records": 10, "pending_transactions": 0,
        "acknowledge": "kafka2pc acknowledge --prefix orders --run dag/r1",
        "repair": "kafka2pc repair --prefix orders --run dag/r1 --source MODULE:NAME", "lost": [],
        "repair_task": {"dag_id": "dag", "run_id": "r1", "task_id": "orders.prepare"}, **more,
    }  # fmt: skip
    x: dict[str, Any] = {"prefix": "orders", "transactions": [], "losses": [loss], "runs": []}
    topic = {"decision_topic": "kafka2pc_decisions", "decision_topic_exists": True, "known_prefixes": {}}
    return render_page("kafka2pc_default", ["orders"], {"exporters": [x], **topic}, False)


def test_a_loss_an_export_task_repairs_has_a_repair_button_for_who_may_clear_it_and_a_note_for_others() -> None:
    allowed = _loss_page(can_repair=True)
    assert '<form class="inline repair" method="post" action="exporters/repair">' in allowed
    assert '<input type="hidden" name="run" value="dag/r1">' in allowed and "Repair run</button>" in allowed
    assert "clears task <code>orders.prepare</code> of DAG run <code>r1</code> (and the tasks after it)" in allowed
    refused = _loss_page(can_repair=False)
    assert "Repair run</button>" not in refused
    assert "it needs permission to clear task instances of DAG <code>dag</code>" in refused
    assert "<code>kafka2pc repair --prefix orders --run dag/r1 --source MODULE:NAME</code>" in refused
