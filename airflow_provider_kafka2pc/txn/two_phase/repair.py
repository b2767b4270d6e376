"""Repair (DESIGN §6): a run that lost transactions after its COMMIT still ends exactly once.

The broker aborted some of a decided run's transactions on timeout (the commit came too late): the
run record says LOST and names them, with the records, partitions and digest each held. A repair
exports exactly those again and commits them, as a two-phase run of its own:

1. **clean up earlier attempts**: a recovery pass over the exporter that rolls forward a repair
   already decided (then there is nothing left to do) and aborts an attempt that died before its
   decision (its transactions carry this run's repair key, ``attempt_key``);
2. **export again** only the lost slots (the caller's ``export_again``: the same Spark partitions
   of the same source), into new transactional ids ``{prefix}-{attempt}-{slot}``, prepared, not
   committed;
3. **compare before anything is visible**: every new transaction must hold as many records as the
   lost one, with the same digest (``txn.protocol.record_digest``); otherwise all of them are
   aborted and ``RepairRefusedError`` names each difference;
4. **decide**: the checks the commit makes (each transaction open under its own producer, the
   commit's headroom before its broker deadline) and one more (on the topics its lost one wrote
   to), then one COMMIT carrying the LOST run record it was planned from. One repair per
   generation of a run wins (``txn.protocol.decisions``): a later one, or one planned from a
   record another repair has since moved on, is void, aborts its own transactions and reports
   the winner. A repair never touches a Kafka source's group: its
   offsets moved with the run;
5. **commit** (EndTxn) and record the run REPAIRED, or LOST again with what is still missing.

Atomic visibility is given up for the run: its records became visible in two steps. Every report
(``list``, ``describe``, the run record, the commit of a cleared run) says so.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.markers import Fate
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    NotLostError,
    RepairRefusedError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.protocol.records import (
    DecisionRecord,
    Kind,
    RunRecord,
    RunStatus,
    new_decision,
)
from airflow_provider_kafka2pc.txn.protocol.repair_lease import DEFAULT_TTL_MS
from airflow_provider_kafka2pc.txn.protocol.source_files import Splits
from airflow_provider_kafka2pc.txn.two_phase import visibility
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared
from airflow_provider_kafka2pc.txn.two_phase.loss_proof import fate_of, proof_of
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult, recover, recover_until_clear
from airflow_provider_kafka2pc.txn.two_phase.repair_checks import check_committable, check_same
from airflow_provider_kafka2pc.txn.two_phase.repair_lease import hold_run
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan, attempts_of, plan_repair
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver, check_unique
from airflow_provider_kafka2pc.txn.two_phase.ruling import (
    committed_in,
    covered,
    lost_of_decisions,
    now_ms,
    obey,
    ref_of,
)

log = logging.getLogger(__name__)

ACTOR = "repair"


@dataclass(frozen=True)
class RepairReport:
    record: RunRecord  # the run's record once the call ended: REPAIRED, or why nothing was done
    note: str
    repaired_now: bool  # this call exported and committed (False: done already, or another repair won)


def repair_lost_run(
    wire: WireClient,
    decision_log: DecisionLog,
    prefix: str,
    run: str,
    export_again: Callable[[RepairPlan], Sequence[Committable]],
    actor: str = ACTOR,
    max_workers: int = 16,
    end_txn_timeout_s: float = 60.0,
    lease_ttl_ms: int = DEFAULT_TTL_MS,
    files_now: Callable[[], Splits | None] | None = None,
) -> RepairReport:
    """Repair the LOST run ``run`` of ``prefix`` (steps in the module's docstring). ``files_now``
    gives, after ``export_again``, the files each Spark partition read (a refusal names what changed
    against what the run recorded, ``txn.protocol.source_files``). Idempotent: a
    second call finds the run REPAIRED and does nothing; a call after a crash finishes or replaces
    the attempt that died. The repair holds the run by a lease (``txn.two_phase.repair_lease``): a
    second repair of the run waits for it and reports its result; recovery leaves its transactions
    alone while it lives."""
    naming.validate_prefix(prefix)
    attempt_key = f"{attempts_of(run)}{uuid.uuid4().hex[:8]}"
    with hold_run(decision_log, prefix, run, attempt_key, lease_ttl_ms) as repaired:
        if repaired is not None:
            return _repaired_already(repaired)
        return _repair_holding(
            wire, decision_log, prefix, run, attempt_key, export_again, actor, max_workers, end_txn_timeout_s,
            files_now,
        )  # fmt: skip


def _repair_holding(
    wire: WireClient,
    decision_log: DecisionLog,
    prefix: str,
    run: str,
    attempt_key: str,
    export_again: Callable[[RepairPlan], Sequence[Committable]],
    actor: str,
    max_workers: int,
    end_txn_timeout_s: float,
    files_now: Callable[[], Splits | None] | None,
) -> RepairReport:
    # A repair decided by an earlier try (killed past its decision) is finished here: say what this call did.
    decided = decision_log.read_for(prefix, run).repair_of(prefix, run)
    ended = _recovery_pass(wire, decision_log, prefix, run, actor, _attempt_of(run))
    state = decision_log.read_for(prefix, run)
    if (later := state.repair_of(prefix, run)) is not None:  # another repair decided since: finish it, export nothing
        decided = decided or later
        ended += _recovery_pass(wire, decision_log, prefix, run, actor)
        state = decision_log.read_for(prefix, run)
    plan = plan_repair(state, prefix, run, attempt_key)
    if isinstance(plan, RunRecord):
        return _repaired_already(plan, _finished_here(decided, ended))
    _prove_lost(wire, plan, end_txn_timeout_s)
    plan = replace(plan, dealt=decision_log.dealing(prefix, run))
    log.info("repair of %s: exporting again", plan.describe())
    committables = list(export_again(plan))
    check_same(plan, committables, wire, decision_log, actor, files_now)
    refs = [ref_of(c) for c in committables]
    check_unique(refs)
    resolver = TransactionResolver(wire, committed_in(state), max_workers=max_workers, timeout_s=end_txn_timeout_s)
    observed = resolver.observe_all(refs)
    check_committable(plan, committables, observed, wire, decision_log, actor, max_workers, end_txn_timeout_s)
    decision = new_decision(
        Kind.COMMIT,
        (covered(c, observed[c.transactional_id][1]) for c in committables),
        run,
        actor,
        [prefix],
        now_ms(),
        repairs=plan.record,
    )
    log.info("appending the repair's COMMIT decision for run %s (%d transaction(s))", run, len(refs))
    state = decision_log.decide(decision, keep_run=decision_log.keep_for(prefix, run))
    did = decision.decision_id
    if not state.in_force(did):
        return _lost_the_race(plan, committables, state.void.get(did, ""), wire, decision_log, actor)
    log.info(
        "decision: repair COMMIT %s for run %s: %d transaction(s), %d records: from here on they become visible",
        did,
        run,
        len(committables),
        sum(c.records for c in committables),
    )
    resolver.committed_in_log = committed_in(state)
    obey(decision_log, state, [did], resolver)
    lost = lost_of_decisions(state, [did])
    if lost:
        raise TransactionLostError(lost, [visibility.of_decision(state, did, prefix)[0]])
    final = decision_log.read_for(prefix, run).runs[(prefix, run)]
    if final.status is not RunStatus.REPAIRED:  # EndTxn not answered for all: the decision rules them
        note = (
            f"repair decision {did} of run {run} is in force, but not all of its transactions have ended yet: the "
            f"exporter's next recovery, or the repair run again, ends them (`kafka2pc list --prefix {prefix}`)"
        )
        return RepairReport(final, note, repaired_now=True)
    return RepairReport(final, _repaired_sentence(final), repaired_now=True)


def _prove_lost(wire: WireClient, plan: RepairPlan, timeout_s: float) -> None:
    """Before anything is exported again, each lost transaction is proven not visible from its
    partitions' markers (DESIGN §15): one that another process committed is not lost, and one whose
    records are gone cannot be proven either way; both refuse, nothing exported."""
    rec = plan.record
    for t in rec.lost:
        c = t.covered
        fate, where = fate_of(wire, c, timeout_s) if c.partitions else (Fate.ABSENT, ())
        if fate is Fate.COMMITTED:
            at = next(f for f in where if f.fate is Fate.COMMITTED)
            raise NotLostError(
                f"run {rec.run} of exporter {rec.prefix} is recorded LOST, but {c.transactional_id} was committed "
                f"(its COMMIT marker is in {at.partition} at offset {at.marker_offset}): its records are visible, "
                "so a repair would duplicate them. Nothing was exported; `kafka2pc describe` shows the run"
            )
        if fate is not Fate.ABORTED:
            raise RepairRefusedError(
                f"run {rec.run} of exporter {rec.prefix}: {c.transactional_id} cannot be proven lost "
                f"({proof_of(fate, where)}), so a repair might duplicate records already read. Nothing was "
                f"exported. If its records are known to be missing, export them again in a run of their own and "
                f"acknowledge the loss (`kafka2pc acknowledge --prefix {rec.prefix} --run {rec.run}`)"
            )


def abort_attempts(wire: WireClient, decision_log: DecisionLog, prefix: str, run: str, actor: str = ACTOR) -> bool:
    """End what undecided repair attempts of ``run`` left open (a re-export that failed or overran),
    now, as the export's at-once abort does (passes until two are clean); a decided repair is rolled
    forward. True when nothing of the exporter is left open."""

    def one_pass() -> RecoveryResult:
        return recover(
            wire,
            prefix,
            decision_log,
            run=f"repair of {run}",
            actor=actor,
            raise_on_loss=False,
            owns=_attempt_of(run),
            honour_leases=False,  # the caller holds the run's lease: what its re-export opened is its own to end
        )

    return recover_until_clear(one_pass)[0]


def _attempt_of(run: str) -> Callable[[str], bool]:
    """Whether a transactional id is one a repair attempt of ``run`` writes."""
    attempts = attempts_of(run)

    def owned(tid: str) -> bool:
        parsed = naming.parse_transactional_id(tid)
        return parsed is not None and (parsed.run_key or "").startswith(attempts)

    return owned


def _recovery_pass(
    wire: WireClient,
    decision_log: DecisionLog,
    prefix: str,
    run: str,
    actor: str,
    aborts: Callable[[str], bool] = lambda _tid: False,
) -> list[str]:
    """Obey every decision in force of the exporter (a decided repair is rolled forward); abort only
    the undecided transactions ``aborts`` accepts (by default none: another attempt may be exporting).
    Returns the transactions this pass committed itself."""
    result = recover(wire, prefix, decision_log, run=f"repair of {run}", actor=actor, raise_on_loss=False, owns=aborts)
    return [r.ref.transactional_id for r in result.resolutions if r.ended_here and r.outcome is Verdict.COMMITTED]


def _finished_here(decided: DecisionRecord | None, ended: Sequence[str]) -> tuple[int, int, str] | None:
    """(transactions, records, decision) of a repair decided earlier that this call committed."""
    mine = [c for c in (decided.txns if decided is not None else ()) if c.transactional_id in set(ended)]
    if decided is None or not mine:
        return None
    return len(mine), sum(c.records for c in mine), decided.decision_id


def _lost_the_race(
    plan: RepairPlan,
    committables: Sequence[Committable],
    why: str,
    wire: WireClient,
    decision_log: DecisionLog,
    actor: str,
) -> RepairReport:
    """This repair's COMMIT is void: abort what it wrote, finish the repair that won (if one did: it
    is rolled forward; another attempt still exporting is left alone), report it."""
    abort_prepared(committables, wire, decision_log, f"repair of {plan.run}", actor=actor)
    _recovery_pass(wire, decision_log, plan.prefix, plan.run, actor)
    rec = decision_log.read_for(plan.prefix, plan.run).runs.get((plan.prefix, plan.run))
    if rec is not None and rec.status is RunStatus.REPAIRED:
        note = (
            f"another repair came first ({why}); this one's {len(committables)} transaction(s) were aborted. "
            + _repaired_sentence(rec)
        )
        log.warning("repair of run %s: %s", plan.run, note)
        return RepairReport(rec, note, repaired_now=False)
    raise DecisionConflictError(
        f"the repair of run {plan.run} of exporter {plan.prefix} was not committed: its decision is void ({why}). "
        f"Its {len(committables)} transaction(s) were aborted, nothing of it is visible, and the run is "
        f"{rec.status.value if rec is not None else 'without a record'}. Run the repair again"
    )


def _repaired_already(rec: RunRecord, finished: tuple[int, int, str] | None = None) -> RepairReport:
    if finished is None:
        note = f"nothing to do: {_repaired_sentence(rec)}"
    else:
        txns, records, did = finished
        note = (
            f"this call finished repair decision {did}, which an earlier repair appended and did not end: it "
            f"committed {txns} transaction(s) with {records} records, which are visible now; {_repaired_sentence(rec)}"
        )
    log.info("repair of run %s: %s", rec.run, note)
    return RepairReport(rec, note, repaired_now=finished is not None)


def _repaired_sentence(rec: RunRecord) -> str:
    r = rec.repair
    assert r is not None
    return (
        f"run {rec.run} of exporter {rec.prefix} is REPAIRED: all {rec.records} records are visible once; "
        f"{r.restored} of them, lost after decision {rec.decision_id}, were exported again in {r.transactions} "
        f"transaction(s) and committed by repair decision {r.decision_id} ({r.actor}); the run became visible in "
        "two steps, not atomically"
    )
