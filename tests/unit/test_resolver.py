"""Finishing prepared transactions from another process, against an in-memory coordinator.

Covers ``TransactionInspector``, ``TransactionResolver``, ``commit_prepared`` and
``abort_prepared`` (DESIGN §4-§6): retries at the same version, classification by a fresh
DescribeTransactions, the decision before the first EndTxn, and all-or-nothing refusal.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pytest

from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import (
    CoordinatorError,
    ForeignCommittableError,
    MalformedCommittableError,
    RunAbortedError,
    StaleCommittableError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, broker_pattern
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE,
    NONE,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    PRODUCER_FENCED,
    REQUEST_TIMED_OUT,
    Intent,
    Observation,
    TxnRef,
    Verdict,
)
from airflow_provider_kafka2pc.txn.protocol.records import Kind, OutcomeRecord, RunStatus
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution, TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.unit.fakes import (
    FakeBroker,
    FakeClock,
    MemoryDecisionLog,
    committable,
    decision_item,
    legacy_record,
    now_ms,
    ref,
    txn_state,
)

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
CONCURRENT_TRANSACTIONS = 51


@pytest.fixture(autouse=True)
def _no_real_sleep(clock: FakeClock) -> None:
    """Every test here runs the retry loops on the fake clock."""


def prepared(
    broker: FakeBroker, *tids: str, producer_id: int = 1000, producer_epoch: int = 0, records: int = 10
) -> list[Committable]:
    """Committables the broker holds open, as the prepare tasks left them."""
    out = []
    for tid in tids:
        c = committable(tid, producer_id=producer_id, producer_epoch=producer_epoch, records=records)
        broker.prepared(c)
        out.append(c)
    return out


def resolve_one(
    broker: FakeBroker,
    c: Committable,
    intent: Intent = Intent.COMMIT,
    committed_in_log: Callable[[TxnRef], bool] = lambda _ref: False,
) -> Resolution:
    [resolution] = TransactionResolver(broker, committed_in_log).resolve([ref_of(c)], intent)
    assert resolution.ref == ref_of(c)
    return resolution


# --- TransactionResolver: the happy path and retries ----------------------------------------


@pytest.mark.parametrize(("intent", "final"), [(Intent.COMMIT, "CompleteCommit"), (Intent.ABORT, "CompleteAbort")])
def test_open_transaction_is_ended_as_intended(broker: FakeBroker, intent: Intent, final: str) -> None:
    [c] = prepared(broker, "orders-0", producer_id=77, producer_epoch=3)
    r = resolve_one(broker, c, intent)
    assert r.outcome is (Verdict.COMMITTED if intent is Intent.COMMIT else Verdict.ABORTED)
    assert r.observation is Observation.OPEN
    assert r.end_txn_codes == ()
    assert broker.state_of("orders-0") == final
    [call] = broker.end_txn_calls
    assert (call.transactional_id, call.producer_id, call.producer_epoch) == ("orders-0", 77, 3)
    assert call.commit is (intent is Intent.COMMIT)


def test_resolve_returns_only_once_the_markers_are_written(broker: FakeBroker, clock: FakeClock) -> None:
    """EndTxn answers at PrepareCommit; visibility needs CompleteCommit, so resolve waits for it."""
    [c] = prepared(broker, "orders-0", producer_id=77, producer_epoch=3)

    def decided_not_yet_visible(b: FakeBroker) -> int:
        preparing = txn_state("orders-0", "PrepareCommit", producer_id=77, producer_epoch=3)
        b.upcoming_states["orders-0"] = [preparing, preparing, txn_state("orders-0", "CompleteCommit", 77, 3)]
        return NONE

    broker.end_txn_script["orders-0"] = [decided_not_yet_visible]
    r = resolve_one(broker, c, Intent.COMMIT)
    assert r.outcome is Verdict.COMMITTED
    assert broker.state_of("orders-0") == "CompleteCommit"
    assert broker.upcoming_states["orders-0"] == []  # every PrepareCommit answer was waited out


@pytest.mark.parametrize(
    ("codes", "names"),
    [
        ([NOT_COORDINATOR], ("NotCoordinatorError",)),
        ([COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_LOAD_IN_PROGRESS], ("CoordinatorLoadInProgressError",) * 2),
        ([CONCURRENT_TRANSACTIONS], ("ConcurrentTransactionsError",)),
        (
            [COORDINATOR_NOT_AVAILABLE, CONCURRENT_TRANSACTIONS],
            ("CoordinatorNotAvailableError", "ConcurrentTransactionsError"),
        ),
        ([REQUEST_TIMED_OUT], ("RequestTimedOutError",)),
        ([NOT_ENOUGH_REPLICAS], ("NotEnoughReplicasError",)),
    ],
)
def test_retriable_codes_are_retried_with_the_same_request(
    broker: FakeBroker, clock: FakeClock, codes: list[int], names: tuple[str, ...]
) -> None:
    [c] = prepared(broker, "orders-0")
    broker.end_txn_script["orders-0"] = list(codes)
    r = resolve_one(broker, c)
    assert r.outcome is Verdict.COMMITTED
    assert r.end_txn_codes == names
    assert broker.state_of("orders-0") == "CompleteCommit"
    assert len(broker.end_txn_calls) == len(codes) + 1
    assert {(x.producer_id, x.producer_epoch, x.commit) for x in broker.end_txn_calls} == {(1000, 0, True)}
    assert len(clock.sleeps) >= len(codes)  # backed off before every retry


def test_not_coordinator_asks_find_coordinator_again(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")

    def coordinator_moves(b: FakeBroker) -> int:
        b.coordinators["orders-0"] = 2
        return NOT_COORDINATOR

    broker.end_txn_script["orders-0"] = [coordinator_moves]
    r = resolve_one(broker, c)
    assert r.outcome is Verdict.COMMITTED
    assert r.end_txn_codes == ("NotCoordinatorError",)
    # node 2 can only have come from a fresh FindCoordinator after the failure
    assert [x.node_id for x in broker.end_txn_calls] == [1, 2]


def test_find_coordinator_errors_are_retried(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")
    broker.find_errors["orders-0"] = [COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS]
    assert resolve_one(broker, c).outcome is Verdict.COMMITTED


def test_describe_retriable_errors_are_retried(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")
    broker.describe_errors["orders-0"] = [COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR]
    r = resolve_one(broker, c)
    assert (r.outcome, r.observation) == (Verdict.COMMITTED, Observation.OPEN)


def test_describe_fatal_error_fails_instead_of_guessing(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")
    broker.describe_errors["orders-0"] = [TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    with pytest.raises(KafkaAuthorizationError, match="may not Describe TransactionalId 'orders-0'") as info:
        resolve_one(broker, c)
    assert info.value.principal == "User:<this client>"  # the fake wire does not know its principal
    assert broker.end_txn_calls == []


def test_coordinator_that_never_recovers_is_an_error_not_a_verdict(broker: FakeBroker, clock: FakeClock) -> None:
    [c] = prepared(broker, "orders-0")
    broker.end_txn_script["orders-0"] = [NOT_COORDINATOR] * 10_000
    with pytest.raises(CoordinatorError, match="gave up"):
        resolve_one(broker, c)
    assert broker.state_of("orders-0") == "Ongoing"
    assert sum(clock.sleeps) <= 61


# --- TransactionResolver: fatal codes are classified by a fresh DescribeTransactions ---------


def test_producer_fenced_after_a_timeout_is_lost(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")

    def broker_timed_it_out(b: FakeBroker) -> int:
        b.time_out("orders-0")
        return PRODUCER_FENCED

    broker.end_txn_script["orders-0"] = [broker_timed_it_out]
    r = resolve_one(broker, c)
    assert r.outcome is Verdict.LOST
    assert r.observation is Observation.SUPERSEDED
    assert r.end_txn_codes == ("ProducerFencedError",)
    assert "transaction.timeout.ms" in r.detail
    assert len(broker.end_txn_calls) == 1  # a fenced EndTxn is not retried


@pytest.mark.parametrize("code", [PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE])
def test_fatal_code_on_a_committed_transaction_is_committed(broker: FakeBroker, code: int) -> None:
    """The code says 'fenced'; the broker says 'CompleteCommit, same epoch': the broker wins."""
    [c] = prepared(broker, "orders-0")

    def someone_else_committed(b: FakeBroker) -> int:
        b.set_state("orders-0", "CompleteCommit")
        return code

    broker.end_txn_script["orders-0"] = [someone_else_committed]
    r = resolve_one(broker, c)
    assert (r.outcome, r.observation) == (Verdict.COMMITTED, Observation.COMMITTED)
    assert len(r.end_txn_codes) == 1


def test_fenced_but_recorded_committed_in_the_log_is_committed(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")

    def fenced(b: FakeBroker) -> int:
        b.time_out("orders-0")
        return PRODUCER_FENCED

    broker.end_txn_script["orders-0"] = [fenced]
    r = resolve_one(broker, c, committed_in_log=lambda ref: ref == ref_of(c))
    assert r.outcome is Verdict.COMMITTED


def test_abort_of_a_transaction_that_got_committed_reports_committed(broker: FakeBroker) -> None:
    [c] = prepared(broker, "orders-0")

    def committed_meanwhile(b: FakeBroker) -> int:
        b.set_state("orders-0", "CompleteCommit")
        return INVALID_TXN_STATE

    broker.end_txn_script["orders-0"] = [committed_meanwhile]
    assert resolve_one(broker, c, Intent.ABORT).outcome is Verdict.COMMITTED
    assert broker.state_of("orders-0") == "CompleteCommit"


# --- TransactionResolver: states seen before any EndTxn ---------------------------------------


@pytest.mark.parametrize(
    ("in_log", "intent", "expected"),
    [
        (True, Intent.COMMIT, Verdict.COMMITTED),
        (False, Intent.COMMIT, Verdict.LOST),
        (True, Intent.ABORT, Verdict.COMMITTED),
        (False, Intent.ABORT, Verdict.ABORTED),
    ],
)
def test_unknown_id_consults_the_decision_log(
    broker: FakeBroker, in_log: bool, intent: Intent, expected: Verdict
) -> None:
    c = committable("orders-0")  # the broker never heard of it (or the id expired)
    asked: list[TxnRef] = []

    def committed_in_log(ref: TxnRef) -> bool:
        asked.append(ref)
        return in_log

    r = resolve_one(broker, c, intent, committed_in_log)
    assert (r.outcome, r.observation) == (expected, Observation.UNKNOWN_ID)
    assert asked == [ref_of(c)]
    assert broker.end_txn_calls == []


@pytest.mark.parametrize(
    ("state", "intent", "expected"),
    [
        ("CompleteCommit", Intent.COMMIT, Verdict.COMMITTED),
        ("PrepareCommit", Intent.COMMIT, Verdict.COMMITTED),
        ("CompleteCommit", Intent.ABORT, Verdict.COMMITTED),
        ("PrepareCommit", Intent.ABORT, Verdict.COMMITTED),
        ("CompleteAbort", Intent.COMMIT, Verdict.LOST),
        ("PrepareAbort", Intent.COMMIT, Verdict.LOST),
        ("CompleteAbort", Intent.ABORT, Verdict.ABORTED),
        ("Empty", Intent.COMMIT, Verdict.LOST),
    ],
)
def test_already_ended_transaction_is_not_ended_again(
    broker: FakeBroker, state: str, intent: Intent, expected: Verdict
) -> None:
    [c] = prepared(broker, "orders-0")
    broker.set_state("orders-0", state)
    assert resolve_one(broker, c, intent).outcome is expected
    assert broker.end_txn_calls == []


def test_epoch_fence_is_waited_out_and_then_classified(broker: FakeBroker, clock: FakeClock) -> None:
    c = committable("orders-0", producer_epoch=4)
    fencing = txn_state("orders-0", "PrepareEpochFence", producer_epoch=5)
    aborted = txn_state("orders-0", "CompleteAbort", producer_epoch=5, partitions=())
    broker.add(fencing)
    broker.upcoming_states["orders-0"] = [fencing, fencing, aborted]
    r = resolve_one(broker, c)
    assert (r.outcome, r.observation) == (Verdict.LOST, Observation.SUPERSEDED)
    assert broker.end_txn_calls == []
    assert clock.sleeps.count(0.2) == 2


def test_epoch_fence_that_never_ends_is_an_error(broker: FakeBroker) -> None:
    c = committable("orders-0", producer_epoch=4)
    broker.add(txn_state("orders-0", "PrepareEpochFence", producer_epoch=5))
    with pytest.raises(CoordinatorError, match="fencing"):
        resolve_one(broker, c)


# --- TransactionResolver: many at once ---------------------------------------------------------


def test_many_transactions_end_in_parallel(broker: FakeBroker) -> None:
    tids = [f"orders-{i}" for i in range(12)]
    cs = prepared(broker, *tids)
    broker.end_txn_barrier = threading.Barrier(len(tids), timeout=5)  # breaks unless all 12 are in flight
    resolutions = TransactionResolver(broker, max_workers=16).resolve([ref_of(c) for c in cs], Intent.COMMIT)
    assert [r.ref.transactional_id for r in resolutions] == tids  # in the order given
    assert {r.outcome for r in resolutions} == {Verdict.COMMITTED}
    assert {broker.state_of(t) for t in tids} == {"CompleteCommit"}


def test_observations_are_batched_per_coordinator(broker: FakeBroker) -> None:
    cs = prepared(broker, "orders-0", "orders-1", "orders-2", "orders-3")
    broker.coordinators.update({"orders-1": 2, "orders-3": 2})
    observed = TransactionResolver(broker).observe_all([ref_of(c) for c in cs])
    assert {t: o for t, (o, _) in observed.items()} == dict.fromkeys(
        ["orders-0", "orders-1", "orders-2", "orders-3"], Observation.OPEN
    )
    assert sorted(broker.describe_calls) == [(1, ("orders-0", "orders-2")), (2, ("orders-1", "orders-3"))]
    assert len(broker.find_calls) == 1


def test_duplicate_transactional_ids_are_refused(broker: FakeBroker) -> None:
    with pytest.raises(MalformedCommittableError, match="orders-0"):
        TransactionResolver(broker).resolve([TxnRef("orders-0", 1, 0), TxnRef("orders-0", 1, 1)], Intent.COMMIT)
    assert broker.describe_calls == []


def test_nothing_to_resolve_asks_the_broker_nothing(broker: FakeBroker) -> None:
    assert TransactionResolver(broker).resolve([], Intent.COMMIT) == []
    assert (broker.find_calls, broker.describe_calls) == ([], [])


# --- TransactionInspector: an exporter's own open transactions ---------------------------------


@pytest.mark.parametrize("server_side_filter", [True, False])
def test_list_prefix_returns_exactly_the_prefix_ids(broker: FakeBroker, server_side_filter: bool) -> None:
    broker.supports_pattern = server_side_filter
    for tid in ["orders-1", "orders-run_1-3", "orders2-0", "orders-x", "orders-a-b-0", "other-0", "orders-0"]:
        broker.add(txn_state(tid, "Ongoing"))
    broker.add(txn_state("orders-9", "CompleteCommit"))
    listed = TransactionInspector(broker).list_prefix("orders")
    assert [t.transactional_id for t in listed] == ["orders-0", "orders-1", "orders-run_1-3"]
    [(_, pattern)] = broker.list_calls
    assert pattern == broker_pattern("orders")


def test_list_prefix_waits_out_a_broker_still_loading_its_transaction_log(broker: FakeBroker) -> None:
    # A real broker answers ListTransactions so while any partition of __transaction_state loads:
    # right after it starts (seen on a fresh broker), restarts or takes over a partition.
    broker.add(txn_state("orders-0", "Ongoing"))
    broker.list_errors = [COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE]
    listed = TransactionInspector(broker).list_prefix("orders")
    assert [t.transactional_id for t in listed] == ["orders-0"]
    assert len(broker.list_calls) == 3


def test_list_prefix_fails_on_a_fatal_code_naming_it(broker: FakeBroker) -> None:
    broker.list_errors = [31]  # CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(CoordinatorError, match="ListTransactions: ClusterAuthorizationFailedError"):
        TransactionInspector(broker).list_prefix("orders")
    assert len(broker.list_calls) == 1


def test_describe_prefix_returns_open_states_of_the_prefix(broker: FakeBroker) -> None:
    broker.add(
        txn_state("orders-0", "Ongoing", producer_epoch=2),
        txn_state("orders-1", "PrepareCommit"),
        txn_state("orders-2", "CompleteAbort"),
        txn_state("orders2-0", "Ongoing"),
    )
    described = TransactionInspector(broker).describe_prefix("orders")
    assert sorted((s.transactional_id, s.state, s.producer_epoch) for s in described) == [
        ("orders-0", "Ongoing", 2),
        ("orders-1", "PrepareCommit", 0),
    ]


# --- commit_prepared ---------------------------------------------------------------------------


def test_one_commit_decision_for_the_run_is_durable_before_the_first_end_txn(
    broker: FakeBroker, decision_log: MemoryDecisionLog, events: list[str]
) -> None:
    cs = prepared(broker, "orders-0", "orders-1", "orders-2", records=25)
    report = commit_prepared(cs, broker, decision_log, run="run-1")
    assert report.count(Verdict.COMMITTED) == 3
    assert {broker.state_of(c.transactional_id) for c in cs} == {"CompleteCommit"}

    first_end = next(i for i, e in enumerate(events) if e.startswith("end_txn"))
    last_end = max(i for i, e in enumerate(events) if e.startswith("end_txn"))
    decisions = [i for i, e in enumerate(events) if e.startswith("decision")]
    assert [events[i] for i in decisions] == ["decision COMMIT orders-0 orders-1 orders-2"]
    assert decisions[0] < first_end
    # the outcome and the run record come after the last EndTxn, then the decision is retired
    final = [i for i, e in enumerate(events) if e.startswith(("record", "tombstone"))]
    assert final and min(final) > last_end
    [commit] = decision_log.decisions_of("orders-0")
    assert (commit.kind, commit.run, commit.actor, commit.prefixes) == (Kind.COMMIT, "run-1", "commit", ("orders",))
    assert {(c.transactional_id, c.producer_id, c.producer_epoch, c.records) for c in commit.txns} == {
        (c.transactional_id, 1000, 0, 25) for c in cs
    }
    assert all(c.deadline_ms is not None for c in commit.txns)  # from the broker's start time + timeout


def test_commit_collapses_into_one_run_record_per_exporter_written_before_the_tombstones(
    broker: FakeBroker, decision_log: MemoryDecisionLog, events: list[str]
) -> None:
    cs = prepared(broker, "orders-0", "orders-1", records=5)
    commit_prepared(cs, broker, decision_log, run="dag/run-1", prefixes=["orders"])
    state = decision_log.read()
    rec = state.run_status("orders", "dag/run-1")
    assert rec is not None and (rec.status, rec.transactions, rec.records) == (RunStatus.COMMITTED, 2, 10)
    assert state.decisions == {} and state.outcomes == {}  # collapsed: reads cost what is in flight
    [commit] = decision_log.decisions_of("orders-0")
    assert events.index("record kafka2pc.run:orders:dag/run-1") < events.index(
        f"tombstone kafka2pc.decision:{commit.decision_id}"
    )


def test_an_aborted_run_gets_no_run_record(broker: FakeBroker, decision_log: MemoryDecisionLog) -> None:
    lost = committable("orders-0", producer_epoch=1, records=3)
    broker.prepared(lost)
    broker.set_state("orders-0", "CompleteAbort", producer_epoch=1)
    with pytest.raises(RunAbortedError):
        commit_prepared([lost], broker, decision_log, run="dag/run-2", prefixes=["orders"])
    assert decision_log.read().run_status("orders", "dag/run-2") is None
    assert decision_log.decisions("orders-0") == [Kind.ABORT]


def _timed_out(b: FakeBroker, tid: str) -> None:
    b.time_out(tid)


def _aborted(b: FakeBroker, tid: str) -> None:
    b.set_state(tid, "CompleteAbort")


def _expired(b: FakeBroker, tid: str) -> None:
    del b.states[tid]


def _fenced_by_a_new_producer(b: FakeBroker, tid: str) -> None:
    b.set_state(tid, "Empty", producer_epoch=b.states[tid].producer_epoch + 1)


@pytest.mark.parametrize("lose", [_timed_out, _aborted, _expired, _fenced_by_a_new_producer])
def test_one_lost_and_nothing_decided_aborts_the_whole_run(
    broker: FakeBroker, decision_log: MemoryDecisionLog, events: list[str], lose: Callable[[FakeBroker, str], None]
) -> None:
    a = committable("orders-0", records=10)
    lost = committable("orders-1", records=42, partitions=(3, 7))
    b = committable("orders-2", records=10)
    for c in (a, lost, b):
        broker.prepared(c)
    lose(broker, "orders-1")

    with pytest.raises(RunAbortedError) as info:
        commit_prepared([a, lost, b], broker, decision_log, run="run-1")

    assert broker.commits_sent() == []
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-2"]
    assert broker.state_of("orders-0") == broker.state_of("orders-2") == "CompleteAbort"
    assert [e for e in events if e.startswith("decision")] == ["decision ABORT orders-0 orders-1 orders-2"]
    assert events.index("decision ABORT orders-0 orders-1 orders-2") < events.index("end_txn abort orders-0")
    [gone] = info.value.why
    assert (gone.transactional_id, gone.records, gone.topic_partitions) == ("orders-1", 42, ("events-3", "events-7"))
    message = str(info.value)
    # The run's real totals, said as what it is: aborted whole, nothing visible; not "lost".
    assert message.startswith(
        "run run-1 was aborted as a whole, nothing of it is visible: 3 transaction(s) with 62 record(s). "
        "1 of them could no longer commit:"
    )
    assert "orders-1" in message and "42 records" in message and "events-3, events-7" in message
    assert "orders-0" not in message and "lost" not in message
    assert message.endswith("Clear the whole DAG run to export it again.")
    assert ("open too long" in message) is (lose in (_timed_out, _fenced_by_a_new_producer))


@pytest.mark.parametrize("remaining_ms", [-60_000, -1, 500, 89_000])
def test_committable_past_its_deadline_is_refused(
    broker: FakeBroker, decision_log: MemoryDecisionLog, remaining_ms: int
) -> None:
    """Still Ongoing on the broker, but its time is up (or within the commit's own worst case)."""
    a = committable("orders-0")
    late = committable("orders-1", timeout_ms=900_000, first_write_ms=now_ms() - 900_000 + remaining_ms)
    broker.prepared(a)
    broker.prepared(late)
    with pytest.raises(RunAbortedError, match="deadline") as info:
        commit_prepared([a, late], broker, decision_log, run="run-1")
    assert [t.transactional_id for t in info.value.why] == ["orders-1"]
    assert broker.commits_sent() == []
    assert broker.state_of("orders-0") == broker.state_of("orders-1") == "CompleteAbort"
    assert decision_log.decisions("orders-0") == [Kind.ABORT]


@pytest.mark.parametrize(
    ("timeout_ms", "left_ms", "headroom_ms", "commits"),
    [
        (30_000, 20_000, None, True),  # a 30 s cap: the derived headroom is 7.5 s + one EndTxn wave
        (30_000, 7_000, None, False),
        (120_000, 65_600, None, True),  # the 120 s cap: 30 s + one wave
        (120_000, 29_000, None, False),
        (30_000, 7_000, 2_000, True),  # configured headroom
        (30_000, 1_500, 2_000, False),
    ],
)
def test_the_commit_headroom_comes_from_the_timeout_in_force(
    broker: FakeBroker,
    decision_log: MemoryDecisionLog,
    timeout_ms: int,
    left_ms: int,
    headroom_ms: int | None,
    commits: bool,
) -> None:
    c = committable("orders-0", timeout_ms=timeout_ms, first_write_ms=now_ms() - timeout_ms + left_ms)
    broker.prepared(c)
    if commits:
        report = commit_prepared([c], broker, decision_log, run="run-1", headroom_ms=headroom_ms)
        assert report.count(Verdict.COMMITTED) == 1
    else:
        with pytest.raises(RunAbortedError, match="too close to its broker deadline"):
            commit_prepared([c], broker, decision_log, run="run-1", headroom_ms=headroom_ms)
        assert broker.commits_sent() == []


def test_committable_with_time_to_spare_is_committed(broker: FakeBroker, decision_log: MemoryDecisionLog) -> None:
    c = committable("orders-0", timeout_ms=900_000, first_write_ms=now_ms() - 900_000 + 120_000)
    broker.prepared(c)
    assert commit_prepared([c], broker, decision_log, run="run-1").count(Verdict.COMMITTED) == 1


def test_committable_being_fenced_on_timeout_is_refused_atomically(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    """PrepareEpochFence: the broker is aborting it right now; the rest must not become visible."""
    a = committable("orders-0")
    late = committable("orders-1", first_write_ms=now_ms() - 70_000)
    broker.prepared(a)
    fencing = txn_state("orders-1", "PrepareEpochFence", producer_epoch=1)
    broker.add(fencing)
    broker.upcoming_states["orders-1"] = [fencing, txn_state("orders-1", "CompleteAbort", producer_epoch=1)]
    with pytest.raises(RunAbortedError) as info:
        commit_prepared([a, late], broker, decision_log, run="run-1")
    assert [t.transactional_id for t in info.value.why] == ["orders-1"]
    assert broker.commits_sent() == [], "orders-0 became visible without orders-1"
    assert broker.state_of("orders-0") == "CompleteAbort"


def test_a_commit_appended_after_a_deadline_aborts_the_run_as_lost(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    """The broker's clock (LogAppendTime) says the COMMIT came too late: void, the run is aborted."""
    cs = prepared(broker, "orders-0", "orders-1")
    decision_log.broker_time_ms = now_ms() + 10**9
    with pytest.raises(RunAbortedError, match="appended after the broker deadline") as info:
        commit_prepared(cs, broker, decision_log, run="run-1")
    assert "open too long" in str(info.value)
    assert sorted(t.transactional_id for t in info.value.why) == ["orders-0", "orders-1"]
    assert broker.commits_sent() == []
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]


def test_commit_task_retried_after_a_crash_finishes_the_run(
    broker: FakeBroker, decision_log: MemoryDecisionLog, events: list[str]
) -> None:
    """COMMIT was written and one EndTxn went through before the crash: the retry reuses the COMMIT."""
    a, b = prepared(broker, "orders-0", "orders-1")
    decision_log.append([decision_item(Kind.COMMIT, [ref_of(a), ref_of(b)], prefixes=["orders"])])
    broker.set_state("orders-0", "CompleteCommit")
    report = commit_prepared([a, b], broker, decision_log, run="run-1")
    assert report.count(Verdict.COMMITTED) == 2
    assert broker.commits_sent() == ["orders-1"]
    assert decision_log.decisions("orders-0") == [Kind.COMMIT]  # no second decision
    rec = decision_log.read().run_status("orders", "run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


def test_once_decided_the_rest_is_rolled_forward_and_the_loss_reported(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    a, b = prepared(broker, "orders-0", "orders-1")
    broker.time_out("orders-1")
    decision_log.append([decision_item(Kind.COMMIT, [ref_of(a), ref_of(b)], prefixes=["orders"])])
    with pytest.raises(TransactionLostError) as info:
        commit_prepared([a, b], broker, decision_log, run="run-1")
    assert [t.transactional_id for t in info.value.lost] == ["orders-1"]
    [seen] = info.value.visibility
    assert (seen.transactions, seen.visible_transactions, seen.lost_transactions) == (2, 1, 1)
    assert seen.partly_visible
    assert "The run is partly visible: run run-1 of exporter orders: 1 of 2 transaction(s) visible" in str(info.value)
    assert broker.commits_sent() == ["orders-0"]
    assert broker.aborts_sent() == []  # decided COMMIT: nothing is aborted
    rec = decision_log.read().run_status("orders", "run-1")
    assert rec is not None and rec.status is RunStatus.LOST
    assert [t.covered.transactional_id for t in rec.lost] == ["orders-1"]
    # The fix names this exporter and run, ready to paste (no placeholders).
    assert "`kafka2pc acknowledge --prefix orders --run run-1`" in str(info.value)
    assert "PREFIX" not in str(info.value) and "--run RUN" not in str(info.value)
    # the next try answers from the run record, loudly, touching nothing
    calls = len(broker.end_txn_calls)
    with pytest.raises(TransactionLostError, match="orders-1") as again:
        commit_prepared([a, b], broker, decision_log, run="run-1")
    assert len(broker.end_txn_calls) == calls
    assert "`kafka2pc acknowledge --prefix orders --run run-1`" in str(again.value)
    # Once acknowledged, a retry says what is visible, not just "already acknowledged".
    acked = dataclasses.replace(rec, status=RunStatus.ACKNOWLEDGED, note="re-exported")
    decision_log.append([(acked.key, acked.to_json())])
    report = commit_prepared([a, b], broker, decision_log, run="run-1")
    assert report.note == (
        f"exporter orders: its loss was acknowledged (re-exported): {a.records} of {a.records + b.records} records "
        f"are visible, {b.records} were lost"
    )


def test_expired_id_recorded_committed_is_not_lost(broker: FakeBroker, decision_log: MemoryDecisionLog) -> None:
    """The retry of a decided run finds one id forgotten by the broker; the outcome says committed."""
    a = committable("orders-0")  # committed long ago; the broker forgot the id
    [b] = prepared(broker, "orders-1")
    decision_log.append([decision_item(Kind.COMMIT, [ref_of(a), ref_of(b)], prefixes=["orders"])])
    [did] = decision_log.read().decisions
    out = OutcomeRecord(did, frozenset({"orders-0"}))
    decision_log.append([(out.key, out.to_json())])
    report = commit_prepared([a, b], broker, decision_log, run="run-1")
    assert report.count(Verdict.COMMITTED) == 1  # orders-0 was already resolved
    assert broker.commits_sent() == ["orders-1"]
    rec = decision_log.read().run_status("orders", "run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


def test_commit_decision_for_another_epoch_does_not_count(broker: FakeBroker, events: list[str]) -> None:
    """POOLING reuses ids: a COMMIT of last run's epoch says nothing about this run."""
    a, b = prepared(broker, "orders-0", "orders-1", producer_epoch=8)
    broker.time_out("orders-1")
    log = MemoryDecisionLog(events, [decision_item(Kind.COMMIT, [ref("orders-1", producer_epoch=7)])])
    with pytest.raises(RunAbortedError):
        commit_prepared([a, b], broker, log, run="run-2")
    assert broker.commits_sent() == []


def test_duplicate_committables_are_refused_before_anything_is_decided(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    [c] = prepared(broker, "orders-0")
    with pytest.raises(MalformedCommittableError):
        commit_prepared([c, c], broker, decision_log, run="run-1")
    assert decision_log.entries == []
    assert broker.end_txn_calls == []


# --- abort_prepared ----------------------------------------------------------------------------


def test_abort_rolls_forward_a_transaction_ruled_by_a_commit(
    broker: FakeBroker, decision_log: MemoryDecisionLog, events: list[str]
) -> None:
    a, b = prepared(broker, "orders-0", "orders-1")
    decision_log.append([decision_item(Kind.COMMIT, [ref_of(a)], prefixes=["orders"])])
    report = abort_prepared([a, b], broker, decision_log, run="run-1")
    assert broker.commits_sent() == ["orders-0"]
    assert broker.aborts_sent() == ["orders-1"]
    assert broker.state_of("orders-0") == "CompleteCommit"
    assert broker.state_of("orders-1") == "CompleteAbort"
    assert {r.ref.transactional_id: r.outcome for r in report.resolutions} == {
        "orders-0": Verdict.COMMITTED,
        "orders-1": Verdict.ABORTED,
    }
    # ABORT only for what had no decision, appended before the abort
    assert decision_log.decisions("orders-0") == [Kind.COMMIT]
    assert decision_log.decisions("orders-1") == [Kind.ABORT]
    assert events.index("decision ABORT orders-1") < events.index("end_txn abort orders-1")
    rec = decision_log.read().run_status("orders", "run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


def test_abort_rolls_forward_a_legacy_commit(broker: FakeBroker, events: list[str]) -> None:
    [c] = prepared(broker, "orders-0")
    log = MemoryDecisionLog(events, [legacy_record("orders-0", "COMMIT")])
    report = abort_prepared([c], broker, log, run="run-1")
    assert report.count(Verdict.COMMITTED) == 1
    assert broker.commits_sent() == ["orders-0"] and broker.aborts_sent() == []
    assert log.read().decisions == {}  # the 0.1.0 record is retired once final


def test_abort_never_aborts_a_committed_transaction(broker: FakeBroker, decision_log: MemoryDecisionLog) -> None:
    [c] = prepared(broker, "orders-0")
    broker.set_state("orders-0", "CompleteCommit")
    report = abort_prepared([ref_of(c)], broker, decision_log, run="run-1")
    assert report.count(Verdict.COMMITTED) == 1
    assert broker.end_txn_calls == []


def test_abort_of_a_commit_decision_for_another_epoch_aborts(broker: FakeBroker, events: list[str]) -> None:
    [c] = prepared(broker, "orders-0", producer_epoch=3)
    log = MemoryDecisionLog(events, [decision_item(Kind.COMMIT, [ref("orders-0", producer_epoch=2)])])
    abort_prepared([c], broker, log, run="run-1")
    assert broker.aborts_sent() == ["orders-0"]
    assert broker.commits_sent() == []


def test_abort_of_what_an_abort_already_rules_decides_nothing_new(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    [c] = prepared(broker, "orders-0")
    abort_prepared([c], broker, decision_log, run="run-1")
    abort_prepared([c], broker, decision_log, run="run-1")
    assert decision_log.decisions("orders-0") == [Kind.ABORT]
    assert broker.aborts_sent() == ["orders-0"]


# -- membership: the core refuses what is not the exporter's, before any decision -----------


@pytest.mark.parametrize("act", [commit_prepared, abort_prepared])
def test_core_refuses_another_exporters_committable_before_deciding(
    broker: FakeBroker, decision_log: MemoryDecisionLog, act: Callable[..., object]
) -> None:
    mine, theirs = prepared(broker, "orders-0", "payments-1")
    with pytest.raises(ForeignCommittableError, match="'payments-1' does not belong to exporter 'orders'"):
        act([mine, theirs], broker, decision_log, "run-1", prefixes=["orders"])
    run_key_wrong = Members("orders", NamingStrategy.INCREMENTING, "run_2")
    with pytest.raises(ForeignCommittableError, match="INCREMENTING ids of this run look like 'orders-run_2-<slot>'"):
        act([mine], broker, decision_log, "run-1", prefixes=[run_key_wrong])
    assert decision_log.read().decisions == {} and broker.end_txn_calls == []


@pytest.mark.parametrize("act", [commit_prepared, abort_prepared])
def test_core_refuses_a_committable_the_broker_knows_under_another_producer(
    broker: FakeBroker, decision_log: MemoryDecisionLog, act: Callable[..., object]
) -> None:
    a, b = prepared(broker, "orders-0", "orders-1")
    edited = dataclasses.replace(b, producer_id=4242)
    with pytest.raises(StaleCommittableError, match="'orders-1' names producer id 4242, epoch 0, but the broker's"):
        act([a, edited], broker, decision_log, "run-1", prefixes=["orders"])
    future = dataclasses.replace(b, producer_epoch=5)  # an epoch the broker never gave out
    with pytest.raises(StaleCommittableError, match="`kafka2pc list --prefix orders` shows it"):
        act([a, future], broker, decision_log, "run-1", prefixes=["orders"])
    assert decision_log.read().decisions == {} and broker.end_txn_calls == []


def test_an_older_epoch_of_the_same_producer_is_a_timeout_not_an_edited_committable(
    broker: FakeBroker, decision_log: MemoryDecisionLog
) -> None:
    a, b = prepared(broker, "orders-0", "orders-1")
    broker.time_out("orders-1")
    with pytest.raises(RunAbortedError):
        commit_prepared([a, b], broker, decision_log, "run-1", prefixes=["orders"])
