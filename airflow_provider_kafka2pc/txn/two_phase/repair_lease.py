"""A repair holds its run for as long as it lives (the rules: ``txn.protocol.repair_lease``).

``hold_run`` appends the repair's lease, renews it from a thread every third of its time to live,
and returns once the lease is the run's holder: at once, or after the repair that held the run
ended. If that repair ended the run REPAIRED, ``hold_run`` says so instead and the caller reports
its result. The lease is tombstoned when the holder leaves, whatever happened. The renewals go
through a decision log client of their own (a failed append purges its client's producer: never
the main thread's COMMIT). A holder that was stopped (SIGSTOP, a frozen VM) longer than its lease
renews it again when it resumes: by then the run may be another repair's and its own transactions
aborted, which its decision finds void; the renewal only tells recovery that it still lives.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.repair_lease import DEFAULT_TTL_MS, RepairLease
from airflow_provider_kafka2pc.txn.two_phase.ruling import now_ms

log = logging.getLogger(__name__)


class _Renewal(threading.Thread):
    """Appends the lease again every third of its time to live, until stopped or lapsed."""

    def __init__(self, decision_log: DecisionLog, lease: RepairLease) -> None:
        super().__init__(name=f"kafka2pc-repair-lease-{lease.holder}", daemon=True)
        self._log, self.lease, self._stopping = decision_log.sibling(), lease, threading.Event()

    def run(self) -> None:
        every_s = self.lease.ttl_ms / 3000
        try:
            while not self._stopping.wait(every_s):
                if not self.lease.live(now_ms()):
                    log.warning("repair lease of run %s lapsed (this process was stopped or cut off)", self.lease.run)
                renewed = replace(self.lease, at_ms=now_ms())
                try:
                    self._log.append([(renewed.key, renewed.to_json())])
                except Exception as e:  # the next renewal tries again; a lease that lapses only lets others in
                    log.warning("repair lease of run %s not renewed: %s", self.lease.run, e)
                    continue
                self.lease = renewed
        finally:
            self._log.close()

    def stop(self) -> None:
        """Stop renewing; returns once no renewal is in flight, so none lands after the tombstone."""
        self._stopping.set()
        self.join()


@contextlib.contextmanager
def hold_run(
    decision_log: DecisionLog,
    prefix: str,
    run: str,
    attempt_key: str,
    ttl_ms: int = DEFAULT_TTL_MS,
    poll_s: float = 0.5,
) -> Iterator[RunRecord | None]:
    """Hold ``run`` of ``prefix`` for the repair writing ids under ``attempt_key``. Yields None once
    held, or the run's REPAIRED record when the repair that held it repaired it meanwhile."""
    lease = RepairLease(prefix, run, uuid.uuid4().hex[:12], attempt_key, now_ms(), ttl_ms)
    first = decision_log.append([(lease.key, lease.to_json())])[0]
    lease = replace(lease, acquired_offset=first.offset)
    decision_log.append([(lease.key, lease.to_json())])  # renewals keep the place of the first record
    renewal = _Renewal(decision_log, lease)
    renewal.start()
    try:
        yield _wait_for_turn(decision_log, lease, poll_s)
    finally:
        renewal.stop()
        try:
            decision_log.append([(lease.key, None)])
        except Exception as e:  # it lapses by itself
            log.warning("repair lease of run %s not released (it lapses in %d s): %s", run, ttl_ms // 1000, e)


def _wait_for_turn(decision_log: DecisionLog, lease: RepairLease, poll_s: float) -> RunRecord | None:
    said = ""
    while True:
        now = now_ms()  # before the read: a holder's renewal read afterwards is never judged lapsed
        state = decision_log.read_for(lease.prefix, lease.run)
        rec = state.runs.get((lease.prefix, lease.run))
        if rec is not None and rec.status is RunStatus.REPAIRED:
            return rec
        holder = state.repair_holder(lease.prefix, lease.run, now)
        if holder is None or holder.holder == lease.holder:
            return None
        if said != holder.holder:
            said = holder.holder
            log.info(
                "repair of run %s of exporter %s: waiting for the repair that holds it (lease %s, renewed every %d s)",
                lease.run,
                lease.prefix,
                holder.holder,
                holder.ttl_ms // 3000,
            )
        time.sleep(poll_s)


__all__ = ["hold_run"]
