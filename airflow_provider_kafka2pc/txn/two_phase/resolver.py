"""Ending transactions by (transactional id, producer id, epoch) from another process (DESIGN §4-§5).

``TransactionResolver`` sends EndTxn over the public wire protocol (in parallel, retrying what is
retriable) and classifies every result by the outcome table: DescribeTransactions, never the
error code alone, says what became of a transaction. The coordinator decides; this carries out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from airflow_provider_kafka2pc.txn.kafka.errors import RetriableCoordinatorError, error_name
from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import outcome
from airflow_provider_kafka2pc.txn.protocol.errors import CoordinatorError, MalformedCommittableError
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    NONE,
    RETRIABLE,
    STALE_COORDINATOR,
    Intent,
    Observation,
    TxnRef,
    Verdict,
)

log = logging.getLogger(__name__)


_IN_FLIGHT = ("PrepareCommit", "PrepareAbort")


def check_unique(refs: Sequence[TxnRef]) -> None:
    seen: set[str] = set()
    for r in refs:
        if r.transactional_id in seen:
            raise MalformedCommittableError(f"two committables share transactional id {r.transactional_id!r}")
        seen.add(r.transactional_id)


@dataclass(frozen=True)
class Resolution:
    """How one transaction ended, and what the broker answered on the way."""

    ref: TxnRef
    outcome: Verdict  # COMMITTED, ABORTED or LOST
    observation: Observation  # the last thing DescribeTransactions showed
    detail: str
    end_txn_codes: tuple[str, ...] = field(default=())
    ended_here: bool = False  # this call's EndTxn ended it (else it was found ended, or lost)

    def describe(self) -> str:
        """'orders-0 (producer id 4, epoch 0): committed by this call', for a log line."""
        said = self.detail if self.outcome.value in self.detail else f"{self.outcome.value}: {self.detail}"
        return (
            f"{self.ref.transactional_id} (producer id {self.ref.producer_id}, epoch {self.ref.producer_epoch}): {said}"
        )


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
        return {r.transactional_id: (outcome.observe_row(r, s := states.get(r.transactional_id)), s) for r in refs}

    def resolve(
        self,
        refs: Sequence[TxnRef],
        intent: Intent,
        observed: dict[str, tuple[Observation, TxnState | None]] | None = None,
    ) -> list[Resolution]:
        """End every transaction as ``intent`` says, in parallel; never raises for a lost one."""
        check_unique(refs)
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
                log.warning("transaction markers still pending after %.0f s: %s", timeout_s, ", ".join(sorted(pending)))
                return
            time.sleep(0.02)

    def _resolve_one(self, ref: TxnRef, intent: Intent, obs: Observation) -> Resolution:
        codes: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        while True:
            v = outcome.verdict(obs, intent)
            if v is Verdict.END_TXN:
                if len(codes) >= 3:
                    raise CoordinatorError(
                        f"EndTxn({ref.transactional_id!r}) keeps failing while the transaction is still open: {codes}"
                    )
                code = self._end_txn(ref, intent, codes)
                if code == NONE:
                    done = Verdict.COMMITTED if intent is Intent.COMMIT else Verdict.ABORTED
                    return Resolution(ref, done, obs, f"{done.value} by this call", tuple(codes), ended_here=True)
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
                    return Resolution(ref, Verdict.ABORTED, obs, outcome.reason(obs), tuple(codes))
                return Resolution(ref, Verdict.LOST, obs, outcome.reason(obs), tuple(codes))
            detail = (
                "already committed"
                if v is Verdict.COMMITTED
                else ("already aborted" if v is Verdict.ABORTED else outcome.reason(obs))
            )
            return Resolution(ref, v, obs, detail, tuple(codes))

    def _observe_one(self, ref: TxnRef) -> Observation:
        return outcome.observe_row(ref, self.inspector.describe([ref.transactional_id]).get(ref.transactional_id))

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
                raise RetriableCoordinatorError(code, f"EndTxn({ref.transactional_id!r})", error_name(code))
            return code

        return retry(f"EndTxn({ref.transactional_id!r})", attempt, self.timeout_s)


__all__ = ["Resolution", "TransactionResolver", "check_unique"]
