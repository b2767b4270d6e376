"""A run's record in effect is the highest-ranked of the records read, in any order, so that neither a
late record nor compaction can overturn it (``txn.protocol.run_history``, DESIGN §15)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from airflow_provider_kafka2pc.txn.protocol.decisions import replay
from airflow_provider_kafka2pc.txn.protocol.errors import NotLostError
from airflow_provider_kafka2pc.txn.protocol.records import Entry, Repair, RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.run_history import history_key
from airflow_provider_kafka2pc.txn.two_phase.recovery import acknowledge_loss
from tests.unit.fakes import MemoryDecisionLog
from tests.unit.test_repair_rules import LOST_RUN, _repair

COMMITTED = dataclasses.replace(LOST_RUN, status=RunStatus.COMMITTED, lost=())
ACKED = dataclasses.replace(LOST_RUN, status=RunStatus.ACKNOWLEDGED, note="dealt with")
REPAIR = Repair("d-repair", "repair", 7_000, 2, 20, 20, 1)
REPAIRED = dataclasses.replace(LOST_RUN, status=RunStatus.REPAIRED, repair=REPAIR)
LOST_AGAIN = dataclasses.replace(LOST_RUN, repair=dataclasses.replace(REPAIR, restored=10))


def _entries(*records: tuple[int, RunRecord | None]) -> list[Entry]:
    key = LOST_RUN.key
    return [Entry(i, i, key, None if r is None else r.to_json(), p) for i, (p, r) in enumerate(records)]


@pytest.mark.parametrize(
    ("order", "expected", "late"),
    [
        ((COMMITTED, LOST_RUN), RunStatus.COMMITTED, True),  # the zombie of issue 46
        ((LOST_RUN, REPAIRED, LOST_RUN), RunStatus.REPAIRED, True),  # a stale finalize after the repair
        ((LOST_RUN, ACKED, LOST_RUN), RunStatus.ACKNOWLEDGED, True),
        ((LOST_RUN, ACKED, REPAIRED), RunStatus.REPAIRED, False),  # a repair decided before the acknowledgement
        ((LOST_RUN, REPAIRED, ACKED), RunStatus.REPAIRED, True),
        ((LOST_RUN, LOST_AGAIN, LOST_RUN), RunStatus.LOST, True),  # generation 0 after generation 1
        ((LOST_RUN, LOST_AGAIN, REPAIRED), RunStatus.REPAIRED, False),
        # Written only on proof that every transaction committed: against a LOST, it is the fact.
        ((LOST_RUN, COMMITTED, COMMITTED), RunStatus.COMMITTED, False),
        ((LOST_RUN, LOST_AGAIN, ACKED), RunStatus.LOST, True),  # an acknowledgement of the earlier loss: stale
        ((LOST_RUN, ACKED, LOST_AGAIN), RunStatus.LOST, False),  # a repair decided before it lost again
        ((LOST_RUN,), RunStatus.LOST, False),
    ],
)
def test_the_highest_ranked_record_holds_whatever_comes_later(
    order: tuple[RunRecord, ...], expected: RunStatus, late: bool
) -> None:
    state = replay(_entries(*((1, r) for r in order)))
    assert state.runs[("orders", LOST_RUN.run)].status is expected
    assert bool(state.overruled) is late


RECORDS = (LOST_RUN, ACKED, LOST_AGAIN, REPAIRED, COMMITTED)


@pytest.mark.parametrize("size", [2, 3])
def test_the_record_in_effect_is_the_same_in_every_order_in_the_history(size: int) -> None:
    """Compaction keeps each history key's latest value and drops the rest, and the order of what is
    left is not the order of writing: the record in effect depends on neither."""
    for chosen in itertools.combinations(RECORDS, size):
        results = set()
        for order in itertools.permutations(chosen):
            entries = [Entry(i, i, history_key(r.key, r.to_json()), r.to_json(), 1) for i, r in enumerate(order)]
            state = replay(entries)
            results.add(state.runs[("orders", LOST_RUN.run)].to_json())
            assert not state.overruled  # every rank under a key of its own: nothing to settle
        assert len(results) == 1, chosen


def test_a_late_record_and_compaction_leave_the_truth_in_the_history() -> None:
    """The zombie of issue 46, killed before it could settle, then the cleaner: under one key per
    run it kept LOST alone; under one key per rank both stay, and COMMITTED holds. Partition 0's
    copy, which is LOST, is overruled and settled by the next reader of the history."""
    written = [(1, COMMITTED), (0, LOST_RUN), (1, LOST_RUN), (1, COMMITTED)]  # the last: a retry's
    latest: dict[tuple[int, bytes], Entry] = {}
    for i, (p, r) in enumerate(written):
        key = history_key(r.key, r.to_json()) if p == 1 else r.key
        latest[(p, key)] = Entry(i, i, key, r.to_json(), p)
    compacted = sorted(latest.values(), key=lambda e: (e.partition, e.offset))
    state = replay(compacted)
    assert state.runs[("orders", LOST_RUN.run)].status is RunStatus.COMMITTED
    assert state.overruled == {("orders", LOST_RUN.run): RunStatus.LOST}  # partition 0's copy


def test_lost_again_keeps_the_later_generation_not_a_stale_first_one() -> None:
    state = replay(_entries((1, LOST_RUN), (1, LOST_AGAIN), (1, LOST_RUN)))
    rec = state.runs[("orders", LOST_RUN.run)]
    assert rec.repair is not None and rec.repair.restored == 10


def test_the_history_decides_over_the_protocols_copy_and_a_tombstone_clears_the_copy() -> None:
    """Partition 0 holds copies of the records recovery must meet; the history holds them all, in order."""
    zombie_copy_then_history = _entries((0, LOST_RUN), (1, COMMITTED), (1, LOST_RUN))
    state = replay(zombie_copy_then_history)
    assert state.runs[("orders", LOST_RUN.run)].status is RunStatus.COMMITTED and state.overruled
    only_protocol = replay(_entries((0, LOST_RUN), (0, None)))  # settled: the copy is tombstoned
    assert ("orders", LOST_RUN.run) not in only_protocol.runs


def test_a_reader_settles_what_a_late_writer_left_so_that_compaction_keeps_the_truth() -> None:
    log = MemoryDecisionLog(initial=[(COMMITTED.key, COMMITTED.to_json()), (LOST_RUN.key, LOST_RUN.to_json())])
    assert log.read().runs[("orders", LOST_RUN.run)].status is RunStatus.COMMITTED  # and it wrote COMMITTED again
    log.compact()
    state = log.read()
    assert state.runs[("orders", LOST_RUN.run)].status is RunStatus.COMMITTED and not state.overruled


def test_acknowledge_is_refused_while_a_repair_in_force_would_make_the_records_visible() -> None:
    """A repair killed past its decision: acknowledging would call records lost that `resolve` shows."""
    log = MemoryDecisionLog(initial=[(LOST_RUN.key, LOST_RUN.to_json())])
    log.decide(_repair())
    with pytest.raises(NotLostError, match=r"repair in force .* `kafka2pc resolve --prefix orders`"):
        acknowledge_loss(log, "orders", LOST_RUN.run, "re-exported by hand")
    assert log.read().runs[("orders", LOST_RUN.run)].status is RunStatus.LOST  # nothing was written


def test_a_repair_decided_after_the_acknowledgement_is_void() -> None:
    """The acknowledgement first in the protocol's order: a repair planned from the LOST record before it
    (paused, or slow to export) rules nothing, so an acknowledged loss stays lost."""
    log = MemoryDecisionLog(initial=[(LOST_RUN.key, LOST_RUN.to_json()), (ACKED.key, ACKED.to_json())])
    late = _repair()
    state = log.decide(late)
    assert not state.in_force(late.decision_id) and "acknowledged first" in state.void[late.decision_id]
    early = MemoryDecisionLog(initial=[(LOST_RUN.key, LOST_RUN.to_json())])
    first = _repair()
    early.decide(first)
    early.append([(ACKED.key, ACKED.to_json())])
    assert early.read().in_force(first.decision_id)  # decided before: it rules, and ends the run REPAIRED


def test_a_stale_source_position_changes_nothing_and_is_written_again() -> None:
    """A paused commit's late finalize writes its run's position after a later run's: ignored, settled."""
    from airflow_provider_kafka2pc.txn.protocol.records import POSITION_KEY
    from airflow_provider_kafka2pc.txn.protocol.source_range import PartitionRange, SourceRange

    def at(run: str, start: int, end: int) -> RunRecord:
        source = SourceRange("g", (PartitionRange("src", 0, start, end, start),))
        return dataclasses.replace(COMMITTED, run=run, source=source)

    key = (POSITION_KEY + "orders").encode()
    log = MemoryDecisionLog(initial=[(key, at("r1", 0, 10).to_json()), (key, at("r2", 10, 25).to_json())])
    log.append([(key, at("r1", 0, 10).to_json())])  # the zombie's
    state = log.read()
    assert state.positions["orders"].run == "r2"
    log.compact()
    assert log.read().positions["orders"].run == "r2" and not log.read().stale_positions


def test_a_stale_acknowledgement_voids_no_repair_of_a_later_loss() -> None:
    """An acknowledge that read the generation-0 loss and paused lands after a repair lost part again
    (generation 1): it is overruled, and a repair of that later loss (generation 2) is in force. An
    acknowledgement of generation 1 voids it."""
    stale = [(r.key, r.to_json()) for r in (LOST_RUN, LOST_AGAIN, ACKED)]
    log = MemoryDecisionLog(initial=stale)
    assert log.read().runs[("orders", LOST_RUN.run)] == LOST_AGAIN
    later = _repair(run=LOST_AGAIN)
    assert log.decide(later).in_force(later.decision_id)
    acked_again = dataclasses.replace(LOST_AGAIN, status=RunStatus.ACKNOWLEDGED, note="dealt with")
    log = MemoryDecisionLog(initial=[*stale, (acked_again.key, acked_again.to_json())])
    voided = _repair(run=LOST_AGAIN)
    assert "acknowledged first" in log.decide(voided).void[voided.decision_id]


def test_a_copy_in_the_protocols_partition_counts_beside_the_history() -> None:
    """An acknowledgement whose partition-0 copy landed and whose history record did not: the run is
    acknowledged, read with its history or without."""
    entries = [Entry(0, 0, LOST_RUN.key, LOST_RUN.to_json(), 0), Entry(1, 1, ACKED.key, ACKED.to_json(), 0)]
    entries.append(Entry(0, 0, history_key(LOST_RUN.key, LOST_RUN.to_json()), LOST_RUN.to_json(), 1))
    assert replay(entries).runs[("orders", LOST_RUN.run)].status is RunStatus.ACKNOWLEDGED


def test_describe_calls_only_a_committed_run_atomic_and_a_loss_is_not_called_never_visible() -> None:
    """Issue 48: a lost or acknowledged run is only partly visible, a repaired one became visible in
    two steps; the loss's error says its records are not visible and a repair makes them so."""
    from airflow_provider_kafka2pc.txn.protocol.errors import LostTransaction, TransactionLostError
    from airflow_provider_kafka2pc.txn.two_phase.survey import run_json

    assert [run_json(r)["atomic"] for r in (COMMITTED, LOST_RUN, ACKED, REPAIRED)] == [True, False, False, False]
    lost = LostTransaction("orders-1", 7, 0, 10, ("events-0",), "aborted by its timeout", "orders", LOST_RUN.run)
    said = str(TransactionLostError([lost]))
    assert "never" not in said and "their records are not visible (only a repair makes them so)" in said
