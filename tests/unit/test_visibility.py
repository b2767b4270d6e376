"""How much of a run decided COMMIT is visible: counted from recorded outcomes, the broker, or the run record."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
from airflow_provider_kafka2pc.txn.protocol.outcome import Observation, TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import (
    Covered,
    Kind,
    LostTxn,
    OutcomeRecord,
    RunRecord,
    RunStatus,
    new_decision,
)
from airflow_provider_kafka2pc.txn.two_phase import visibility


def covered(tid: str, records: int = 100) -> Covered:
    return Covered(tid, 7, 0, records, (f"events-{tid[-1]}",))


def state_with(*tids: str, outcome: OutcomeRecord | None = None, run: str = "run-1") -> tuple[LogState, str]:
    d = new_decision(Kind.COMMIT, [covered(t) for t in tids], run, "commit", ["orders"], 1)
    state = LogState()
    state.decisions[d.decision_id] = d
    for c in d.txns:
        state.ruling[c.ref] = d.decision_id
    if outcome is not None:
        state.outcomes[d.decision_id] = OutcomeRecord(d.decision_id, outcome.committed, outcome.aborted, outcome.lost)
    return state, d.decision_id


def ref(tid: str, epoch: int = 0) -> TxnRef:
    return TxnRef(tid, 7, epoch)


def test_broker_view_counts_visible_lost_and_pending() -> None:
    state, did = state_with("orders-0", "orders-1", "orders-2", "orders-3", "orders-4")
    observed = {
        ref("orders-0"): Observation.COMMITTED,
        ref("orders-1"): Observation.COMMITTING,  # markers pending: the commit is decided on the broker
        ref("orders-2"): Observation.ABORTED,  # the broker aborted it on timeout
        ref("orders-3"): Observation.SUPERSEDED,  # another epoch, and the log does not say committed
        ref("orders-4"): Observation.OPEN,  # can still be committed
    }
    v, lost = visibility.of_decision(state, did, "orders", observed)
    assert (v.transactions, v.visible_transactions, v.lost_transactions, v.pending_transactions) == (5, 2, 2, 1)
    assert (v.records, v.visible_records, v.lost_records) == (500, 200, 200)
    assert v.partly_visible
    assert [(t.transactional_id, t.reason) for t in lost] == [
        ("orders-2", "the transaction was aborted"),
        ("orders-3", lost[1].reason),
    ]
    assert all(t.prefix == "orders" and t.run == "run-1" for t in lost)
    assert v.sentence() == (
        "run run-1 of exporter orders: 2 of 5 transaction(s) visible (200 of 500 records), 2 lost (200 records), "
        "1 still open"
    )


def test_a_transaction_being_fenced_is_lost_and_without_a_broker_view_nothing_is_guessed() -> None:
    state, did = state_with("orders-0", "orders-1")
    v, lost = visibility.of_decision(state, did, "orders", {ref("orders-0"): Observation.FENCING})
    assert [t.transactional_id for t in lost] == ["orders-0"] and v.pending_transactions == 1
    v, lost = visibility.of_decision(state, did, "orders")
    assert lost == () and v.pending_transactions == 2 and not v.partly_visible


def test_recorded_outcomes_win_over_the_broker_view() -> None:
    # Committed by an actor that recorded it; the id moved on since (a newer epoch): still visible.
    outcome = OutcomeRecord("", frozenset({"orders-0"}), lost=(LostTxn(covered("orders-1"), "aborted on timeout"),))
    state, did = state_with("orders-0", "orders-1", outcome=outcome)
    observed = {ref("orders-0"): Observation.SUPERSEDED, ref("orders-1"): Observation.SUPERSEDED}
    v, lost = visibility.of_decision(state, did, "orders", observed)
    assert (v.visible_transactions, v.lost_transactions) == (1, 1)
    assert [t.reason for t in lost] == ["aborted on timeout"]


def test_only_the_prefixs_part_of_a_two_exporter_run_is_counted() -> None:
    state, did = state_with("orders-0", "payments-0")
    v, _ = visibility.of_decision(state, did, "payments", {ref("payments-0"): Observation.ABORTED})
    assert (v.prefix, v.transactions, v.lost_transactions, v.visible_transactions) == ("payments", 1, 1, 0)
    # The broker is asked about the run's other exporters too: their loss breaks the run's atomicity.
    assert visibility.unresolved_commits(state, "orders") == [ref("orders-0"), ref("payments-0")]
    found = visibility.losses(
        state, "orders", {ref("orders-0"): Observation.COMMITTED, ref("payments-0"): Observation.ABORTED}
    )
    assert [(f.visibility.prefix, f.visibility.lost_transactions) for f in found] == [("payments", 1)]


def test_losses_of_a_prefix_lost_run_records_and_decisions_in_flight_but_not_acknowledged_ones() -> None:
    state, did = state_with("orders-0", "orders-1", run="run-3")
    lost_rec = RunRecord("orders", "run-2", RunStatus.LOST, 3, 300, 5, "d2", (LostTxn(covered("orders-1"), "x"),))
    acked = RunRecord("orders", "run-1", RunStatus.ACKNOWLEDGED, 1, 100, 1, "d1", (LostTxn(covered("orders-0"), "x"),))
    state.runs[("orders", "run-2")] = lost_rec
    state.runs[("orders", "run-1")] = acked
    found = visibility.losses(
        state, "orders", {ref("orders-0"): Observation.COMMITTED, ref("orders-1"): Observation.EMPTY}
    )
    assert [(f.visibility.run, f.final, f.decision_id) for f in found] == [("run-2", True, "d2"), ("run-3", False, did)]
    assert (found[0].visibility.visible_transactions, found[0].visibility.visible_records) == (2, 200)
    # The decision collapsed into its run record, but the tombstone did not land: counted once.
    state.runs[("orders", "run-3")] = RunRecord("orders", "run-3", RunStatus.LOST, 2, 200, 9, did, found[1].lost[:0])
    assert [f.visibility.run for f in visibility.losses(state, "orders")] == ["run-2", "run-3"]


@pytest.mark.parametrize("visible", [0, 1])
def test_the_loss_error_says_how_much_is_visible_with_a_command_to_paste(visible: int) -> None:
    state, did = state_with("orders-0", "orders-1")
    observed = {ref("orders-1"): Observation.ABORTED}
    if visible:
        observed[ref("orders-0")] = Observation.COMMITTED
    v, lost = visibility.of_decision(state, did, "orders", observed)
    text = str(TransactionLostError(lost, [v]))
    assert "kafka2pc acknowledge --prefix orders --run run-1" in text
    if visible:
        assert "The run is partly visible: run run-1 of exporter orders: 1 of 2 transaction(s) visible" in text
    else:
        assert "Nothing of the run is visible, but it was decided COMMIT" in text
    # Without counts it says where to look, not what it does not know.
    text = str(TransactionLostError(lost))
    assert "`kafka2pc list --prefix orders` shows how much of it is visible" in text


def test_an_id_that_moved_on_is_visible_when_its_markers_say_committed() -> None:
    """DESIGN §15: the epoch moved on under a COMMIT the log does not record as ended; the partitions'
    markers tell a transaction another process committed (visible) from one the broker aborted (lost)."""
    from airflow_provider_kafka2pc.txn.kafka.markers import Fate
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
    from tests.unit.fakes import FakeBroker, txn_state

    state, did = state_with("orders-0", "orders-1")
    broker = FakeBroker()
    for tid in ("orders-0", "orders-1"):
        broker.add(txn_state(tid, "CompleteCommit", producer_id=7, producer_epoch=1))  # the next run's epoch
    broker.fates[("orders-0", 7, 0)] = Fate.COMMITTED
    broker.fates[("orders-1", 7, 0)] = Fate.ABORTED
    observed = visibility.observe_broker(TransactionInspector(broker), [ref("orders-0"), ref("orders-1")], state)
    assert observed == {ref("orders-0"): Observation.COMMITTED, ref("orders-1"): Observation.SUPERSEDED}
    v, lost = visibility.of_decision(state, did, "orders", observed)
    assert (v.visible_transactions, v.lost_transactions) == (1, 1)
    assert [t.transactional_id for t in lost] == ["orders-1"]
