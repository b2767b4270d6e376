"""The second phase's rule: every transaction ends as the first decision in force that covers it says.

``obey`` carries out a ruling of the decision log (COMMIT rolls forward, ABORT aborts; a COMMIT over
a transaction the broker already aborted is a loss) and records the outcomes; the helpers read a
committable or a broker row as what a decision covers. Shared by the commit, the abort and recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState, finalize
from airflow_provider_kafka2pc.txn.protocol.errors import LostTransaction
from airflow_provider_kafka2pc.txn.protocol.outcome import HoldsProducer, Intent, Observation, TxnRef, Verdict
from airflow_provider_kafka2pc.txn.protocol.records import (
    RUN_KEY,
    Covered,
    Kind,
    LostTxn,
    OutcomeRecord,
    RunRecord,
    run_key,
)
from airflow_provider_kafka2pc.txn.two_phase.loss_proof import proven
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution, TransactionResolver

log = logging.getLogger(__name__)


def ref_of(c: HoldsProducer) -> TxnRef:
    """The (id, pid, epoch) of a committable, a DescribeTransactions row or a decision record."""
    return TxnRef(c.transactional_id, c.producer_id, c.producer_epoch)


@dataclass(frozen=True)
class CommitReport:
    resolutions: tuple[Resolution, ...]
    note: str = ""  # e.g. "already committed", from the run's own record
    # Every transaction of the run ended committed: by this call, an earlier try, or per its run record.
    committed: bool = False

    def count(self, v: Verdict) -> int:
        return sum(1 for r in self.resolutions if r.outcome is v)


def deadline_of(state: TxnState | None) -> int | None:
    """The broker's deadline of an open transaction: its start time + transaction.timeout.ms."""
    if state is None or state.start_time_ms <= 0 or state.timeout_ms <= 0:
        return None
    return state.start_time_ms + state.timeout_ms


def start_of(state: TxnState | None) -> int | None:
    """The broker's start time of an open transaction: where its records begin (``markers``)."""
    return state.start_time_ms if state is not None and state.start_time_ms > 0 else None


def covered(c: Committable, state: TxnState | None) -> Covered:
    mine = state is not None and ref_of(state) == ref_of(c)
    return Covered(
        c.transactional_id,
        c.producer_id,
        c.producer_epoch,
        c.records,
        partitions_of(c, state),
        deadline_of(state) if mine else None,
        c.digest,
        start_of(state) if mine else None,
    )


def partitions_of(c: Committable, state: TxnState | None) -> tuple[str, ...]:
    """The transaction's partitions as the broker lists them while it is open for this producer;
    else as the committable has them (none when it came through a version-2 XCom)."""
    if state is not None and state.topic_partitions and ref_of(state) == ref_of(c):
        return tuple(f"{t}-{p}" for t, p in state.topic_partitions)
    return c.describe_partitions()


def covered_state(s: TxnState) -> Covered:
    """A transaction known only from the broker (recovery, abort): no record count."""
    return Covered(
        s.transactional_id,
        s.producer_id,
        s.producer_epoch,
        0,
        tuple(f"{t}-{p}" for t, p in s.topic_partitions),
        deadline_of(s),
        start_ms=start_of(s),
    )


def obey(
    decision_log: DecisionLog,
    state: LogState,
    decision_ids: Sequence[str],
    resolver: TransactionResolver,
) -> list[Resolution]:
    """End what each decision in force rules and has not ended yet; record outcomes; retire what
    is final. Returns the resolutions of this call (transactions already resolved are skipped)."""
    done: list[Resolution] = []
    items: list[tuple[bytes, bytes | None]] = []
    for did in dict.fromkeys(decision_ids):
        if not state.in_force(did):
            items += finalize(state, did, now_ms())
            continue
        d = state.decisions[did]
        todo = state.unresolved(did)
        intent = Intent.COMMIT if d.kind is Kind.COMMIT else Intent.ABORT
        if todo:
            log.info(
                "%s %d transaction(s) under %s decision %s of %s (%s)",
                intent.value.lower(),
                len(todo),
                d.kind.value,
                did,
                d.run,
                d.actor,
            )
        resolutions = resolver.resolve([c.ref for c in todo], intent)
        if intent is Intent.COMMIT:
            resolutions = proven(resolver, decision_log, d, resolutions)
        log_resolutions(f"{intent.value.lower()} of run {d.run} under {d.kind.value} decision {did}", resolutions)
        done += resolutions
        by_tid = {c.transactional_id: c for c in d.txns}
        outcome = state.outcome(did).merge(
            OutcomeRecord(
                did,
                frozenset(r.ref.transactional_id for r in resolutions if r.outcome is Verdict.COMMITTED),
                frozenset(r.ref.transactional_id for r in resolutions if r.outcome is Verdict.ABORTED),
                tuple(
                    LostTxn(by_tid[r.ref.transactional_id], r.detail) for r in resolutions if r.outcome is Verdict.LOST
                ),
            )
        )
        state.outcomes[did] = outcome
        if resolutions:
            items.append((outcome.key, outcome.to_json()))
        items += finalize(state, did, now_ms())
    if items:
        decision_log.append(items)
        written = {k for k, v in items if k.startswith(RUN_KEY.encode()) and v is not None}
        if written:  # re-read the runs: a record that came too late is overruled, and settled (run_history)
            decision_log.read(history=written, keep_run=lambda p, r, _raw: run_key(p, r) in written)
    return done


def abort_reopened(
    resolver: TransactionResolver, state: LogState, refs: Iterable[TxnRef], ended: Iterable[Resolution]
) -> list[Resolution]:
    """End what is open again under an ABORT whose outcome already says aborted: a dying writer's
    late batch reopened it (same producer id and epoch: transaction version 1 allows it), and
    ``obey`` skips what its outcome records. Aborting what an ABORT rules is always safe."""
    done = {r.ref for r in ended}
    ruled = [r for r in refs if r not in done and (d := state.ruled_by(r)) is not None and d.kind is Kind.ABORT]
    if not ruled:
        return []
    observed = resolver.observe_all(ruled)
    reopened = [r for r in ruled if observed[r.transactional_id][0] is Observation.OPEN]
    if not reopened:
        return []
    log.warning("%d transaction(s) open again under their ABORT: aborting them again", len(reopened))
    resolutions = resolver.resolve(reopened, Intent.ABORT, observed)
    log_resolutions("abort again of what reopened under its ABORT", resolutions)
    return resolutions


# Up to this many transactions, each one's end is an INFO line; past it, DEBUG (a lost one: WARNING).
FEW_TRANSACTIONS = 5


def log_resolutions(what: str, resolutions: Sequence[Resolution]) -> None:
    """How the transactions of one decision ended: one summary line, and a line per transaction at
    INFO for a few, else at DEBUG, so that a log does not grow with the run; a lost one is a
    WARNING whatever the count, never hidden."""
    if not resolutions:
        return
    lost = [r for r in resolutions if r.outcome is Verdict.LOST]
    level = logging.INFO if len(resolutions) <= FEW_TRANSACTIONS else logging.DEBUG
    for r in resolutions:
        log.log(logging.WARNING if r.outcome is Verdict.LOST else level, "%s", r.describe())
    log.log(logging.WARNING if lost else logging.INFO, "%s: %s", what, tally(resolutions))


def tally(resolutions: Sequence[Resolution]) -> str:
    """'200 transaction(s): 198 committed and 0 aborted by this call, 2 already ended, 0 lost'."""
    here = [r for r in resolutions if r.ended_here]
    lost = sum(1 for r in resolutions if r.outcome is Verdict.LOST)
    committed = sum(1 for r in here if r.outcome is Verdict.COMMITTED)
    return (
        f"{len(resolutions)} transaction(s): {committed} committed and {len(here) - committed} aborted by this call, "
        f"{len(resolutions) - len(here) - lost} already ended, {lost} lost"
    )


def committed_in(state: LogState) -> Callable[[TxnRef], bool]:
    """For the outcome table's CONSULT_LOG: did an actor see this transaction committed?"""

    def committed(ref: TxnRef) -> bool:
        did = state.ruling.get(ref)
        return did is not None and ref.transactional_id in state.outcome(did).committed

    return committed


def lost_of_decisions(state: LogState, decision_ids: Sequence[str]) -> list[LostTransaction]:
    return [
        t
        for did in dict.fromkeys(decision_ids)
        for t in _lost_transactions(state.outcome(did).lost, state.decisions[did].run if did in state.decisions else "")
    ]


def lost_of_run(rec: RunRecord) -> list[LostTransaction]:
    return _lost_transactions(rec.lost, rec.run)


def _lost_transactions(lost: Iterable[LostTxn], run: str) -> list[LostTransaction]:
    return [t.reported(run) for t in lost]


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


__all__ = [
    "CommitReport",
    "abort_reopened",
    "committed_in",
    "covered",
    "covered_state",
    "deadline_of",
    "iso",
    "log_resolutions",
    "lost_of_decisions",
    "lost_of_run",
    "now_ms",
    "obey",
    "partitions_of",
    "ref_of",
    "tally",
]
