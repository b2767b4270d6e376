"""Recovery: what happens to an exporter's lingering transactions (DESIGN §3.1)."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionSnapshot
from airflow_provider_kafka2pc.txn.errors import InvalidPrefixError
from airflow_provider_kafka2pc.txn.recovery import plan_recovery, recover
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, record, ref, txn_state


def snapshot(*records: tuple[str, Decision, int]) -> DecisionSnapshot:
    latest = {tid: record(tid, d, producer_epoch=epoch) for tid, d, epoch in records}
    return DecisionSnapshot(latest, {})


def test_ongoing_with_a_commit_decision_of_the_same_epoch_is_committed() -> None:
    plan = plan_recovery(
        [txn_state("orders-0", "Ongoing", producer_epoch=3)], snapshot(("orders-0", Decision.COMMIT, 3))
    )
    assert plan.commit == (ref("orders-0", producer_epoch=3),)
    assert (plan.abort, plan.wait) == ((), ())


def test_ongoing_recorded_committed_is_committed_again() -> None:
    """EndTxn went to some partitions' markers only: finishing it again is safe."""
    plan = plan_recovery([txn_state("orders-0", "Ongoing")], snapshot(("orders-0", Decision.COMMITTED, 0)))
    assert plan.commit == (ref("orders-0"),)


@pytest.mark.parametrize(
    "decisions",
    [
        (("orders-0", Decision.COMMIT, 2),),  # last run's epoch: POOLING reuses the id
        (("orders-0", Decision.COMMIT, 4),),
        (("orders-0", Decision.ABORTED, 3),),
        (("orders-0", Decision.LOST, 3),),
        (("orders-1", Decision.COMMIT, 3),),
        (),
    ],
)
def test_any_other_ongoing_is_aborted(decisions: tuple[tuple[str, Decision, int], ...]) -> None:
    plan = plan_recovery([txn_state("orders-0", "Ongoing", producer_epoch=3)], snapshot(*decisions))
    assert plan.abort == (ref("orders-0", producer_epoch=3),)
    assert (plan.commit, plan.wait) == ((), ())


def test_commit_decision_of_another_producer_id_is_aborted() -> None:
    s = DecisionSnapshot({"orders-0": record("orders-0", Decision.COMMIT, producer_id=1)}, {})
    plan = plan_recovery([txn_state("orders-0", "Ongoing", producer_id=2)], s)
    assert [r.producer_id for r in plan.abort] == [2]


@pytest.mark.parametrize("state", ["PrepareCommit", "PrepareAbort", "PrepareEpochFence"])
def test_broker_completing_it_is_waited_for(state: str) -> None:
    plan = plan_recovery([txn_state("orders-0", state)], snapshot(("orders-0", Decision.COMMIT, 0)))
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
    plan = plan_recovery(states, snapshot(("orders-2", Decision.COMMIT, 0), ("orders-0", Decision.COMMIT, 0)))
    assert [r.transactional_id for r in plan.commit] == ["orders-0", "orders-2"]
    assert [r.transactional_id for r in plan.abort] == ["orders-1"]
    assert plan.wait == ("orders-3",)


def test_nothing_open_is_an_empty_plan() -> None:
    assert plan_recovery([], snapshot()).empty


def test_recover_resolves_only_the_prefix_by_the_decision_log(clock: FakeClock, broker: FakeBroker) -> None:
    broker.add(
        txn_state("orders-0", "Ongoing", producer_epoch=5),  # decided COMMIT: commit
        txn_state("orders-1", "Ongoing", producer_epoch=5),  # undecided: abort
        txn_state("orders-2", "PrepareCommit"),  # the broker is on it: wait
        txn_state("orders-3", "CompleteCommit", producer_epoch=5),  # decided, committed, not yet recorded
        txn_state("orders2-0", "Ongoing"),  # another exporter's
        txn_state("orders-x", "Ongoing"),  # not an id we write
    )
    log = MemoryDecisionLog(
        initial=[
            record("orders-0", Decision.COMMIT, producer_epoch=5),
            record("orders-3", Decision.COMMIT, producer_epoch=5),
            record("orders2-0", Decision.COMMIT),
        ]
    )
    result = recover(broker, "orders", log)
    assert broker.commits_sent() == ["orders-0"]
    assert broker.aborts_sent() == ["orders-1"]
    assert broker.state_of("orders2-0") == broker.state_of("orders-x") == "Ongoing"
    assert result.plan.wait == ("orders-2",)
    assert not result.done
    assert result.settled == ("orders-3",)
    assert log.decisions("orders-0") == [Decision.COMMITTED]
    assert log.decisions("orders-1") == [Decision.ABORTED]
    assert log.decisions("orders-3") == [Decision.COMMITTED]
    assert log.decisions("orders2-0") == []


def test_recover_with_nothing_open_is_done(clock: FakeClock, broker: FakeBroker) -> None:
    broker.add(txn_state("orders-0", "CompleteCommit"))
    result = recover(broker, "orders", MemoryDecisionLog())
    assert result.done and result.plan.empty
    assert broker.end_txn_calls == []


def test_recover_refuses_an_ambiguous_prefix(broker: FakeBroker) -> None:
    with pytest.raises(InvalidPrefixError):
        recover(broker, "orders-eu", MemoryDecisionLog())
    assert broker.list_calls == []
