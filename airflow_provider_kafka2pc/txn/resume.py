"""Finishing prepared transactions from another process (DESIGN §4-§6).

``TransactionResolver`` ends transactions by (transactional id, producer id, epoch) over the
public wire protocol and classifies every result by the outcome table. ``commit_prepared`` and
``abort_prepared`` are the two halves of the coordinator's second phase: decision first, then
EndTxn, then the final record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionLog, DecisionSnapshot
from airflow_provider_kafka2pc.txn.errors import (
    CoordinatorError,
    LostTransaction,
    MalformedCommittableError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.inspect import RetriableCoordinatorError, TransactionInspector, retry
from airflow_provider_kafka2pc.txn.outcome import (
    NONE,
    RETRIABLE,
    STALE_COORDINATOR,
    Intent,
    Observation,
    TxnRef,
    Verdict,
    observe,
    reason,
    verdict,
)
from airflow_provider_kafka2pc.txn.wire import TxnState, WireClient, error_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolution:
    """How one transaction ended, and what the broker answered on the way."""

    ref: TxnRef
    outcome: Verdict  # COMMITTED, ABORTED or LOST
    observation: Observation  # the last thing DescribeTransactions showed
    detail: str
    end_txn_codes: tuple[str, ...] = field(default=())


class TransactionResolver:
    def __init__(
        self,
        wire: WireClient,
        committed_in_log: Callable[[TxnRef], bool] = lambda _ref: False,
        max_workers: int = 16,
        timeout_s: float = 60.0,
    ) -> None:
        self.wire = wire
        self.inspector = TransactionInspector(wire, timeout_s)
        self.committed_in_log = committed_in_log
        self.max_workers = max_workers
        self.timeout_s = timeout_s

    def observe_all(self, refs: Sequence[TxnRef]) -> dict[str, tuple[Observation, TxnState | None]]:
        states = self.inspector.describe(r.transactional_id for r in refs)
        return {r.transactional_id: (_observe(r, s := states.get(r.transactional_id)), s) for r in refs}

    def resolve(
        self,
        refs: Sequence[TxnRef],
        intent: Intent,
        observed: dict[str, tuple[Observation, TxnState | None]] | None = None,
    ) -> list[Resolution]:
        """End every transaction as ``intent`` says, in parallel; never raises for a lost one."""
        _check_unique(refs)
        if not refs:
            return []
        observed = observed if observed is not None else self.observe_all(refs)
        with ThreadPoolExecutor(
            max_workers=min(self.max_workers, len(refs)), thread_name_prefix="kafka2pc-endtxn"
        ) as ex:
            resolutions = list(ex.map(lambda r: self._resolve_one(r, intent, observed[r.transactional_id][0]), refs))
        self._await_markers(resolutions)
        return resolutions

    def _await_markers(self, resolutions: Sequence[Resolution], timeout_s: float = 30.0) -> None:
        """Wait until the broker has written the markers of what was just ended.

        EndTxn answers once the decision is in the transaction log (PrepareCommit/PrepareAbort);
        the markers that make records visible to read_committed consumers follow. Returning
        only after CompleteCommit means "commit succeeded" also means "the data is visible".
        """
        pending = {r.ref.transactional_id: r.ref for r in resolutions if r.outcome is not Verdict.LOST}
        deadline = time.monotonic() + timeout_s
        while pending:
            states = self.inspector.describe(pending)
            for tid, ref in list(pending.items()):
                s = states.get(tid)
                if s is None or (s.producer_id, s.producer_epoch) != (ref.producer_id, ref.producer_epoch):
                    del pending[tid]  # another producer has the id now: nothing of ours is in flight
                elif s.state not in _IN_FLIGHT:
                    del pending[tid]
            if not pending:
                return
            if time.monotonic() > deadline:
                log.warning("transaction markers still pending after %.0f s: %s", timeout_s, sorted(pending))
                return
            time.sleep(0.02)

    def _resolve_one(self, ref: TxnRef, intent: Intent, obs: Observation) -> Resolution:
        codes: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        while True:
            v = verdict(obs, intent)
            if v is Verdict.END_TXN:
                if len(codes) >= 3:
                    raise CoordinatorError(
                        f"EndTxn({ref.transactional_id!r}) keeps failing while the transaction is still open: {codes}"
                    )
                code = self._end_txn(ref, intent, codes)
                if code == NONE:
                    done = Verdict.COMMITTED if intent is Intent.COMMIT else Verdict.ABORTED
                    return Resolution(ref, done, obs, f"{done.value} by this call", tuple(codes))
                # Not retriable: ask the broker what happened instead of guessing from the code.
                obs = self._observe_one(ref)
                continue
            if v is Verdict.WAIT:
                if time.monotonic() > deadline:
                    raise CoordinatorError(f"{ref.transactional_id!r} stayed in state {obs.value} too long")
                time.sleep(0.2)
                obs = self._observe_one(ref)
                continue
            if v is Verdict.CONSULT_LOG:
                if self.committed_in_log(ref):
                    return Resolution(
                        ref, Verdict.COMMITTED, obs, "the decision log records it COMMITTED", tuple(codes)
                    )
                if intent is Intent.ABORT:
                    return Resolution(ref, Verdict.ABORTED, obs, reason(obs), tuple(codes))
                return Resolution(ref, Verdict.LOST, obs, reason(obs), tuple(codes))
            detail = (
                "already committed"
                if v is Verdict.COMMITTED
                else ("already aborted" if v is Verdict.ABORTED else reason(obs))
            )
            return Resolution(ref, v, obs, detail, tuple(codes))

    def _observe_one(self, ref: TxnRef) -> Observation:
        return _observe(ref, self.inspector.describe([ref.transactional_id]).get(ref.transactional_id))

    def _end_txn(self, ref: TxnRef, intent: Intent, codes: list[str]) -> int:
        """EndTxn with re-lookup and backoff on retriable errors; returns NONE or a final code."""

        def attempt() -> int:
            node = self.inspector.coordinators([ref.transactional_id])[ref.transactional_id]
            code = self.wire.end_txn(
                node, ref.transactional_id, ref.producer_id, ref.producer_epoch, commit=intent is Intent.COMMIT
            )
            if code != NONE:
                codes.append(error_name(code))
            if code in RETRIABLE:
                if code in STALE_COORDINATOR:
                    log.info("EndTxn(%s): %s; looking the coordinator up again", ref.transactional_id, error_name(code))
                raise RetriableCoordinatorError(code, f"EndTxn({ref.transactional_id!r})")
            return code

        return retry(f"EndTxn({ref.transactional_id!r})", attempt, self.timeout_s)


_IN_FLIGHT = ("PrepareCommit", "PrepareAbort")


def _observe(ref: TxnRef, state: TxnState | None) -> Observation:
    if state is None:
        return observe(ref, None, -1, -1)
    return observe(ref, state.state, state.producer_id, state.producer_epoch)


def _check_unique(refs: Sequence[TxnRef]) -> None:
    seen: set[str] = set()
    for r in refs:
        if r.transactional_id in seen:
            raise MalformedCommittableError(f"two committables share transactional id {r.transactional_id!r}")
        seen.add(r.transactional_id)


class _HoldsProducer(Protocol):
    @property
    def transactional_id(self) -> str: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...


def ref_of(c: _HoldsProducer) -> TxnRef:
    """The (id, pid, epoch) of a committable, a DescribeTransactions row or a decision record."""
    return TxnRef(c.transactional_id, c.producer_id, c.producer_epoch)


@dataclass(frozen=True)
class CommitReport:
    resolutions: tuple[Resolution, ...]

    def count(self, v: Verdict) -> int:
        return sum(1 for r in self.resolutions if r.outcome is v)


def commit_prepared(
    committables: Sequence[Committable],
    wire: WireClient,
    decision_log: DecisionLog,
    run: str,
    deadline_margin_ms: int = 1000,
    max_workers: int = 16,
    prefixes: Sequence[str] = (),
) -> CommitReport:
    """Phase two, COMMIT: decide durably, end every transaction, record the result.

    Atomicity first: if some committable can no longer commit (aborted, timed out, fenced, past
    its deadline) and nothing of the run is committed or decided yet, the whole run is aborted
    and ``TransactionLostError`` names the cause, so no part becomes visible. Once anything is
    decided, everything that can commit is rolled forward, and the loss is reported the same way.
    ``prefixes`` are marked in the log as committed for ``run`` with the COMMIT decisions, so an
    export task of that run that is cleared and re-run knows not to export again.
    """
    refs = [ref_of(c) for c in committables]
    _check_unique(refs)
    by_tid = {c.transactional_id: c for c in committables}
    snapshot = decision_log.read()
    resolver = TransactionResolver(wire, snapshot.committed, max_workers=max_workers)
    observed = resolver.observe_all(refs)
    now_ms = int(time.time() * 1000)

    doomed: dict[str, str] = {}
    for ref in refs:
        obs = observed[ref.transactional_id][0]
        v = verdict(obs, Intent.COMMIT)
        # FENCING: the broker is aborting it on timeout right now; it can only end aborted.
        if (
            v is Verdict.LOST
            or obs is Observation.FENCING
            or (v is Verdict.CONSULT_LOG and not snapshot.committed(ref))
        ):
            doomed[ref.transactional_id] = reason(obs)
        elif obs is Observation.OPEN and by_tid[ref.transactional_id].remaining_ms(now_ms) < deadline_margin_ms:
            doomed[ref.transactional_id] = (
                f"past its deadline: transaction.timeout.ms={by_tid[ref.transactional_id].transaction_timeout_ms} "
                "elapsed since its first record"
            )
    decided = any(snapshot.decided_commit(r) for r in refs) or any(
        observed[r.transactional_id][0] in (Observation.COMMITTED, Observation.COMMITTING) for r in refs
    )

    if doomed and not decided:
        log.error("run %s cannot commit atomically (%d doomed); aborting all of it", run, len(doomed))
        resolutions = resolver.resolve(refs, Intent.ABORT, observed)
        decision_log.record(refs, Decision.ABORTED, run, reasons=doomed)
        raise TransactionLostError(_lost(by_tid, doomed))

    decision_log.record(
        refs,
        Decision.COMMIT,
        run,
        counts={c.transactional_id: c.records for c in committables},
        mark_prefixes=prefixes,
    )
    resolutions = resolver.resolve(refs, Intent.COMMIT, observed)
    lost = {r.ref.transactional_id: r.detail for r in resolutions if r.outcome is Verdict.LOST}
    record_final(decision_log, resolutions, run)
    if lost:
        raise TransactionLostError(_lost(by_tid, lost))
    return CommitReport(tuple(resolutions))


def abort_prepared(
    committables: Sequence[Committable] | Sequence[TxnRef],
    wire: WireClient,
    decision_log: DecisionLog,
    run: str,
    max_workers: int = 16,
) -> CommitReport:
    """Phase two, ABORT. A transaction with a COMMIT decision is rolled forward, never aborted."""
    refs = [c if isinstance(c, TxnRef) else ref_of(c) for c in committables]
    snapshot = decision_log.read()
    resolver = TransactionResolver(wire, snapshot.committed, max_workers=max_workers)
    forward = [r for r in refs if snapshot.decided_commit(r)]
    back = [r for r in refs if not snapshot.decided_commit(r)]
    if forward:
        log.warning(
            "rolling forward %d transaction(s) that have a COMMIT decision: %s",
            len(forward),
            [r.transactional_id for r in forward],
        )
    resolutions = resolver.resolve(forward, Intent.COMMIT) + resolver.resolve(back, Intent.ABORT)
    record_final(decision_log, resolutions, run)
    return CommitReport(tuple(resolutions))


def record_final(decision_log: DecisionLog, resolutions: Sequence[Resolution], run: str) -> None:
    for v, d in (
        (Verdict.COMMITTED, Decision.COMMITTED),
        (Verdict.ABORTED, Decision.ABORTED),
        (Verdict.LOST, Decision.LOST),
    ):
        refs = [r.ref for r in resolutions if r.outcome is v]
        if refs:
            decision_log.record(refs, d, run, reasons={r.ref.transactional_id: r.detail for r in resolutions})


def _lost(by_tid: dict[str, Committable], reasons: dict[str, str]) -> list[LostTransaction]:
    return [
        LostTransaction(tid, c.producer_id, c.producer_epoch, c.records, c.describe_partitions(), reasons[tid])
        for tid, c in by_tid.items()
        if tid in reasons
    ]


__all__ = [
    "CommitReport",
    "DecisionSnapshot",
    "Resolution",
    "TransactionResolver",
    "abort_prepared",
    "commit_prepared",
    "ref_of",
]
