"""Whole flows of the decision protocol (DESIGN §3a) with an in-memory coordinator and log.

Commit, abort and recovery race for the first decision; crashes leave a decision without its
EndTxn; the broker loses a decided transaction. Every flow must end all-or-nothing, and say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import Position
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import DecisionConflictError, TransactionLostError
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.protocol.records import (
    DECISION_KEY,
    DecisionRecord,
    Kind,
    RunRecord,
    RunStatus,
    new_decision,
)
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.ruling import covered, now_ms
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, committable, txn_state

TIDS = ("orders-0", "orders-1", "orders-2")


@pytest.fixture(autouse=True)
def _no_real_sleep(clock: FakeClock) -> None:
    """Every test here runs the retry loops on the fake clock."""


class HookedLog(MemoryDecisionLog):
    """A decision log that lets another actor act just before a chosen decision is appended."""

    def __init__(self, events: list[str]) -> None:
        self.hooks: list[tuple[Callable[[DecisionRecord], bool], Callable[[], object]]] = []
        super().__init__(events)

    def before(self, matches: Callable[[DecisionRecord], bool], action: Callable[[], object]) -> None:
        self.hooks.append((matches, action))

    def append(self, items: Sequence[tuple[bytes, bytes | None]]) -> list[Position]:
        for key, value in items:
            if value is not None and key.startswith(DECISION_KEY.encode()):
                d = DecisionRecord.from_json(value)
                for hook in list(self.hooks):
                    if hook[0](d):
                        self.hooks.remove(hook)
                        hook[1]()
        return super().append(items)


@pytest.fixture
def log(events: list[str]) -> HookedLog:
    return HookedLog(events)


def prepared(broker: FakeBroker, *tids: str, records: int = 10) -> list[Committable]:
    out = []
    for tid in tids:
        c = committable(tid, records=records)
        broker.prepared(c)
        out.append(c)
    return out


def kill_after_deciding(
    log: MemoryDecisionLog, broker: FakeBroker, cs: Sequence[Committable], run: str, kind: Kind = Kind.COMMIT
) -> str:
    """A commit task that appended its decision and died before any EndTxn."""
    states = broker.describe_transactions([c.transactional_id for c in cs])
    d = new_decision(
        kind,
        [covered(c, states[c.transactional_id]) for c in cs],
        run,
        "commit",
        ["orders"] if kind is Kind.COMMIT else [],
        now_ms(),
    )
    assert log.decide(d).in_force(d.decision_id)
    return d.decision_id


def is_commit(d: DecisionRecord) -> bool:
    return d.kind is Kind.COMMIT


def is_recovery_abort(d: DecisionRecord) -> bool:
    return d.kind is Kind.ABORT and d.actor == "recovery"


# --- commit and recovery race for the first decision -------------------------------------------


def test_recovery_deciding_first_makes_the_commit_abort_everything_and_name_the_winner(
    broker: FakeBroker, log: HookedLog, events: list[str]
) -> None:
    cs = prepared(broker, *TIDS)
    # the commit task has read the log and described its transactions; recovery gets in first
    log.before(is_commit, lambda: recover(broker, "orders", log))

    with pytest.raises(DecisionConflictError) as info:
        commit_prepared(cs, broker, log, run="dag/run-1")

    assert broker.commits_sent() == []
    assert {broker.state_of(t) for t in TIDS} == {"CompleteAbort"}
    [recovery_abort] = [d for d in log.decisions_of("orders-0") if d.actor == "recovery"]
    message = str(info.value)
    assert recovery_abort.decision_id in message and "by recovery" in message
    assert "3 of its 3" in message and "none of its records are visible" in message
    assert events.index("decision ABORT orders-0 orders-1 orders-2") < events.index(
        "decision COMMIT orders-0 orders-1 orders-2"
    )
    state = log.read()
    [commit] = [d for d in log.decisions_of("orders-0") if d.kind is Kind.COMMIT]
    assert not state.in_force(commit.decision_id)
    assert state.run_status("orders", "dag/run-1") is None
    # and the next recovery has nothing left to do: no loss, nothing open
    assert recover(broker, "orders", log).done


def test_recovery_aborting_between_the_commits_read_and_its_look_names_recovery_not_a_loss(
    broker: FakeBroker, log: HookedLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery decides ABORT and ends the transactions after the commit task read the log but
    before it describes them: the commit finds them aborted ("doomed"), aborts the rest, and must
    say that recovery's decision won (a conflict), not that the run was lost (found by the
    real-broker race test, 1 round in about 200)."""
    cs = prepared(broker, *TIDS)
    describe = broker.describe_transactions
    raced: list[bool] = []

    def recovery_first(transactional_ids: Sequence[str]) -> dict[str, object]:
        if not raced:
            raced.append(True)
            assert recover(broker, "orders", log).done
        return describe(transactional_ids)  # type: ignore[return-value]

    monkeypatch.setattr(broker, "describe_transactions", recovery_first)
    with pytest.raises(DecisionConflictError, match="by recovery") as info:
        commit_prepared(cs, broker, log, run="dag/run-1")
    assert "none of its records are visible" in str(info.value)
    assert broker.commits_sent() == []
    assert {broker.state_of(t) for t in TIDS} == {"CompleteAbort"}
    assert recover(broker, "orders", log).done


def test_a_commit_meeting_an_earlier_abort_appends_no_commit_at_all(broker: FakeBroker, log: HookedLog) -> None:
    cs = prepared(broker, *TIDS)
    broker.set_state("orders-1", "Ongoing")
    recover(broker, "orders", log)  # aborts all three before the commit task runs
    with pytest.raises(DecisionConflictError, match="recovery"):
        commit_prepared(cs, broker, log, run="dag/run-1")
    assert Kind.COMMIT not in log.decisions("orders-0")
    assert broker.commits_sent() == []


def test_commit_deciding_first_makes_recovery_roll_everything_forward(
    broker: FakeBroker, log: HookedLog, events: list[str]
) -> None:
    cs = prepared(broker, *TIDS)
    # recovery has read the log (nothing decided) and listed the open transactions; the commit
    # task appends its COMMIT and dies before recovery's ABORT lands
    log.before(is_recovery_abort, lambda: kill_after_deciding(log, broker, cs, "dag/run-1"))

    result = recover(broker, "orders", log)

    assert result.done
    assert sorted(broker.commits_sent()) == list(TIDS)
    assert broker.aborts_sent() == []
    assert {broker.state_of(t) for t in TIDS} == {"CompleteCommit"}
    assert events.index("decision COMMIT orders-0 orders-1 orders-2") < events.index(
        "decision ABORT orders-0 orders-1 orders-2"
    )
    rec = log.read().run_status("orders", "dag/run-1")
    assert rec is not None and (rec.status, rec.transactions, rec.records) == (RunStatus.COMMITTED, 3, 30)

    # the commit task's retry answers from the run record
    report = commit_prepared(cs, broker, log, run="dag/run-1")
    assert "already" in report.note and "committed" in report.note


def test_a_twin_commit_task_that_decided_first_is_obeyed_not_reported_as_a_conflict(
    broker: FakeBroker, log: HookedLog
) -> None:
    """A zombie and a retry of the same commit task both append a COMMIT: the run commits once."""
    cs = prepared(broker, *TIDS)
    log.before(is_commit, lambda: kill_after_deciding(log, broker, cs, "dag/run-1"))
    report = commit_prepared(cs, broker, log, run="dag/run-1")
    assert report.count(Verdict.COMMITTED) == 3
    assert broker.aborts_sent() == []
    assert log.decisions("orders-0") == [Kind.COMMIT, Kind.COMMIT]
    state = log.read()
    assert state.decisions == {}, "the void twin must be retired with the COMMIT that won"
    rec = state.run_status("orders", "dag/run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


def test_a_commit_whose_transaction_another_run_committed_aborts_the_rest(broker: FakeBroker, log: HookedLog) -> None:
    a, b = prepared(broker, "orders-0", "orders-1")
    kill_after_deciding(log, broker, [a], "dag/run-0")
    with pytest.raises(DecisionConflictError, match="another run's COMMIT"):
        commit_prepared([a, b], broker, log, run="dag/run-1")
    assert broker.commits_sent() == ["orders-0"]  # rolled forward under run-0's decision
    assert broker.aborts_sent() == ["orders-1"]
    assert log.read().run_status("orders", "dag/run-1") is None


# --- crashes after the decision ----------------------------------------------------------------


@pytest.mark.parametrize("compact", [False, True])
def test_a_commit_killed_after_its_decision_is_rolled_forward_by_recovery(
    broker: FakeBroker, log: HookedLog, compact: bool
) -> None:
    cs = prepared(broker, *TIDS, records=4)
    kill_after_deciding(log, broker, cs, "dag/run-1")
    if compact:
        log.compact()
    result = recover(broker, "orders", log)
    assert result.done and result.lost == ()
    assert sorted(broker.commits_sent()) == list(TIDS)
    assert {r.outcome for r in result.resolutions} == {Verdict.COMMITTED}
    assert Kind.ABORT not in log.decisions("orders-0")
    state = log.read()
    assert state.decisions == {}
    rec = state.run_status("orders", "dag/run-1")
    assert rec is not None and (rec.status, rec.records) == (RunStatus.COMMITTED, 12)


def test_a_commit_killed_midway_is_finished_by_recovery(broker: FakeBroker, log: HookedLog) -> None:
    cs = prepared(broker, *TIDS)
    kill_after_deciding(log, broker, cs, "dag/run-1")
    broker.set_state("orders-1", "CompleteCommit")  # one EndTxn went through before the crash
    result = recover(broker, "orders", log)
    assert result.done
    assert sorted(broker.commits_sent()) == ["orders-0", "orders-2"]
    rec = log.read().run_status("orders", "dag/run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


def test_the_abort_task_rolls_forward_a_run_decided_commit(broker: FakeBroker, log: HookedLog) -> None:
    cs = prepared(broker, *TIDS)
    kill_after_deciding(log, broker, cs, "dag/run-1")
    report = abort_prepared(cs, broker, log, run="dag/run-1")
    assert report.count(Verdict.COMMITTED) == 3
    assert broker.aborts_sent() == []
    assert log.decisions("orders-0") == [Kind.COMMIT]  # nothing undecided: no ABORT appended
    rec = log.read().run_status("orders", "dag/run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED


# --- a decided COMMIT the broker then loses ----------------------------------------------------


@pytest.mark.parametrize("lose_all", [False, True])
def test_a_decided_commit_the_broker_times_out_fails_recovery_every_pass(
    broker: FakeBroker, log: HookedLog, lose_all: bool
) -> None:
    cs = prepared(broker, *TIDS)
    kill_after_deciding(log, broker, cs, "dag/run-1")
    lost = list(TIDS) if lose_all else ["orders-1"]
    for tid in lost:
        broker.time_out(tid)

    for attempt in range(3):
        with pytest.raises(TransactionLostError) as info:
            recover(broker, "orders", log)
        assert sorted(t.transactional_id for t in info.value.lost) == lost, attempt

    assert sorted(broker.commits_sent()) == sorted(set(TIDS) - set(lost))
    assert broker.aborts_sent() == []
    state = log.read()
    rec = state.run_status("orders", "dag/run-1")
    assert rec is not None and rec.status is RunStatus.LOST
    assert sorted(t.covered.transactional_id for t in rec.lost) == lost
    assert state.decisions == {}  # the loss lives on in the run record, not in the decision
    run_records = [e for e in log.entries if e.key == rec.key]
    assert len(run_records) == 1  # written once, by the pass that found the loss

    # the commit task's retry fails loudly from the run record, touching nothing
    calls = len(broker.end_txn_calls)
    with pytest.raises(TransactionLostError):
        commit_prepared(cs, broker, log, run="dag/run-1")
    assert len(broker.end_txn_calls) == calls


# --- clears of old runs ------------------------------------------------------------------------


def test_a_clear_of_an_old_committed_run_touches_nothing(broker: FakeBroker, log: HookedLog) -> None:
    """POOLING: the ids are open again under a newer run; the old run's commit must not touch them."""
    old = [committable(t, producer_epoch=0, records=5) for t in TIDS]
    for t in TIDS:
        broker.prepared(committable(t, producer_epoch=1))  # the newer run's transactions
    done = RunRecord("orders", "dag/run-1", RunStatus.COMMITTED, 3, 15, now_ms(), "d-old")
    log.append([(done.key, done.to_json())])
    written = list(log.entries)

    report = commit_prepared(old, broker, log, run="dag/run-1")

    assert "already" in report.note and "committed" in report.note
    assert report.resolutions == ()
    assert broker.end_txn_calls == []  # described (read only): the open ones are another epoch's
    assert log.entries == written
    assert {broker.state_of(t) for t in TIDS} == {"Ongoing"}


def test_a_clear_of_a_run_committed_by_recovery_touches_nothing(broker: FakeBroker, log: HookedLog) -> None:
    cs = prepared(broker, *TIDS)
    kill_after_deciding(log, broker, cs, "dag/run-1")
    recover(broker, "orders", log)
    written, calls = list(log.entries), len(broker.end_txn_calls)
    report = commit_prepared(cs, broker, log, run="dag/run-1", prefixes=["orders"])
    assert "already" in report.note and "committed" in report.note
    assert (log.entries, len(broker.end_txn_calls)) == (written, calls)


def test_a_second_export_of_a_decided_run_is_aborted_not_committed(broker: FakeBroker, log: HookedLog) -> None:
    """The run's commit decided T@0; a cleared export re-prepared other transactions of the run."""
    first = prepared(broker, "orders-0", "orders-1")
    kill_after_deciding(log, broker, first, "dag/run-1")
    second = prepared(broker, "orders-2", "orders-3")  # the second export's transactions
    with pytest.raises(DecisionConflictError, match="already has a COMMIT decision"):
        commit_prepared(second, broker, log, "dag/run-1", prefixes=["orders"])
    assert broker.commits_sent() == []
    assert sorted(broker.aborts_sent()) == ["orders-2", "orders-3"]
    recover(broker, "orders", log)  # the first decision is obeyed
    assert sorted(broker.commits_sent()) == ["orders-0", "orders-1"]


def test_a_second_export_of_a_finished_run_is_aborted_not_left_open(broker: FakeBroker, log: HookedLog) -> None:
    """The run is COMMITTED and collapsed; an export that raced past its check prepared again."""
    first = prepared(broker, "orders-0", "orders-1")
    commit_prepared(first, broker, log, "dag/run-1", prefixes=["orders"])
    written = len(log.entries)
    second = prepared(broker, "orders-0", "orders-1")  # same ids, next epoch: the second export
    with pytest.raises(DecisionConflictError, match="second export of the run"):
        commit_prepared(second, broker, log, "dag/run-1", prefixes=["orders"])
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]
    assert len(log.entries) > written  # the ABORT decision came before the EndTxns
    report = commit_prepared(first, broker, log, "dag/run-1", prefixes=["orders"])  # the run stays committed
    assert "already committed" in report.note


def test_a_second_export_ruled_by_an_abort_nobody_obeyed_is_aborted_on_retry(
    broker: FakeBroker, log: HookedLog
) -> None:
    """The commit that found the second export appended its ABORT and died before any EndTxn; its
    retry must finish that ABORT, not answer "already committed" with the transactions open."""
    first = prepared(broker, "orders-0", "orders-1")
    commit_prepared(first, broker, log, "dag/run-1", prefixes=["orders"])
    second = prepared(broker, "orders-0", "orders-1")
    kill_after_deciding(log, broker, second, "dag/run-1", kind=Kind.ABORT)
    with pytest.raises(DecisionConflictError, match="second export of the run"):
        commit_prepared(second, broker, log, "dag/run-1", prefixes=["orders"])
    assert {broker.state_of(t) for t in ("orders-0", "orders-1")} != {"Ongoing"}
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]


def test_incrementing_recovery_leaves_another_live_runs_undecided_transactions_alone(
    broker: FakeBroker, log: HookedLog
) -> None:
    mine = prepared(broker, "orders-run1-0")
    other = prepared(broker, "orders-run2-0")
    result = recover(broker, "orders", log, run_key="run1")
    assert [r.transactional_id for r in result.plan.abort] == [mine[0].transactional_id]
    assert broker.aborts_sent() == ["orders-run1-0"]
    assert broker.state_of(other[0].transactional_id) == "Ongoing"


# --- a commit that comes back with an old reading (DESIGN §15) ---------------------------------


class PausedAfterRead(HookedLog):
    """The commit reads the log, then pauses: ``meanwhile`` runs once, right after that first read."""

    def __init__(self, events: list[str]) -> None:
        self.meanwhile: Callable[[], object] | None = None
        super().__init__(events)

    def read(self, *args: object, **kwargs: object) -> LogState:
        state = super().read(*args, **kwargs)  # type: ignore[arg-type]
        if self.meanwhile is not None:
            act, self.meanwhile = self.meanwhile, None
            act()
        return state


@pytest.mark.parametrize("then", ["committed", "ids taken anew by another producer"])
def test_a_commit_paused_after_its_read_answers_from_the_twin_that_committed_meanwhile(
    broker: FakeBroker, events: list[str], then: str
) -> None:
    log = PausedAfterRead(events)
    cs = prepared(broker, *TIDS)

    def twin() -> None:
        assert commit_prepared(cs, broker, log.sibling(), run="dag/run-1").committed
        if then != "committed":  # the ids expired and were taken by a new producer, writing now
            for tid in TIDS:
                broker.add(txn_state(tid, "Ongoing", producer_id=5000))

    log.meanwhile = twin
    report = commit_prepared(cs, broker, log, run="dag/run-1")
    assert report.committed and "already committed" in report.note
    assert broker.aborts_sent() == [] and sorted(broker.commits_sent()) == sorted(TIDS)
    assert Kind.ABORT not in log.decisions("orders-0")
    rec = log.read().run_status("orders", "dag/run-1")
    assert rec is not None and rec.status is RunStatus.COMMITTED
