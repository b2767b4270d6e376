"""Recovery: what happens to an exporter's lingering transactions (DESIGN §3.1, §3a)."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import InvalidPrefixError, TransactionLostError
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import Covered, Kind, LostTxn, RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.two_phase.recovery import plan_recovery, recover
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, decision_item, legacy_record, ref, txn_state


def state_of(*decisions: tuple[Kind, list[TxnRef]]) -> LogState:
    return MemoryDecisionLog(initial=[decision_item(kind, refs) for kind, refs in decisions]).read()


def test_ongoing_ruled_by_a_commit_of_the_same_epoch_is_committed() -> None:
    plan = plan_recovery(
        [txn_state("orders-0", "Ongoing", producer_epoch=3)],
        state_of((Kind.COMMIT, [ref("orders-0", producer_epoch=3)])),
    )
    assert plan.commit == (ref("orders-0", producer_epoch=3),)
    assert (plan.abort, plan.wait) == ((), ())


def test_ongoing_ruled_by_a_legacy_commit_is_committed() -> None:
    """A 0.1.0 COMMIT still in flight at the upgrade is rolled forward, not aborted."""
    state = MemoryDecisionLog(initial=[legacy_record("orders-0", "COMMIT", producer_epoch=3)]).read()
    plan = plan_recovery([txn_state("orders-0", "Ongoing", producer_epoch=3)], state)
    assert plan.commit == (ref("orders-0", producer_epoch=3),)


@pytest.mark.parametrize(
    "decisions",
    [
        ((Kind.COMMIT, [ref("orders-0", producer_epoch=2)]),),  # last run's epoch: POOLING reuses the id
        ((Kind.COMMIT, [ref("orders-0", producer_epoch=4)]),),
        ((Kind.ABORT, [ref("orders-0", producer_epoch=3)]),),
        ((Kind.COMMIT, [ref("orders-1", producer_epoch=3)]),),
        # a COMMIT that came after an ABORT of the same transaction is void
        ((Kind.ABORT, [ref("orders-0", producer_epoch=3)]), (Kind.COMMIT, [ref("orders-0", producer_epoch=3)])),
        (),
    ],
)
def test_any_other_ongoing_is_aborted(decisions: tuple[tuple[Kind, list[TxnRef]], ...]) -> None:
    plan = plan_recovery([txn_state("orders-0", "Ongoing", producer_epoch=3)], state_of(*decisions))
    assert plan.abort == (ref("orders-0", producer_epoch=3),)
    assert (plan.commit, plan.wait) == ((), ())


def test_commit_decision_of_another_producer_id_is_aborted() -> None:
    state = state_of((Kind.COMMIT, [ref("orders-0", producer_id=1)]))
    plan = plan_recovery([txn_state("orders-0", producer_id=2)], state)
    assert [r.producer_id for r in plan.abort] == [2]


@pytest.mark.parametrize("state", ["PrepareCommit", "PrepareAbort", "PrepareEpochFence"])
def test_broker_completing_it_is_waited_for(state: str) -> None:
    plan = plan_recovery([txn_state("orders-0", state)], state_of((Kind.COMMIT, [ref("orders-0")])))
    assert plan.wait == ("orders-0",)
    assert (plan.commit, plan.abort) == ((), ())
    assert not plan.empty


def test_plan_of_a_mixture_is_sorted_and_complete() -> None:
    states = [
        txn_state("orders-3", "PrepareCommit"),
        txn_state("orders-2", "Ongoing"),
        txn_state("orders-1", "Ongoing"),
        txn_state("orders-0", "Ongoing"),
    ]
    plan = plan_recovery(states, state_of((Kind.COMMIT, [ref("orders-2"), ref("orders-0")])))
    assert [r.transactional_id for r in plan.commit] == ["orders-0", "orders-2"]
    assert [r.transactional_id for r in plan.abort] == ["orders-1"]
    assert plan.wait == ("orders-3",)


def test_nothing_open_is_an_empty_plan() -> None:
    assert plan_recovery([], state_of()).empty


def test_recover_resolves_only_the_prefix_by_the_decision_log(
    clock: FakeClock, broker: FakeBroker, events: list[str]
) -> None:
    broker.add(
        txn_state("orders-0", "Ongoing", producer_epoch=5),  # decided COMMIT: commit
        txn_state("orders-1", "Ongoing", producer_epoch=5),  # undecided: ABORT first, then abort
        txn_state("orders-2", "PrepareCommit"),  # the broker is on it: wait
        txn_state("orders-3", "CompleteCommit", producer_epoch=5),  # decided, committed, not yet recorded
        txn_state("orders2-0", "Ongoing"),  # another exporter's
        txn_state("orders-x", "Ongoing"),  # not an id we write
    )
    log = MemoryDecisionLog(
        events,
        [
            decision_item(
                Kind.COMMIT, [ref("orders-0", producer_epoch=5), ref("orders-3", producer_epoch=5)], prefixes=["orders"]
            ),
            decision_item(Kind.COMMIT, [ref("orders2-0")], run="run-0", prefixes=["orders2"]),
        ],
    )
    events.clear()
    result = recover(broker, "orders", log)
    assert broker.commits_sent() == ["orders-0"]
    assert broker.aborts_sent() == ["orders-1"]
    assert broker.state_of("orders2-0") == broker.state_of("orders-x") == "Ongoing"
    assert result.plan.wait == ("orders-2",)
    assert not result.done
    # the ABORT of the undecided one is in the log before any EndTxn, and covers it alone
    assert events.index("decision ABORT orders-1") < min(i for i, e in enumerate(events) if e.startswith("end_txn"))
    assert log.decisions("orders-1") == [Kind.ABORT]
    assert log.decisions("orders2-0") == [Kind.COMMIT]
    # the COMMIT is final: it collapsed into the run record, orders-3 counted as committed
    state = log.read()
    status = state.run_status("orders", "run-1")
    assert status is not None and status.status is RunStatus.COMMITTED and status.transactions == 2
    assert state.ruled_by(ref("orders-0", producer_epoch=5)) is None
    assert state.run_status("orders2", "run-0") is not None  # the other exporter's decision is untouched
    assert state.run_status("orders2", "run-0").status is RunStatus.DECIDED  # type: ignore[union-attr]


def test_recover_twice_decides_nothing_new(clock: FakeClock, broker: FakeBroker) -> None:
    broker.add(txn_state("orders-0", "Ongoing"), txn_state("orders-1", "Ongoing"))
    log = MemoryDecisionLog()
    assert recover(broker, "orders", log).done
    written = len(log.entries)
    assert recover(broker, "orders", log).done
    assert len(log.entries) == written  # nothing open, the ABORT kept for its retention: no write
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]  # each once; EndTxns go out in parallel


def test_a_transaction_reopened_under_its_abort_is_aborted_again(clock: FakeClock, broker: FakeBroker) -> None:
    """A dying writer's late batch reopens its transaction after the export's at-once abort (same
    producer id and epoch). Its ABORT's outcome already says aborted; recovery and the abort task
    must still end it, not leave it open until the broker's timeout (adversarial review)."""
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared
    from tests.unit.fakes import committable

    c = committable("orders-0")
    broker.prepared(c)
    log = MemoryDecisionLog()
    assert recover(broker, "orders", log, run="run-1").done
    assert broker.state_of("orders-0") == "CompleteAbort"
    for actor in ("abort task", "recovery"):
        broker.prepared(c)  # reopened: the same (id, producer id, epoch)
        assert broker.state_of("orders-0") == "Ongoing"
        sent = len(broker.aborts_sent())
        if actor == "abort task":
            abort_prepared([txn_state("orders-0", "Ongoing", producer_id=c.producer_id)], broker, log, "run-1")
        else:
            assert recover(broker, "orders", log, run="run-2").done
        assert broker.state_of("orders-0") == "CompleteAbort", actor
        assert len(broker.aborts_sent()) == sent + 1, actor


def test_recover_with_nothing_open_is_done(clock: FakeClock, broker: FakeBroker) -> None:
    broker.add(txn_state("orders-0", "CompleteCommit"))
    log = MemoryDecisionLog()
    result = recover(broker, "orders", log)
    assert result.done and result.plan.empty
    assert broker.end_txn_calls == []
    assert log.entries == []


def test_recover_fails_loudly_on_a_lost_run_until_acknowledged(clock: FakeClock, broker: FakeBroker) -> None:
    lost = RunRecord(
        "orders",
        "dag/run-1",
        RunStatus.LOST,
        2,
        20,
        1,
        "d1",
        (LostTxn(Covered("orders-1", 1, 0, 10), "x"),),
    )
    log = MemoryDecisionLog(initial=[(lost.key, lost.to_json())])
    for _ in range(2):
        with pytest.raises(TransactionLostError, match="orders-1"):
            recover(broker, "orders", log)
    assert not recover(broker, "orders", log, raise_on_loss=False).done
    acked = RunRecord("orders", "dag/run-1", RunStatus.ACKNOWLEDGED, 2, 20, 2, "d1", lost.lost, "ops")
    log.append([(acked.key, acked.to_json())])
    assert recover(broker, "orders", log).done
    assert recover(broker, "payments", MemoryDecisionLog(initial=[(lost.key, lost.to_json())])).done


def test_recover_refuses_an_ambiguous_prefix(broker: FakeBroker) -> None:
    with pytest.raises(InvalidPrefixError):
        recover(broker, "orders-eu", MemoryDecisionLog())
    assert broker.list_calls == []
