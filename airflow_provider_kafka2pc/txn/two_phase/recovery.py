"""Recovery: bring one exporter's lingering transactions to the end the decision log rules (DESIGN §3.1).

One pass:
1. read the log; list the prefix's open transactions (exact, delimiter-aware match);
2. every Ongoing transaction that no decision in force rules gets one ABORT decision (appended
   and read back *before* any EndTxn): a live commit that appended its COMMIT first wins;
3. obey every decision in force that touches the prefix: COMMIT → roll forward (a transaction the
   broker shows aborted or superseded is LOST), ABORT → abort; record outcomes, retire what is final;
4. Prepare* states are the broker's to finish: not done, look again;
5. a loss, new or recorded in a run record and not acknowledged, fails the pass loudly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import (
    LostTransaction,
    NotLostError,
    TransactionLostError,
    Visibility,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import Kind, RunRecord, RunStatus, new_decision, run_key
from airflow_provider_kafka2pc.txn.two_phase import visibility
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution, TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import (
    abort_reopened,
    committed_in,
    covered_state,
    now_ms,
    obey,
    ref_of,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryPlan:
    commit: tuple[TxnRef, ...]  # open, ruled by a COMMIT in force: roll forward
    abort: tuple[TxnRef, ...]  # open, ruled by an ABORT or by nothing yet: abort (after deciding)
    wait: tuple[str, ...]  # ids the broker is still completing

    @property
    def empty(self) -> bool:
        return not (self.commit or self.abort or self.wait)


@dataclass(frozen=True)
class RecoveryResult:
    plan: RecoveryPlan
    resolutions: tuple[Resolution, ...]
    lost: tuple[LostTransaction, ...] = ()  # decided COMMIT, never visible, not acknowledged
    visibility: tuple[Visibility, ...] = ()  # per run with a loss: how much of it is visible
    spared: tuple[Visibility, ...] = ()  # the loss of the run whose own export repairs it (``spare``)
    # (id, run) of open, undecided transactions of a live repair: its own to decide (its lease)
    left_to_repair: tuple[tuple[str, str], ...] = ()

    @property
    def done(self) -> bool:
        """Nothing of the prefix is open any more (given what was listed) and nothing is lost."""
        return not self.plan.wait and not self.lost

    def describe(self) -> str:
        outcomes = [r.outcome.value for r in self.resolutions]
        spared = "".join(f"; {v.sentence()}: left to this run's export task, which repairs it" for v in self.spared)
        return (
            f"committed {outcomes.count('committed')}, aborted {outcomes.count('aborted')}, "
            f"lost {len(self.lost)}, still completing on the broker {len(self.plan.wait)}{spared}"
        )

    def raise_for_loss(self) -> None:
        if self.lost:
            raise TransactionLostError(self.lost, self.visibility)


def plan_recovery(open_states: Sequence[TxnState], state: LogState) -> RecoveryPlan:
    commit: list[TxnRef] = []
    abort: list[TxnRef] = []
    wait: list[str] = []
    for s in sorted(open_states, key=lambda s: s.transactional_id):
        ref = ref_of(s)
        if s.state != "Ongoing":
            wait.append(s.transactional_id)
            continue
        d = state.ruled_by(ref)
        (commit if d is not None and d.kind is Kind.COMMIT else abort).append(ref)
    return RecoveryPlan(tuple(commit), tuple(abort), tuple(wait))


def recover(
    wire: WireClient,
    prefix: str,
    decision_log: DecisionLog,
    run: str = "recovery",
    max_workers: int = 16,
    actor: str = "recovery",
    raise_on_loss: bool = True,
    run_key: str | None = None,
    owns: Callable[[str], bool] | None = None,
    spare: str | None = None,
    honour_leases: bool = True,
    before_abort: Callable[[], None] | None = None,
) -> RecoveryResult:
    """One recovery pass. ``run_key`` (INCREMENTING): abort only this run's undecided transactions;
    another run's may belong to a run that is still live (decisions in force are obeyed for all).
    ``owns`` instead: abort only the undecided transactions whose id it accepts (a repair's).
    ``spare``: a loss of that run does not fail the pass (a cleared run whose export repairs it);
    it is reported in ``spared``. ``honour_leases`` False: the caller is the repair that holds
    the lease (it aborts what its own failed re-export opened). ``before_abort`` is called before an
    ABORT is decided for undecided transactions, and may raise to end nothing (an export try that
    another try superseded since it began: ``txn/two_phase/export_try.py``)."""
    naming.validate_prefix(prefix)
    mine = owns if owns is not None else (lambda tid: _of_run(tid, run_key))
    inspector = TransactionInspector(wire)
    # The clock first, the broker's listing next, the log last: a repair appends its lease before it
    # opens a transaction, so every repair transaction listed has its lease in the read, judged at a
    # time no later than the read (a pass stopped in between cannot take a renewed lease for lapsed).
    now = now_ms()
    open_states = inspector.describe_prefix(prefix)
    state = decision_log.read_for(prefix)
    open_states = [s for s in open_states if mine(s.transactional_id) or ref_of(s) in state.ruling]
    # A live repair's undecided transactions are its own to decide (``txn.protocol.repair_lease``).
    leased = state.leased(prefix, now) if honour_leases else []
    left_to_repair = {
        s.transactional_id: le.run
        for s in open_states
        if ref_of(s) not in state.ruling
        for le in leased
        if le.protects(s.transactional_id)
    }
    if left_to_repair:
        log.info(
            "recovery of %s: %d open transaction(s) of a live repair (%s) left to it",
            prefix,
            len(left_to_repair),
            ", ".join(sorted({f"run {run}" for run in left_to_repair.values()})),
        )
        open_states = [s for s in open_states if s.transactional_id not in left_to_repair]
    plan = plan_recovery(open_states, state)
    undecided = [
        s for s in open_states if s.state == "Ongoing" and ref_of(s) not in state.ruling and mine(s.transactional_id)
    ]
    if not plan.empty:
        log.info(
            "recovery of %s: roll forward %d, abort %d (%d without a decision yet), wait for %d",
            prefix,
            len(plan.commit),
            len(plan.abort),
            len(undecided),
            len(plan.wait),
        )
    if undecided:
        if before_abort is not None:
            before_abort()
        decision = new_decision(Kind.ABORT, (covered_state(s) for s in undecided), run, actor, (), now_ms())
        state = decision_log.decide(decision, keep_run=decision_log.keep_for(prefix))
        # Whatever came first rules: a COMMIT appended before ours turns an abort into a roll-forward.
        plan = plan_recovery(open_states, state)
    resolver = TransactionResolver(wire, committed_in(state), max_workers=max_workers)
    touching = state.decisions_touching(lambda tid: naming.belongs_to(tid, prefix))
    ids = [d.decision_id for d in touching]
    resolutions = obey(decision_log, state, ids, resolver)
    resolutions += abort_reopened(resolver, state, plan.abort, resolutions)
    # This exporter's losses fail its recovery; another exporter's part of the same run fails that
    # exporter's recovery (the CLI reports both).
    found = [f for f in visibility.losses(state, prefix) if f.visibility.prefix == prefix]
    spared = tuple(f.visibility for f in found if spare is not None and f.visibility.run == spare)
    found = [f for f in found if spare is None or f.visibility.run != spare]
    lost = {t.transactional_id: t for f in found for t in f.lost}
    result = RecoveryResult(
        plan,
        tuple(resolutions),
        tuple(lost.values()),
        tuple(f.visibility for f in found),
        spared,
        tuple(sorted(left_to_repair.items())),
    )
    if raise_on_loss:
        result.raise_for_loss()
    return result


def recover_until_clear(
    one_pass: Callable[[], RecoveryResult], timeout_s: float = 30.0, settle_s: float = 3.0
) -> tuple[bool, RecoveryResult]:
    """Recovery passes until two clean ones ``settle_s`` apart (a writer whose task was being killed
    may still send a batch after the first), or ``timeout_s``. Returns (nothing left open, the last
    pass). The export's at-once abort after a failed or stopped write job."""
    deadline, clean = time.monotonic() + timeout_s, 0
    while True:
        result = one_pass()
        clean = clean + 1 if result.done else 0
        if clean >= 2 or time.monotonic() > deadline:
            return clean >= 2, result
        time.sleep(settle_s if result.done else 0.5)


def _of_run(tid: str, run_key: str | None) -> bool:
    parsed = naming.parse_transactional_id(tid)
    return run_key is None or (parsed is not None and parsed.run_key == run_key)


def acknowledge_loss(decision_log: DecisionLog, prefix: str, run: str, note: str) -> tuple[RunRecord, RunRecord, int]:
    """Mark the LOST run ``run`` of ``prefix`` ACKNOWLEDGED (a person dealt with it): recovery stops
    failing on it; its lost records stay lost and the record keeps them. Returns the record as it
    was, as it is now, and the offset written. The CLI and the Airflow UI both acknowledge here."""
    state = decision_log.read(keep_run=lambda p, r, _raw: p == prefix and r == run, history={run_key(prefix, run)})
    rec = state.runs.get((prefix, run))
    if rec is None or rec.status is not RunStatus.LOST:
        status = "has no run record" if rec is None else f"is {rec.status.value}"
        raise NotLostError(
            f"run {run!r} of prefix {prefix!r} {status} in decision log {decision_log.topic}; only a LOST run "
            f"can be acknowledged (`kafka2pc list --prefix {prefix}` shows the LOST ones)"
        )
    _refuse_under_repair(state, prefix, run)
    acked = dataclasses.replace(rec, status=RunStatus.ACKNOWLEDGED, at_ms=now_ms(), note=note)
    position = decision_log.append([(acked.key, acked.to_json())])[0]
    # Read again (DESIGN §15): a repair decided meanwhile makes the lost records visible, and wins; a
    # record that took effect before this one (a repair that ended) makes this one void.
    again = decision_log.read(keep_run=lambda p, r, _raw: p == prefix and r == run, history={acked.key})
    _refuse_under_repair(again, prefix, run)
    now = again.runs.get((prefix, run))
    if now is None or now.status is not RunStatus.ACKNOWLEDGED:
        raise NotLostError(
            f"run {run!r} of prefix {prefix!r} is {now.status.value if now else 'without a record'} now: "
            "another actor ended it before this acknowledgement took effect, so it is void "
            f"(`kafka2pc describe --prefix {prefix}` shows the run)"
        )
    log.warning("run %s of %s: LOST acknowledged (%s)", run, prefix, note or "no note")
    return rec, acked, position.offset


def _refuse_under_repair(state: LogState, prefix: str, run: str) -> None:
    """An acknowledged loss stays lost: refused while a repair's COMMIT in force would still make the
    lost records visible (a repair killed past its decision), naming what finishes it."""
    repair = state.repair_of(prefix, run)
    if repair is None:
        return
    raise NotLostError(
        f"run {run!r} of prefix {prefix!r} has a repair in force (decision {repair.decision_id} by {repair.actor}, "
        f"{sum(c.records for c in repair.txns)} records in {len(repair.txns)} transaction(s)): its records become "
        f"visible, so the loss cannot be acknowledged. Finish it with `kafka2pc resolve --prefix {prefix}` (or the "
        "exporter's next recovery), then `kafka2pc list` shows the run REPAIRED"
    )
