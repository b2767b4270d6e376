"""Recovery: resolve every lingering transaction of one exporter by the decision log (DESIGN §3.1).

Ongoing with a COMMIT decision for the same (id, producer id, epoch) → commit; any other Ongoing
→ abort; PrepareCommit / PrepareAbort → the broker is finishing it, look again later. Ids of other
prefixes are never touched: listing filters by an exact, delimiter-aware match.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn import naming
from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionLog, DecisionSnapshot
from airflow_provider_kafka2pc.txn.inspect import TransactionInspector
from airflow_provider_kafka2pc.txn.outcome import Intent, TxnRef
from airflow_provider_kafka2pc.txn.resume import Resolution, TransactionResolver, record_final, ref_of
from airflow_provider_kafka2pc.txn.wire import TxnState, WireClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryPlan:
    commit: tuple[TxnRef, ...]
    abort: tuple[TxnRef, ...]
    wait: tuple[str, ...]  # ids the broker is still completing

    @property
    def empty(self) -> bool:
        return not (self.commit or self.abort or self.wait)


@dataclass(frozen=True)
class RecoveryResult:
    plan: RecoveryPlan
    resolutions: tuple[Resolution, ...]
    settled: tuple[str, ...]  # decided ids found committed and now recorded COMMITTED

    @property
    def done(self) -> bool:
        """Nothing of the prefix is open any more (given what was listed)."""
        return not self.plan.wait

    def describe(self) -> str:
        outcomes = [r.outcome.value for r in self.resolutions]
        return (
            f"committed {outcomes.count('committed')}, aborted {outcomes.count('aborted')}, "
            f"lost {outcomes.count('lost')}, still completing on the broker {len(self.plan.wait)}, "
            f"settled {len(self.settled)}"
        )


def plan_recovery(open_states: Sequence[TxnState], snapshot: DecisionSnapshot) -> RecoveryPlan:
    commit: list[TxnRef] = []
    abort: list[TxnRef] = []
    wait: list[str] = []
    for s in sorted(open_states, key=lambda s: s.transactional_id):
        ref = ref_of(s)
        if s.state == "Ongoing":
            (commit if snapshot.decided_commit(ref) else abort).append(ref)
        else:
            wait.append(s.transactional_id)
    return RecoveryPlan(tuple(commit), tuple(abort), tuple(wait))


def recover(
    wire: WireClient, prefix: str, decision_log: DecisionLog, run: str = "recovery", max_workers: int = 16
) -> RecoveryResult:
    naming.validate_prefix(prefix)
    inspector = TransactionInspector(wire)
    snapshot = decision_log.read()
    plan = plan_recovery(inspector.describe_prefix(prefix), snapshot)
    if not plan.empty:
        log.info(
            "recovery of %s: commit %d, abort %d, wait for %d",
            prefix,
            len(plan.commit),
            len(plan.abort),
            len(plan.wait),
        )
    resolver = TransactionResolver(wire, snapshot.committed, max_workers=max_workers)
    resolutions = resolver.resolve(plan.commit, Intent.COMMIT) + resolver.resolve(plan.abort, Intent.ABORT)
    record_final(decision_log, resolutions, run)
    return RecoveryResult(plan, tuple(resolutions), _settle(inspector, prefix, snapshot, decision_log, run, plan))


def _settle(
    inspector: TransactionInspector,
    prefix: str,
    snapshot: DecisionSnapshot,
    decision_log: DecisionLog,
    run: str,
    plan: RecoveryPlan,
) -> tuple[str, ...]:
    """Close the gap 'EndTxn done, COMMITTED not yet written' before a new run reuses the id."""
    handled = {r.transactional_id for r in plan.commit} | set(plan.wait)
    pending = [
        r
        for tid, r in snapshot.latest.items()
        if r.decision is Decision.COMMIT and naming.belongs_to(tid, prefix) and tid not in handled
    ]
    if not pending:
        return ()
    states = inspector.describe(r.transactional_id for r in pending)
    done = []
    for r in pending:
        s = states.get(r.transactional_id)
        if (
            s is not None
            and s.state == "CompleteCommit"
            and (s.producer_id, s.producer_epoch) == (r.producer_id, r.producer_epoch)
        ):
            done.append(ref_of(r))
    if done:
        decision_log.record(done, Decision.COMMITTED, run)
    return tuple(t.transactional_id for t in done)
