"""Is a decided run visible, partly visible, or lost? The one answer for the CLI, recovery and the commit.

A COMMIT decision in force says "make all of these visible". How far that came is counted per
exporter of the run, transaction by transaction, from what is known for certain:

- the outcome recorded in the decision log (an actor saw it committed, or lost);
- else the broker's view (DescribeTransactions) looked up in the outcome table: committed or
  committing is visible; aborted, being fenced, or another epoch that the log does not record
  committed is lost unless its partitions' markers show it committed (by another process); still
  open under its own producer id and epoch is *pending* (it can still be
  committed, by the commit or by recovery);
- else, when nobody asked the broker, pending.

A finished run's record (COMMITTED, LOST, ACKNOWLEDGED) carries the same counts. Read-only: this
module asks and counts, it never ends a transaction or writes to the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.kafka.markers import Fate
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import LostTransaction, Visibility
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    Intent,
    Observation,
    TxnRef,
    Verdict,
    observe_row,
    reason,
    verdict,
)
from airflow_provider_kafka2pc.txn.protocol.records import Covered, Kind, LostTxn, RunRecord, RunStatus, prefix_of
from airflow_provider_kafka2pc.txn.two_phase.loss_proof import FORGOTTEN, began_by


def observe_broker(
    inspector: TransactionInspector, refs: Iterable[TxnRef], state: LogState
) -> dict[TxnRef, Observation]:
    """The broker's view of each transaction under a COMMIT of ``state``, as the outcome table names
    it; one whose id has moved on is looked up in its partitions' markers (DESIGN §15): committed by
    another process is visible, not lost."""
    wanted = list(refs)
    states = inspector.describe(r.transactional_id for r in wanted)
    observed = {r: observe_row(r, states.get(r.transactional_id)) for r in wanted}
    covers = {c.ref: (c, d) for d in state.decisions.values() if d.kind is Kind.COMMIT for c in d.txns}
    for ref, seen in observed.items():
        c, d = covers.get(ref, (None, None))
        if seen in FORGOTTEN and c is not None and d is not None and c.partitions:
            fate, _ = inspector.wire.transaction_fate(ref, c.partitions, began_by(c), inspector.timeout_s)
            if fate is Fate.COMMITTED:
                observed[ref] = Observation.COMMITTED
    return observed


def unresolved_commits(state: LogState, prefix: str) -> list[TxnRef]:
    """What the broker must be asked about: transactions under a COMMIT in force touching ``prefix``
    that no actor has seen end, those of the run's other exporters included (one run, one decision:
    a loss of theirs breaks the run's atomicity that ``prefix``'s readers rely on too)."""
    return [
        c.ref
        for d in state.decisions_touching(lambda tid: prefix_of(tid) == prefix)
        if d.kind is Kind.COMMIT
        for c in state.unresolved(d.decision_id)
    ]


def of_decision(
    state: LogState,
    decision_id: str,
    prefix: str,
    observed: Mapping[TxnRef, Observation] | None = None,
) -> tuple[Visibility, tuple[LostTransaction, ...]]:
    """How much of ``prefix``'s part of a COMMIT decision in force is visible, and what is lost."""
    d = state.decisions[decision_id]
    outcome = state.outcome(decision_id)
    recorded_lost = {t.covered.transactional_id: t for t in outcome.lost}
    mine = [c for c in d.txns if prefix_of(c.transactional_id) == prefix]
    visible: list[Covered] = []
    lost: list[LostTxn] = []
    for c in mine:
        if c.transactional_id in outcome.committed:
            visible.append(c)
        elif c.transactional_id in recorded_lost:
            lost.append(recorded_lost[c.transactional_id])
        elif observed is not None and c.ref in observed:
            seen = _under_commit(observed[c.ref])
            if seen is Verdict.COMMITTED:
                visible.append(c)
            elif seen is Verdict.LOST:
                lost.append(LostTxn(c, reason(observed[c.ref])))
    return _count(prefix, d.run, mine, visible, lost), _as_lost(lost, d.run)


def of_run_record(rec: RunRecord) -> Visibility:
    """A finished run's counts, from its record: everything not lost was committed."""
    lost = [t.covered for t in rec.lost]
    lost_records = sum(c.records for c in lost)
    return Visibility(
        rec.prefix,
        rec.run,
        rec.transactions,
        rec.records,
        rec.transactions - len(lost),
        rec.records - lost_records,
        len(lost),
        lost_records,
    )


@dataclass(frozen=True)
class RunLoss:
    """One run of an exporter with transactions that can never become visible."""

    visibility: Visibility
    lost: tuple[LostTransaction, ...]
    decision_id: str
    final: bool  # from the run's LOST record; else from a COMMIT decision still in force


def losses(state: LogState, prefix: str, observed: Mapping[TxnRef, Observation] | None = None) -> list[RunLoss]:
    """Every run of ``prefix`` with a loss not acknowledged: LOST run records, and COMMIT decisions in
    force with a transaction recorded or observed lost, for ``prefix`` or for another exporter of the
    same run (reported under that exporter's name). Oldest first."""
    found = [
        RunLoss(of_run_record(r), _as_lost(r.lost, r.run), r.decision_id, True)
        for r in sorted(state.lost_runs(prefix), key=_at)
    ]
    for d in state.decisions_touching(lambda tid: prefix_of(tid) == prefix):
        if d.kind is not Kind.COMMIT:
            continue
        for p in sorted({prefix_of(c.transactional_id) for c in d.txns}):
            # A run record and its decision both present: a retirement cut short; the record is final.
            rec = state.runs.get((p, d.run))
            if rec is not None and rec.status is not RunStatus.DECIDED:
                continue
            v, lost = of_decision(state, d.decision_id, p, observed)
            if lost:
                found.append(RunLoss(v, lost, d.decision_id, False))
    return found


def _under_commit(obs: Observation) -> Verdict:
    """COMMITTED, LOST, or END_TXN (pending), by the outcome table with intent COMMIT."""
    v = verdict(obs, Intent.COMMIT)
    # CONSULT_LOG: the caller looked at the recorded outcome first, and it did not say committed.
    # WAIT (PrepareEpochFence): the broker is aborting it on timeout; it can only end aborted.
    return Verdict.LOST if v in (Verdict.CONSULT_LOG, Verdict.WAIT) else v


def _count(
    prefix: str, run: str, mine: Sequence[Covered], visible: Sequence[Covered], lost: Sequence[LostTxn]
) -> Visibility:
    return Visibility(
        prefix,
        run,
        len(mine),
        sum(c.records for c in mine),
        len(visible),
        sum(c.records for c in visible),
        len(lost),
        sum(t.covered.records for t in lost),
    )


def _as_lost(lost: Iterable[LostTxn], run: str) -> tuple[LostTransaction, ...]:
    return tuple(t.reported(run) for t in lost)


def _at(r: RunRecord) -> tuple[int, str]:
    return r.at_ms, r.run
