"""The decision protocol's pure rules (DESIGN §3a): ``replay`` and ``finalize``.

Every actor derives its ruling from the same log with ``replay``, so these rules are what makes
"first decision wins" true: a run is never half decided, a decision is never retired while it can
still matter, compaction changes no answer, and 0.1.0 records are still understood.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_topic import check_topic_settings
from airflow_provider_kafka2pc.txn.kafka.errors import UnsafeDecisionTopicError
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState, finalize, replay
from airflow_provider_kafka2pc.txn.protocol.records import (
    ABORT_RETENTION_SLACK_MS,
    OUTCOME_KEY,
    Covered,
    DecisionRecord,
    Entry,
    Kind,
    LostTxn,
    OutcomeRecord,
    RunRecord,
    RunStatus,
    new_decision,
    run_key,
)
from tests.unit.fakes import MemoryDecisionLog, legacy_record, ref

T0 = 1_800_000_000_000  # broker time of the first record of every log here


def cov(tid: str, epoch: int = 0, deadline: int | None = None, records: int = 10, pid: int = 1000) -> Covered:
    return Covered(tid, pid, epoch, records, ("events-0",), deadline)


def decide(
    log: MemoryDecisionLog,
    kind: Kind,
    *covered: Covered,
    run: str = "run-1",
    prefixes: Sequence[str] | None = None,
    at: int | None = None,
) -> DecisionRecord:
    """Append one decision at broker time ``at`` (default: the log's clock, unchanged)."""
    if prefixes is None:
        prefixes = sorted({c.transactional_id.split("-")[0] for c in covered}) if kind is Kind.COMMIT else ()
    d = new_decision(kind, covered, run, "test", prefixes, 0)
    if at is not None:
        log.broker_time_ms = at
    log.append([(d.key, d.to_json())])
    return d


def new_log() -> MemoryDecisionLog:
    log = MemoryDecisionLog()
    log.broker_time_ms = T0
    return log


def copy_of(log: MemoryDecisionLog) -> MemoryDecisionLog:
    """The same log, timestamps and all, to try appending something without changing ``log``."""
    twin = MemoryDecisionLog()
    twin.entries = list(log.entries)
    twin.broker_time_ms = log.broker_time_ms
    return twin


def resolve_all(log: MemoryDecisionLog, d: DecisionRecord, lost: Sequence[str] = ()) -> LogState:
    """An actor saw every transaction ``d`` rules end (committed, or lost; aborted for an ABORT)."""
    state = log.read()
    todo = {c.transactional_id: c for c in state.unresolved(d.decision_id)}
    if d.kind is Kind.COMMIT:
        out = OutcomeRecord(
            d.decision_id,
            committed=frozenset(t for t in todo if t not in lost),
            lost=tuple(LostTxn(todo[t], "the transaction was aborted") for t in sorted(todo) if t in lost),
        )
    else:
        out = OutcomeRecord(d.decision_id, aborted=frozenset(todo))
    log.append([(out.key, out.to_json())])
    return log.read()


# --- first decision wins ----------------------------------------------------------------------


def test_the_first_decision_rules_abort_then_commit() -> None:
    log = new_log()
    abort = decide(log, Kind.ABORT, cov("orders-0"), cov("orders-1"))
    commit = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"))
    state = log.read()
    assert state.ruled_by(ref("orders-0")) == abort
    assert state.ruled_by(ref("orders-1")) == abort
    assert not state.in_force(commit.decision_id)
    assert state.voided_by[commit.decision_id] == abort.decision_id
    assert abort.decision_id in state.void[commit.decision_id]


def test_the_first_decision_rules_commit_then_abort() -> None:
    log = new_log()
    commit = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"))
    abort = decide(log, Kind.ABORT, cov("orders-0"), cov("orders-1"))
    state = log.read()
    assert {state.ruling[ref("orders-0")], state.ruling[ref("orders-1")]} == {commit.decision_id}
    assert state.in_force(abort.decision_id)  # an ABORT is never void ...
    assert state.unresolved(abort.decision_id) == []  # ... but here it rules nothing


def test_a_commit_overlapping_an_earlier_decision_is_void_for_all_its_transactions() -> None:
    """One transaction already aborted: the whole COMMIT rules nothing, not the other two."""
    log = new_log()
    decide(log, Kind.ABORT, cov("orders-1"))
    commit = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"), cov("orders-2"))
    state = log.read()
    assert not state.in_force(commit.decision_id)
    assert ref("orders-0") not in state.ruling and ref("orders-2") not in state.ruling
    assert state.unresolved(commit.decision_id) == []
    assert state.run_status("orders", "run-1") is None  # a void COMMIT decides no run
    assert state.commit_of_run("run-1", [ref("orders-0"), ref("orders-1"), ref("orders-2")]) is None


def test_a_commit_overlapping_an_earlier_commit_is_void() -> None:
    log = new_log()
    first = decide(log, Kind.COMMIT, cov("orders-0"), run="run-1")
    second = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"), run="run-2")
    state = log.read()
    assert state.ruled_by(ref("orders-0")) == first
    assert state.voided_by[second.decision_id] == first.decision_id
    assert ref("orders-1") not in state.ruling


def test_an_abort_rules_only_what_no_earlier_decision_rules() -> None:
    log = new_log()
    commit = decide(log, Kind.COMMIT, cov("orders-0"))
    abort = decide(log, Kind.ABORT, cov("orders-0"), cov("orders-1"))
    later = decide(log, Kind.ABORT, cov("orders-1"), cov("orders-2"))
    state = log.read()
    assert state.ruling == {
        ref("orders-0"): commit.decision_id,
        ref("orders-1"): abort.decision_id,
        ref("orders-2"): later.decision_id,
    }
    assert [c.transactional_id for c in state.unresolved(abort.decision_id)] == ["orders-1"]


def test_a_void_commit_rules_nothing_so_a_later_commit_of_its_other_transactions_is_in_force() -> None:
    log = new_log()
    decide(log, Kind.ABORT, cov("orders-0"))
    void = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"))
    later = decide(log, Kind.COMMIT, cov("orders-1"), run="run-2")
    state = log.read()
    assert not state.in_force(void.decision_id)
    assert state.ruled_by(ref("orders-1")) == later


def test_another_epoch_or_producer_is_another_transaction() -> None:
    """POOLING reuses ids: a decision about last run's epoch says nothing about this one."""
    log = new_log()
    decide(log, Kind.ABORT, cov("orders-0", epoch=3), cov("orders-1", pid=7))
    commit = decide(log, Kind.COMMIT, cov("orders-0", epoch=4), cov("orders-1", pid=8))
    state = log.read()
    assert state.in_force(commit.decision_id)
    assert state.ruled_by(ref("orders-0", producer_epoch=4)) == commit
    assert state.ruled_by(ref("orders-1", producer_id=8)) == commit


def test_log_order_decides_not_the_writers_clock() -> None:
    log = new_log()
    a = new_decision(Kind.ABORT, [cov("orders-0")], "recovery", "recovery", (), now_ms=T0 + 1_000_000)
    c = new_decision(Kind.COMMIT, [cov("orders-0")], "run-1", "commit", ("orders",), now_ms=T0)
    log.append([(a.key, a.to_json()), (c.key, c.to_json())])
    assert log.read().ruled_by(ref("orders-0")) == a


# --- the broker's deadline ------------------------------------------------------------------


def test_a_commit_appended_after_a_deadline_is_void_for_all_its_transactions() -> None:
    log = new_log()
    commit = decide(
        log, Kind.COMMIT, cov("orders-0", deadline=T0 + 10_000), cov("orders-1", deadline=T0 + 999), at=T0 + 1_000
    )
    state = log.read()
    assert not state.in_force(commit.decision_id)
    assert "deadline" in state.void[commit.decision_id] and "orders-1" in state.void[commit.decision_id]
    assert state.ruling == {}
    assert commit.decision_id not in state.voided_by  # void by time, not by another decision


@pytest.mark.parametrize(("appended", "in_force"), [(T0 - 1, True), (T0, True), (T0 + 1, False)])
def test_the_deadline_is_compared_with_the_entry_timestamp(appended: int, in_force: bool) -> None:
    log = new_log()
    commit = decide(log, Kind.COMMIT, cov("orders-0", deadline=T0), at=appended)
    assert log.read().in_force(commit.decision_id) is in_force


def test_the_writers_clock_does_not_count_for_the_deadline() -> None:
    log = new_log()
    d = new_decision(Kind.COMMIT, [cov("orders-0", deadline=T0 + 5)], "run-1", "commit", ("orders",), T0 + 10**9)
    log.append([(d.key, d.to_json())])
    assert log.read().in_force(d.decision_id)


def test_an_unknown_deadline_never_voids_and_an_abort_is_never_late() -> None:
    log = new_log()
    commit = decide(log, Kind.COMMIT, cov("orders-0", deadline=None), at=T0 + 10**9)
    abort = decide(log, Kind.ABORT, cov("orders-1", deadline=T0), at=T0 + 10**9)
    state = log.read()
    assert state.in_force(commit.decision_id) and state.in_force(abort.decision_id)
    assert state.ruled_by(ref("orders-1")) == abort


# --- finalize: COMMIT -------------------------------------------------------------------------


def test_finalize_keeps_a_commit_while_anything_it_rules_is_unresolved() -> None:
    log = new_log()
    d = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"))
    state = log.read()
    assert finalize(state, d.decision_id, T0) == []
    partly = OutcomeRecord(d.decision_id, committed=frozenset({"orders-0"}))
    log.append([(partly.key, partly.to_json())])
    assert finalize(log.read(), d.decision_id, T0) == []


def test_finalize_of_a_commit_writes_run_records_before_its_tombstones() -> None:
    log = new_log()
    d = decide(
        log,
        Kind.COMMIT,
        cov("orders-0", records=5),
        cov("orders-1", records=7),
        cov("payments-0", records=3),
        run="dag/run-1",
    )
    state = resolve_all(log, d, lost=["payments-0"])
    items = finalize(state, d.decision_id, T0 + 42)
    keys = [k for k, _ in items]
    assert keys == [
        run_key("orders", "dag/run-1"),
        run_key("payments", "dag/run-1"),
        d.key,
        (OUTCOME_KEY + d.decision_id).encode(),
    ]
    assert [v is None for _, v in items] == [False, False, True, True]
    orders = RunRecord.from_json(items[0][1] or b"")
    payments = RunRecord.from_json(items[1][1] or b"")
    assert (orders.status, orders.transactions, orders.records, orders.decision_id, orders.lost) == (
        RunStatus.COMMITTED,
        2,
        12,
        d.decision_id,
        (),
    )
    assert (payments.status, payments.records) == (RunStatus.LOST, 3)
    assert [t.covered.transactional_id for t in payments.lost] == ["payments-0"]

    log.append(items)
    after = log.read()
    assert d.decision_id not in after.decisions and d.decision_id not in after.outcomes
    assert after.ruling == {}
    status = after.run_status("orders", "dag/run-1")
    assert status is not None and status.status is RunStatus.COMMITTED
    assert [r.prefix for r in after.lost_runs("payments")] == ["payments"]


def test_a_commit_in_force_is_a_decided_run_until_it_is_final() -> None:
    log = new_log()
    d = decide(log, Kind.COMMIT, cov("orders-0", records=4), cov("orders-1", records=6), run="r")
    status = log.read().run_status("orders", "r")
    assert status is not None
    assert (status.status, status.transactions, status.records, status.decision_id) == (
        RunStatus.DECIDED,
        2,
        10,
        d.decision_id,
    )
    assert log.read().run_status("payments", "r") is None


def test_finalize_of_a_commit_also_retires_the_decisions_it_voided() -> None:
    """Otherwise the void decision comes back into force the moment its winner is gone."""
    log = new_log()
    winner = decide(log, Kind.COMMIT, cov("orders-0"), run="run-1")
    void = decide(log, Kind.COMMIT, cov("orders-0"), cov("orders-1"), run="run-2")
    state = resolve_all(log, winner)
    items = finalize(state, winner.decision_id, T0)
    tombstoned = [k for k, v in items if v is None]
    assert void.key in tombstoned and (OUTCOME_KEY + void.decision_id).encode() in tombstoned
    assert tombstoned.index(void.key) < tombstoned.index(winner.key)

    revived = copy_of(log)
    revived.append([(k, v) for k, v in items if k != void.key])
    assert revived.read().in_force(void.decision_id), "the rule this tombstone exists for"

    log.append(items)
    after = log.read()
    assert void.decision_id not in after.decisions
    assert after.ruling == {}


def test_finalize_of_a_void_decision_only_removes_it() -> None:
    log = new_log()
    decide(log, Kind.ABORT, cov("orders-0"))
    void = decide(log, Kind.COMMIT, cov("orders-0"))
    assert finalize(log.read(), void.decision_id, T0) == [
        (void.key, None),
        ((OUTCOME_KEY + void.decision_id).encode(), None),
    ]


# --- finalize: ABORT --------------------------------------------------------------------------


def test_an_abort_is_kept_until_the_broker_passes_its_deadlines_plus_the_slack() -> None:
    log = new_log()
    deadline = T0 + 60_000
    d = decide(log, Kind.ABORT, cov("orders-0", deadline=deadline), cov("orders-1", deadline=deadline - 5))
    state = resolve_all(log, d)
    assert finalize(state, d.decision_id, T0) == []

    log.broker_time_ms = deadline + ABORT_RETENTION_SLACK_MS - 1
    log.append([(b"kafka2pc.prefix:x", json.dumps({"owner": "o"}).encode())])  # the broker clock moves
    assert finalize(log.read(), d.decision_id, T0) == []

    log.broker_time_ms = deadline + ABORT_RETENTION_SLACK_MS
    log.append([(b"kafka2pc.prefix:y", json.dumps({"owner": "o"}).encode())])
    assert finalize(log.read(), d.decision_id, T0) == [(d.key, None), ((OUTCOME_KEY + d.decision_id).encode(), None)]


def test_an_abort_of_unknown_deadline_is_kept_from_its_own_append_time() -> None:
    log = new_log()
    d = decide(log, Kind.ABORT, cov("orders-0"), at=T0 + 7)
    state = resolve_all(log, d)
    state.broker_time_ms = T0 + 7 + ABORT_RETENTION_SLACK_MS - 1
    assert finalize(state, d.decision_id, T0) == []
    state.broker_time_ms += 1
    assert finalize(state, d.decision_id, T0) != []


def test_an_unresolved_abort_is_kept_whatever_the_time() -> None:
    log = new_log()
    d = decide(log, Kind.ABORT, cov("orders-0", deadline=T0))
    state = log.read()
    state.broker_time_ms = T0 + 10**9
    assert finalize(state, d.decision_id, T0) == []


def test_once_an_abort_is_retired_a_late_commit_is_still_void() -> None:
    """The reason retention is enough: after it, any COMMIT for those transactions is late."""
    log = new_log()
    deadline = T0 + 60_000
    abort = decide(log, Kind.ABORT, cov("orders-0", deadline=deadline))
    void = decide(log, Kind.COMMIT, cov("orders-0", deadline=deadline))
    resolve_all(log, abort)
    log.broker_time_ms = deadline + ABORT_RETENTION_SLACK_MS
    log.append([(b"kafka2pc.prefix:x", json.dumps({"owner": "o"}).encode())])
    items = finalize(log.read(), abort.decision_id, T0)
    assert (void.key, None) in items  # the COMMIT it voided goes with it
    log.append(items)
    late = decide(log, Kind.COMMIT, cov("orders-0", deadline=deadline), run="run-9")
    state = log.read()
    assert not state.in_force(late.decision_id)
    assert state.ruling == {}


# --- compaction changes no answer (property-style) ---------------------------------------------

TIDS = ["orders-0", "orders-1", "orders-2", "payments-0", "payments-1"]
RUNS = ["run-1", "run-2", "run-3"]


def _view(state: LogState) -> tuple[object, ...]:
    statuses = {
        (p, r): state.run_status(p, r) for p in ("orders", "payments") for r in RUNS
    }  # DECIDED ones derived from live COMMITs included
    return (
        dict(state.ruling),
        sorted(state.decisions),
        dict(state.void),
        dict(state.outcomes),
        dict(state.runs),
        statuses,
    )


def _random_step(rng: random.Random, log: MemoryDecisionLog, clock: list[int]) -> None:
    clock[0] += rng.randint(0, 30_000)
    log.broker_time_ms = clock[0]
    op = rng.random()
    if op < 0.45:
        kind = Kind.COMMIT if rng.random() < 0.6 else Kind.ABORT
        txns = rng.sample(TIDS, rng.randint(1, 3))
        deadline = None if rng.random() < 0.2 else clock[0] + rng.randint(-20_000, 120_000)
        covered = [cov(t, epoch=rng.randint(0, 1), deadline=deadline, records=rng.randint(0, 9)) for t in txns]
        decide(log, kind, *covered, run=rng.choice(RUNS))
    elif op < 0.85:
        state = log.read()
        live = [did for did in state.decisions if state.in_force(did) or rng.random() < 0.2]
        if not live:
            return
        did = rng.choice(live)
        d = state.decisions[did]
        todo = state.unresolved(did) if state.in_force(did) else []
        if todo:
            picks = rng.sample(todo, rng.randint(1, len(todo)))
            if d.kind is Kind.COMMIT:
                lost = [c for c in picks if rng.random() < 0.2]
                out = OutcomeRecord(
                    did,
                    committed=frozenset(c.transactional_id for c in picks if c not in lost),
                    lost=tuple(LostTxn(c, "aborted") for c in lost),
                )
            else:
                out = OutcomeRecord(did, aborted=frozenset(c.transactional_id for c in picks))
            merged = state.outcome(did).merge(out)
            log.append([(merged.key, merged.to_json())])
            state = log.read()
        if rng.random() < 0.3:
            clock[0] += ABORT_RETENTION_SLACK_MS + 200_000
            log.broker_time_ms = clock[0]
            log.append([(b"kafka2pc.prefix:tick", json.dumps({"owner": "clock"}).encode())])
            state = log.read()
        items = finalize(state, did, clock[0])
        if items:
            log.append(items)
            log.read()  # the writer's re-read (``ruling.obey``): a run record that came too late is settled
    elif op < 0.92:
        tid = rng.choice(TIDS)
        log.append(
            [legacy_record(tid, rng.choice(["COMMIT", "COMMITTED", "ABORTED"]), producer_epoch=rng.randint(0, 1))]
        )
    else:
        log.compact()


@pytest.mark.parametrize("seed", range(40))
def test_replay_gives_the_same_answers_before_and_after_compaction(seed: int) -> None:
    rng = random.Random(seed)
    log = new_log()
    clock = [T0]
    for _ in range(60):
        _random_step(rng, log, clock)
        before = replay(log.scan())
        compacted = copy_of(log)
        compacted.compact()
        after = replay(compacted.scan())
        assert _view(before) == _view(after)


def test_retiring_a_decision_changes_no_ruling_but_its_own() -> None:
    """Whatever was appended before, finalize's records leave every other transaction's ruling alone."""
    checked = 0
    for seed in range(40):
        checked += _retire_and_compare(random.Random(1000 + seed))
    assert checked > 40


def _retire_and_compare(rng: random.Random) -> int:
    log = new_log()
    clock = [T0]
    checked = 0
    for _ in range(60):
        _random_step(rng, log, clock)
        state = log.read()
        for did in [d for d in state.decisions if state.in_force(d)]:
            d = state.decisions[did]
            if state.unresolved(did):
                continue
            items = finalize(state, did, clock[0])
            if not items:
                continue
            mine = {c.ref for c in d.txns}
            for vid, by in state.voided_by.items():
                if by == did:
                    mine |= {c.ref for c in state.decisions[vid].txns}
            trial = copy_of(log)
            trial.append(items)
            after = trial.read()
            assert {r: x for r, x in after.ruling.items() if r not in mine} == {
                r: x for r, x in state.ruling.items() if r not in mine
            }
            for other in state.decisions:
                if other != did and state.voided_by.get(other) != did:
                    assert after.in_force(other) is state.in_force(other)
            checked += 1
    return checked


# --- 0.1.0 records ----------------------------------------------------------------------------


def test_a_legacy_commit_is_a_live_decision() -> None:
    log = MemoryDecisionLog(initial=[legacy_record("orders-0", "COMMIT", producer_epoch=5, run="run-7")])
    state = log.read()
    d = state.ruled_by(ref("orders-0", producer_epoch=5))
    assert d is not None and d.kind is Kind.COMMIT and d.run == "run-7" and d.actor == "0.1.0"
    assert state.ruled_by(ref("orders-0", producer_epoch=4)) is None


@pytest.mark.parametrize("final", ["COMMITTED", "ABORTED", "LOST"])
def test_legacy_final_records_are_not_decisions(final: str) -> None:
    state = MemoryDecisionLog(initial=[legacy_record("orders-0", final)]).read()
    assert state.decisions == {} and state.ruling == {}


@pytest.mark.parametrize(
    ("sequence", "live"),
    [
        (["COMMIT", "COMMITTED"], False),
        (["COMMIT", "ABORTED"], False),
        (["COMMITTED", "COMMIT"], True),
        (["COMMIT", "COMMIT"], True),
    ],
)
def test_the_latest_legacy_record_per_id_counts(sequence: list[str], live: bool) -> None:
    log = MemoryDecisionLog(initial=[legacy_record("orders-0", s) for s in sequence])
    assert (ref("orders-0") in log.read().ruling) is live
    log.compact()
    assert (ref("orders-0") in log.read().ruling) is live


def test_a_legacy_commit_comes_first_and_a_new_abort_of_it_rules_nothing() -> None:
    log = MemoryDecisionLog(initial=[legacy_record("orders-0", "COMMIT")])
    decide(log, Kind.ABORT, cov("orders-0"))
    assert log.read().ruled_by(ref("orders-0")).decision_id == "v1.orders-0"  # type: ignore[union-attr]


def test_finalize_of_a_legacy_commit_tombstones_its_per_id_record_and_outcome() -> None:
    log = MemoryDecisionLog(initial=[legacy_record("orders-0", "COMMIT")])
    state = log.read()
    out = OutcomeRecord("v1.orders-0", committed=frozenset({"orders-0"}))
    log.append([(out.key, out.to_json())])
    items = finalize(log.read(), "v1.orders-0", T0)
    assert items == [(b"orders-0", None), ((OUTCOME_KEY + "v1.orders-0").encode(), None)]
    assert state.decisions["v1.orders-0"].prefixes == ()  # no run record: 0.1.0 knew no runs
    log.append(items)
    after = log.read()
    assert after.decisions == {} and after.outcomes == {}


def test_a_lost_legacy_commit_is_kept_to_stay_loud() -> None:
    log = MemoryDecisionLog(initial=[legacy_record("orders-0", "COMMIT")])
    c = log.read().decisions["v1.orders-0"].txns[0]
    out = OutcomeRecord("v1.orders-0", lost=(LostTxn(c, "the transaction was aborted"),))
    log.append([(out.key, out.to_json())])
    assert finalize(log.read(), "v1.orders-0", T0) == []


def test_a_legacy_run_mark_reads_as_decided() -> None:
    mark = {"prefix": "orders", "run": "dag/run-1", "at_ms": T0, "txns": 3, "records": 30}
    log = MemoryDecisionLog(initial=[(run_key("orders", "dag/run-1"), json.dumps(mark).encode())])
    state = log.read()
    rec = state.run_status("orders", "dag/run-1")
    assert rec is not None
    assert (rec.status, rec.transactions, rec.records, rec.decision_id, rec.lost) == (RunStatus.DECIDED, 3, 30, "", ())
    assert state.lost_runs("orders") == []


def test_a_run_record_replaces_the_legacy_mark_of_the_same_run() -> None:
    mark = {"prefix": "orders", "run": "r", "at_ms": T0, "txns": 1, "records": 1}
    done = RunRecord("orders", "r", RunStatus.COMMITTED, 1, 1, T0 + 1, "d")
    log = MemoryDecisionLog(initial=[(run_key("orders", "r"), json.dumps(mark).encode()), (done.key, done.to_json())])
    assert log.read().runs[("orders", "r")] == done


def test_keep_run_filters_run_records_only() -> None:
    recs = [RunRecord("orders", f"run-{i}", RunStatus.COMMITTED, 1, 1, T0) for i in range(3)]
    log = MemoryDecisionLog(initial=[(r.key, r.to_json()) for r in recs])
    d = decide(log, Kind.COMMIT, cov("orders-0"), run="run-9")
    state = log.read(keep_run=lambda p, r, raw: r == "run-1")
    assert list(state.runs) == [("orders", "run-1")]
    assert state.in_force(d.decision_id)


def test_a_tombstoned_run_record_is_gone() -> None:
    rec = RunRecord("orders", "r", RunStatus.LOST, 1, 1, T0)
    log = MemoryDecisionLog(initial=[(rec.key, rec.to_json()), (rec.key, None)])
    assert log.read().runs == {}


# --- the topic's settings ---------------------------------------------------------------------

SAFE = {
    "cleanup.policy": "compact",
    "message.timestamp.type": "LogAppendTime",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
}


def test_safe_topic_settings_pass() -> None:
    check_topic_settings("decisions", SAFE, 2, 3, 3)  # as kafka2pc creates it: the protocol and the history
    check_topic_settings("decisions", SAFE, 1, 3, 3)  # as 0.1.0 made it
    check_topic_settings("decisions", {**SAFE, "min.insync.replicas": "1"}, 1, 1, 1)  # a one-broker dev cluster


@pytest.mark.parametrize(
    ("change", "partitions", "rf", "brokers", "named"),
    [
        ({"cleanup.policy": "delete"}, 1, 3, 3, "cleanup.policy=delete"),
        ({"cleanup.policy": "compact,delete"}, 1, 3, 3, "cleanup.policy=compact,delete"),
        ({"cleanup.policy": None}, 1, 3, 3, "cleanup.policy=None"),
        ({}, 3, 3, 3, "3 partitions"),
        ({}, 0, 3, 3, "0 partitions"),
        ({"message.timestamp.type": "CreateTime"}, 1, 3, 3, "message.timestamp.type=CreateTime"),
        ({}, 1, 2, 5, "replication factor 2 on a 5-broker cluster"),
        ({}, 1, 1, 2, "replication factor 1 on a 2-broker cluster"),
        ({"min.insync.replicas": "1"}, 1, 3, 3, "min.insync.replicas=1"),
        ({"min.insync.replicas": None}, 1, 3, 3, "min.insync.replicas=1"),
        ({"unclean.leader.election.enable": "true"}, 1, 3, 3, "unclean.leader.election.enable=true"),
    ],
)
def test_unsafe_topic_settings_are_refused_by_name(
    change: dict[str, str | None], partitions: int, rf: int, brokers: int, named: str
) -> None:
    with pytest.raises(UnsafeDecisionTopicError) as info:
        check_topic_settings("decisions", {**SAFE, **change}, partitions, rf, brokers)
    message = str(info.value)
    assert named in message
    assert "'decisions'" in message and "kafka-configs.sh" in message


def test_every_problem_is_named_at_once() -> None:
    bad = {"cleanup.policy": "delete", "message.timestamp.type": "CreateTime", "min.insync.replicas": "1"}
    with pytest.raises(UnsafeDecisionTopicError) as info:
        check_topic_settings("decisions", bad, 3, 2, 3)
    message = str(info.value)
    for named in (
        "cleanup.policy=delete",
        "3 partitions",
        "CreateTime",
        "replication factor 2",
        "min.insync.replicas=1",
    ):
        assert named in message


# --- records ----------------------------------------------------------------------------------


def test_entries_with_the_same_offset_order_do_not_matter_for_run_records() -> None:
    """Run records are read in log order: the last one per key wins."""
    a = RunRecord("orders", "r", RunStatus.LOST, 1, 1, T0)
    b = RunRecord("orders", "r", RunStatus.ACKNOWLEDGED, 1, 1, T0 + 1, note="re-exported")
    state = replay([Entry(0, T0, a.key, a.to_json()), Entry(1, T0, b.key, b.to_json())])
    assert state.runs[("orders", "r")] == b
    assert state.lost_runs("orders") == []


# -- a Kafka source's position (KIP-447) -----------------------------------------------------------


def _sourced_commit(log: MemoryDecisionLog, run: str, end: int) -> DecisionRecord:
    from airflow_provider_kafka2pc.txn.protocol.source_range import PartitionRange, SourceRange

    source = SourceRange("g", (PartitionRange("raw", 0, end - 5, end, end - 5),))
    covered = (cov("orders-0", records=5), cov("orders-offsets", records=0))
    d = new_decision(Kind.COMMIT, covered, run, "test", ["orders"], 0, {"orders": source})
    log.append([(d.key, d.to_json())])
    return d


def test_a_sourced_commit_carries_its_range_into_the_run_record_and_the_exporter_s_position() -> None:
    log = new_log()
    first = _sourced_commit(log, "dag/run-1", 10)
    assert DecisionRecord.from_json(first.to_json()) == first
    assert log.read().last_source("orders").run == "dag/run-1"  # decided, not yet final
    log.append(finalize(resolve_all(log, first), first.decision_id, T0 + 1))
    second = _sourced_commit(log, "dag/run-2", 20)
    log.append(finalize(resolve_all(log, second), second.decision_id, T0 + 2))
    log.compact()
    state = log.read()
    position = state.last_source("orders")
    assert position is not None and position.run == "dag/run-2" and position.source is not None
    assert position.source.ends() == {("raw", 0): 20}
    assert state.last_source("payments") is None


def test_a_run_with_a_loss_is_the_position_marked_lost_so_that_the_next_run_names_it() -> None:
    log = new_log()
    first = _sourced_commit(log, "dag/run-1", 10)
    log.append(finalize(resolve_all(log, first), first.decision_id, T0 + 1))
    second = _sourced_commit(log, "dag/run-2", 20)
    items = finalize(resolve_all(log, second, lost=["orders-offsets"]), second.decision_id, T0 + 2)
    log.append(items)
    position = log.read().last_source("orders")
    assert position is not None and (position.run, position.status) == ("dag/run-2", RunStatus.LOST)
    log.append([(b"kafka2pc.position:orders", None)])  # a tombstone drops it, as compaction would
    assert log.read().last_source("orders") is None
