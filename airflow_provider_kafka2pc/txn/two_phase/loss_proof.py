"""A loss is a fact proven from the broker when it is recorded (DESIGN §15).

Under a COMMIT, a transaction whose id has moved on (a later producer epoch, or an id the broker
forgot) is the same to DescribeTransactions whether another process committed it (a retry elsewhere,
while this one was paused) or the broker aborted it on timeout. So before such a transaction is
called lost, the decision log is read again (the retry may have recorded it committed since this
actor read it), and then its data partitions' markers are read (``txn.kafka.markers``): a COMMIT
marker means committed by another process; ABORT markers prove the loss; no record left to read
(retention, compaction, only internal topics) proves nothing, and says so: a repair refuses such a
loss (``repair``), which is never made visible a second time on a guess.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import RetriableCoordinatorError
from airflow_provider_kafka2pc.txn.kafka.markers import Fate, PartitionFate
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.outcome import Observation, TxnRef, Verdict
from airflow_provider_kafka2pc.txn.protocol.records import Covered, DecisionRecord, RunStatus, prefix_of, run_key
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution, TransactionResolver

# What DescribeTransactions cannot tell apart once the id moved on: committed, or aborted, before.
FORGOTTEN = (Observation.SUPERSEDED, Observation.UNKNOWN_ID)
# The words a loss that could not be proven carries in its reason (``repair`` refuses it).
UNPROVEN = "not proven"
_MARKERS_WAIT_S = 10.0  # the id moved on, so its markers are being written: how long to wait for them


def proven(
    resolver: TransactionResolver, decision_log: DecisionLog, d: DecisionRecord, resolutions: Sequence[Resolution]
) -> list[Resolution]:
    """The resolutions of COMMIT decision ``d`` with each forgotten "lost" one proven: committed (the
    log read again, or its COMMIT marker), lost with the proof (ABORT markers), or lost "not proven"."""
    doubtful = [r for r in resolutions if r.outcome is Verdict.LOST and r.observation in FORGOTTEN]
    if not doubtful:
        return list(resolutions)
    committed = _committed_in_fresh_log(decision_log, d)
    by_tid = {c.transactional_id: c for c in d.txns}
    out: list[Resolution] = []
    for r in resolutions:
        if r not in doubtful:
            out.append(r)
        elif r.ref.transactional_id in committed:
            out.append(
                dataclasses.replace(
                    r, outcome=Verdict.COMMITTED, detail="committed by another process (the decision log, read again)"
                )
            )
        else:
            out.append(_by_markers(resolver.wire, r, by_tid[r.ref.transactional_id], d, resolver.timeout_s))
    return out


def _committed_in_fresh_log(decision_log: DecisionLog, d: DecisionRecord) -> frozenset[str]:
    """The transactions of ``d`` that the log, read now, records committed: in its outcome, or by the
    run's final record of this decision (retired since this actor read it)."""
    prefixes = sorted({p for c in d.txns if (p := prefix_of(c.transactional_id))})
    history = {run_key(p, d.run) for p in prefixes}
    state = decision_log.read(keep_run=decision_log.keep_run_of(prefixes, d.run), history=history)
    done = set(state.outcome(d.decision_id).committed) if d.decision_id in state.decisions else set()
    for p in prefixes:
        rec = state.runs.get((p, d.run))
        if (
            rec is not None
            and rec.decision_id == d.decision_id
            and rec.status in (RunStatus.COMMITTED, RunStatus.REPAIRED)
        ):
            lost = {t.covered.transactional_id for t in rec.lost}
            done |= {
                c.transactional_id
                for c in d.txns
                if prefix_of(c.transactional_id) == p and c.transactional_id not in lost
            }
    return frozenset(done)


def _by_markers(wire: WireClient, r: Resolution, c: Covered, d: DecisionRecord, timeout_s: float) -> Resolution:
    deadline = time.monotonic() + _MARKERS_WAIT_S
    while True:
        fate, where = wire.transaction_fate(r.ref, c.partitions, began_by(c), timeout_s)
        if fate is not Fate.OPEN:
            break
        if time.monotonic() > deadline:
            raise RetriableCoordinatorError(
                0,
                f"{r.ref.transactional_id}: its producer moved on, but no marker follows its records in "
                f"{', '.join(f.partition for f in where if f.fate is Fate.OPEN)} yet",
                "markers pending",
            )
        time.sleep(0.2)
    if fate is Fate.COMMITTED:
        at = next(f for f in where if f.fate is Fate.COMMITTED)
        detail = f"committed by another process (its COMMIT marker is in {at.partition}, offset {at.marker_offset})"
        return dataclasses.replace(r, outcome=Verdict.COMMITTED, detail=detail)
    return dataclasses.replace(r, detail=f"{r.detail} ({proof_of(fate, where)})")


def proof_of(fate: Fate, where: Sequence[PartitionFate]) -> str:
    """How the markers prove a loss, or that they cannot: the words a loss's reason carries."""
    if fate is Fate.ABORTED:
        marked = [f for f in where if f.fate is Fate.ABORTED]
        return "proven from its partitions: " + "; ".join(
            f"{f.partition}: ABORT marker at offset {f.marker_offset}" for f in marked
        )
    read = ", ".join(f.partition for f in where) or "none (only Kafka's internal topics)"
    return f"{UNPROVEN}: none of its records is left to read in {read} (retention, compaction, or an internal topic)"


def began_by(c: Covered) -> int:
    """No later than the transaction's start, by the broker's clock: its recorded start, else 0 (read
    from the log's start: slower, never wrong)."""
    return c.start_ms if c.start_ms is not None else 0


def fate_of(wire: WireClient, c: Covered, timeout_s: float) -> tuple[Fate, Sequence[PartitionFate]]:
    """The markers' word on one transaction a decision covered (``repair`` asks it before exporting)."""
    return wire.transaction_fate(
        TxnRef(c.transactional_id, c.producer_id, c.producer_epoch), c.partitions, began_by(c), timeout_s
    )


__all__ = ["FORGOTTEN", "UNPROVEN", "began_by", "fate_of", "proof_of", "proven"]
