"""The repair's part of the decision protocol, replayed from logs written by hand: one repair per
run wins, whatever interleaving the log shows and whatever run records a reader keeps; a final
repair leaves REPAIRED (or LOST with what is still missing); the digest compares multisets."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_kafka2pc.txn.protocol.decisions import finalize, replay
from airflow_provider_kafka2pc.txn.protocol.errors import NotLostError, RepairRefusedError
from airflow_provider_kafka2pc.txn.protocol.record_digest import RecordDigest, describe_difference
from airflow_provider_kafka2pc.txn.protocol.records import (
    OUTCOME_KEY,
    Covered,
    DecisionRecord,
    Entry,
    Kind,
    LostTxn,
    OutcomeRecord,
    Repair,
    RunRecord,
    RunStatus,
    new_decision,
    repair_claim_key,
)
from airflow_provider_kafka2pc.txn.protocol.source_range import PartitionRange, SourceRange
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import attempts_of, plan_repair

RUN = "dag/manual__2026-11-28T10:00:00+00:00"
KEY = attempts_of(RUN) + "0a1b2c3d"


def _digest(slot: int) -> str:
    return RecordDigest().add_all((f"k{slot}-{i}".encode(), b"v") for i in range(10)).text()


def _lost(slot: int, tid: str = "") -> LostTxn:
    c = Covered(tid or f"orders-{slot}", 7, 0, 10, (f"events-{slot}",), 1_000, _digest(slot))
    return LostTxn(c, "aborted by the broker on timeout")


LOST_RUN = RunRecord("orders", RUN, RunStatus.LOST, 4, 40, 5_000, "d-original", (_lost(1), _lost(3)))


def _repair(attempt: str = KEY, slots: tuple[int, ...] = (1, 3), run: RunRecord = LOST_RUN) -> DecisionRecord:
    txns = [Covered(f"orders-{attempt}-{s}", 90 + s, 0, 10, (f"events-{s}",), None, _digest(s)) for s in slots]
    return new_decision(Kind.COMMIT, txns, RUN, "repair", ["orders"], 6_000, repairs=run)


class Log:
    """A hand-written log of the protocol's partition."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def put(self, key: bytes, value: bytes | None) -> None:
        self.entries.append(Entry(len(self.entries), 10_000 + len(self.entries), key, value))

    def decide(self, d: DecisionRecord) -> None:
        self.put(d.key, d.to_json())

    def committed(self, d: DecisionRecord, lost: tuple[str, ...] = ()) -> None:
        by_tid = {c.transactional_id: c for c in d.txns}
        o = OutcomeRecord(
            d.decision_id,
            frozenset(t for t in by_tid if t not in lost),
            frozenset(),
            tuple(LostTxn(by_tid[t], "aborted by the broker on timeout") for t in lost),
        )
        self.put(o.key, o.to_json())


def _seeded() -> Log:
    log = Log()
    log.put(LOST_RUN.key, LOST_RUN.to_json())
    return log


def test_records_carry_digests_repairs_and_read_the_old_lost_layout() -> None:
    d = _repair()
    assert DecisionRecord.from_json(d.to_json()) == d
    assert d.repair_key == ("orders", RUN, 1)
    rec = dataclasses.replace(
        LOST_RUN, status=RunStatus.REPAIRED, repair=Repair(d.decision_id, "repair", 7, 2, 20, 20, 1)
    )
    assert RunRecord.from_json(rec.to_json()) == rec
    # A lost transaction as the version before digests wrote it: 6 fields and the reason.
    old = LostTxn.from_list(["orders-1", 7, 0, 10, 1_000, ["events-1"], "timed out"])
    assert (old.covered.digest, old.reason) == (None, "timed out")
    assert LostTxn.from_list(_lost(1).to_list()) == _lost(1)


def test_the_first_repair_wins_and_a_later_one_is_void() -> None:
    log, first, second = _seeded(), _repair(), _repair(attempts_of(RUN) + "ffff0000")
    log.decide(first)
    log.decide(second)
    state = replay(log.entries)
    assert state.in_force(first.decision_id) and not state.in_force(second.decision_id)
    assert state.voided_by[second.decision_id] == first.decision_id
    assert state.repair_of("orders", RUN) == first
    # The winner is final once its transactions committed: REPAIRED, and the void one goes with it.
    log.committed(first)
    state = replay(log.entries)
    items = finalize(state, first.decision_id, 20_000)
    keys = [k for k, _ in items]
    assert LOST_RUN.key in keys and second.key in keys and first.key in keys
    assert keys.index(repair_claim_key("orders", RUN, 1)) < keys.index(first.key)  # the claim before the retirement
    value = dict(items)[LOST_RUN.key]
    assert value is not None
    rec = RunRecord.from_json(value)
    assert (rec.status, rec.transactions, rec.records, rec.decision_id) == (RunStatus.REPAIRED, 4, 40, "d-original")
    assert rec.repair == Repair(first.decision_id, "repair", 20_000, 2, 20, 20, 1)
    assert rec.lost == LOST_RUN.lost  # what was lost stays on the record


def test_a_repair_appended_after_the_winner_is_final_stays_void_for_every_reader() -> None:
    """Interleaving: a second repair lands after the first, the finalizer never saw it (no tombstone
    for it), the first's decision is gone. The REPAIRED record still voids it, even for a reader
    that keeps no run record of that run."""
    log, first, second, third = _seeded(), _repair(), _repair(attempts_of(RUN) + "00000002"), _repair("x")
    log.decide(first)
    log.committed(first)
    log.decide(second)  # void while the first lives
    state = replay(log.entries[:3])  # the finalizer read before the second arrived
    for key, value in finalize(state, first.decision_id, 20_000):
        log.put(key, value)
    log.decide(third)  # after everything
    for keep in (None, lambda p, r, raw: False):
        state = replay(log.entries, keep_run=keep)
        assert first.decision_id not in state.decisions
        assert not state.in_force(second.decision_id) and not state.in_force(third.decision_id)
        assert state.void[third.decision_id] == f"repair 1 of the run was decision {first.decision_id}"
        assert state.repair_claims[("orders", RUN, 1)] == first.decision_id


def test_a_repair_that_loses_a_slot_again_leaves_the_run_lost_with_only_that_slot() -> None:
    log, rep = _seeded(), _repair()
    log.decide(rep)
    log.committed(rep, lost=(f"orders-{KEY}-3",))
    state = replay(log.entries)
    value = dict(finalize(state, rep.decision_id, 20_000))[LOST_RUN.key]
    assert value is not None
    rec = RunRecord.from_json(value)
    assert rec.status is RunStatus.LOST and [t.covered.transactional_id for t in rec.lost] == ["orders-3"]
    assert rec.repair is not None and (rec.repair.restored, rec.repair.generation) == (10, 1)
    # A next repair may go on: no REPAIRED record, the void rules do not apply.
    log.put(rec.key, value)
    log.put(rep.key, None)
    log.put(OUTCOME_KEY.encode() + rep.decision_id.encode(), None)
    again = _repair("y", slots=(3,), run=rec)
    assert again.repair_key == ("orders", RUN, 2)
    log.decide(again)
    assert replay(log.entries).in_force(again.decision_id)
    log.committed(again)
    value = dict(finalize(replay(log.entries), again.decision_id, 30_000))[LOST_RUN.key]
    assert value is not None
    done = RunRecord.from_json(value)
    assert done.status is RunStatus.REPAIRED and done.repair is not None
    # Restored counts both repairs; the losses listed are those the last one found missing.
    assert (done.repair.restored, done.repair.generation, done.lost) == (20, 2, (_lost(3),))


def _finalized(log: Log, d: DecisionRecord, lost: tuple[str, ...] = (), at: int = 20_000) -> RunRecord:
    """``d`` committed (``lost`` lost) and retired as its own actor does: outcome, then finalize."""
    log.committed(d, lost)
    items = finalize(replay(log.entries), d.decision_id, at)
    for key, value in items:
        log.put(key, value)
    value = dict(items)[LOST_RUN.key]
    assert value is not None
    return RunRecord.from_json(value)


def test_a_repair_planned_before_another_lost_a_slot_again_is_void() -> None:
    """Review finding: the second repair read the run LOST with slots 1 and 3; meanwhile the first
    committed slot 1 and lost slot 3, and is retired. The second must not commit slot 1 again."""
    log, first, stale = _seeded(), _repair(), _repair(attempts_of(RUN) + "00000002")
    log.decide(first)
    after = _finalized(log, first, lost=(f"orders-{KEY}-3",))
    assert after.status is RunStatus.LOST
    log.decide(stale)
    state = replay(log.entries)
    assert not state.in_force(stale.decision_id)
    assert state.void[stale.decision_id] == f"repair 1 of the run was decision {first.decision_id}"


def test_a_repair_void_while_the_winner_lived_stays_void_when_the_winner_loses_again() -> None:
    log, first, second = _seeded(), _repair(), _repair(attempts_of(RUN) + "00000002")
    log.decide(first)
    log.decide(second)  # void: the first came first
    log.committed(first, lost=(f"orders-{KEY}-3",))
    # The first's actor retires it with the state it read back at its decision: it never saw the second.
    early = replay(log.entries[:2] + log.entries[3:])
    for key, value in finalize(early, first.decision_id, 20_000):
        log.put(key, value)
    state = replay(log.entries)
    assert first.decision_id not in state.decisions and second.decision_id in state.decisions
    assert not state.in_force(second.decision_id)


def test_a_stale_run_record_written_after_the_repair_cannot_start_another() -> None:
    """A stalled actor's late finalize (or an acknowledgement that read LOST) rewrites the run
    record as it was before the repair; a repair planned from it claims a taken generation."""
    log, first = _seeded(), _repair()
    log.decide(first)
    assert _finalized(log, first).status is RunStatus.REPAIRED
    log.put(LOST_RUN.key, LOST_RUN.to_json())  # the stale record, now the latest
    state = replay(log.entries)
    assert plan_repair(state, "orders", RUN, "z").status is RunStatus.REPAIRED  # type: ignore[union-attr]
    assert state.overruled == {("orders", RUN): RunStatus.LOST}  # came too late: its writer writes REPAIRED again
    # Compacted before anyone settled it, only the stale record is left of the key:
    repaired = next(e for e in log.entries if e.key == LOST_RUN.key and b'"REPAIRED"' in (e.value or b""))
    log.entries.remove(repaired)
    plan = plan_repair(replay(log.entries), "orders", RUN, "z")
    assert not isinstance(plan, RunRecord)  # it looks LOST again...
    again = _repair("z")
    log.decide(again)
    assert not replay(log.entries).in_force(again.decision_id)  # ...but generation 1 is taken


def test_an_acknowledged_loss_is_not_repaired() -> None:
    acked = dataclasses.replace(LOST_RUN, status=RunStatus.ACKNOWLEDGED, note="re-exported by hand")
    with pytest.raises(NotLostError, match=r"acknowledged .* a repair could duplicate it"):
        plan_repair(replay([Entry(0, 1, acked.key, acked.to_json())]), "orders", RUN, KEY)


def test_a_repair_moves_the_source_position_only_if_its_run_is_the_latest() -> None:
    source = SourceRange("g", (PartitionRange("src", 0, 0, 100, 0),))
    lost = dataclasses.replace(LOST_RUN, source=source)
    for latest_run, moved in ((RUN, True), ("dag/a-later-run", False)):
        log = Log()
        log.put(lost.key, lost.to_json())
        latest = dataclasses.replace(lost, run=latest_run)
        log.put(b"kafka2pc.position:orders", latest.to_json())
        rep = _repair(run=lost)
        log.decide(rep)
        log.committed(rep)
        keys = [k for k, _ in finalize(replay(log.entries), rep.decision_id, 20_000)]
        assert (b"kafka2pc.position:orders" in keys) is moved, latest_run


def test_plan_repair_refuses_what_it_cannot_prove_and_answers_a_repaired_run() -> None:
    log = _seeded()
    plan = plan_repair(replay(log.entries), "orders", RUN, KEY)
    assert not isinstance(plan, RunRecord)
    assert plan.slots == (1, 3) and plan.transactional_id(3) == f"orders-{KEY}-3"
    committed = dataclasses.replace(LOST_RUN, status=RunStatus.COMMITTED, lost=())
    with pytest.raises(NotLostError, match="is COMMITTED: nothing of it was lost"):
        plan_repair(replay([Entry(0, 1, committed.key, committed.to_json())]), "orders", RUN, KEY)
    with pytest.raises(NotLostError, match="has no final run record"):
        plan_repair(replay([]), "orders", RUN, KEY)
    no_digest = dataclasses.replace(
        LOST_RUN, lost=(LostTxn(dataclasses.replace(_lost(1).covered, digest=None), "timed out"),)
    )
    with pytest.raises(RepairRefusedError, match="orders-1 carry no digest"):
        plan_repair(replay([Entry(0, 1, no_digest.key, no_digest.to_json())]), "orders", RUN, KEY)
    offsets = dataclasses.replace(LOST_RUN, lost=(_lost(0, "orders-offsets"),))
    with pytest.raises(RepairRefusedError, match="lost its consumer-offsets participant"):
        plan_repair(replay([Entry(0, 1, offsets.key, offsets.to_json())]), "orders", RUN, KEY)
    repaired = dataclasses.replace(LOST_RUN, status=RunStatus.REPAIRED, repair=Repair("r", "repair", 1, 2, 20, 20, 1))
    assert plan_repair(replay([Entry(0, 1, repaired.key, repaired.to_json())]), "orders", RUN, KEY) == repaired


def test_the_digest_is_of_the_multiset_and_names_the_difference() -> None:
    records = [(b"a", b"1"), (b"b", None), (None, b"")]
    forward, backward = RecordDigest().add_all(records), RecordDigest().add_all(reversed(records))
    assert forward.text() == backward.text() and forward.text().startswith("b2sum64:3:")
    assert RecordDigest().add_all([(b"a", b"")]).text() != RecordDigest().add_all([(b"a", None)]).text()
    assert RecordDigest().add_all([(b"ab", b"c")]).text() != RecordDigest().add_all([(b"a", b"bc")]).text()
    changed = RecordDigest().add_all([(b"a", b"1"), (b"b", None), (None, b"x")]).text()
    assert "different keys or values" in describe_difference(forward.text(), changed)
    assert describe_difference(forward.text(), RecordDigest().add_all(records[:2]).text()) == (
        "3 records were exported, 2 now"
    )


def test_the_writer_sums_spark_s_hash_column_modulo_2_64_and_drops_it_before_producing() -> None:
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.protocol.record_digest import SPARK_SCHEME, split_digest
    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import DIGEST_COLUMN, _take_digest

    hashes = [-1, 2**63 - 1, -(2**63), 5, 0]  # Spark's xxhash64 is a signed long
    batch = pa.RecordBatch.from_pydict(
        {"key": [b"a"] * 5, "value": [b"v"] * 5, DIGEST_COLUMN: pa.array(hashes, pa.int64())}
    )
    digest = RecordDigest(scheme=SPARK_SCHEME)
    out = _take_digest(batch, digest)
    _take_digest(batch.slice(0, 2), digest)
    assert out.schema.names == ["key", "value"] and out.num_rows == 5
    unsigned = sum(h % 2**64 for h in hashes + hashes[:2]) % 2**64
    assert digest.text() == f"xxh64t:7:{unsigned:016x}"
    assert split_digest(digest.text()) == ("xxh64t", 7, unsigned)
    assert split_digest("xxh64:7") is None and split_digest("xxh64:x:00") is None
    plain = pa.RecordBatch.from_pydict({"value": [b"v"]})
    assert _take_digest(plain, digest) is plain and digest.count == 7


def test_a_recovery_that_spares_a_run_does_not_fail_on_its_loss_but_says_it_is_left_to_its_repair() -> None:
    """The recovery sensor of a cleared LOST run: its own loss goes to its export task, another run's fails."""
    from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
    from tests.unit.fakes import FakeBroker, MemoryDecisionLog

    wire, log = FakeBroker(), MemoryDecisionLog(initial=[(LOST_RUN.key, LOST_RUN.to_json())])
    with pytest.raises(TransactionLostError):
        recover(wire, "orders", log, run="next")
    result = recover(wire, "orders", log, run=RUN, spare=RUN)
    assert result.done and not result.lost
    assert [v.run for v in result.spared] == [RUN]
    assert "left to this run's export task, which repairs it" in result.describe()
    with pytest.raises(TransactionLostError):
        recover(wire, "orders", log, run="other", spare="dag/another-run")
