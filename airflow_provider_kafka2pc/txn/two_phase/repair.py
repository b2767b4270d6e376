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

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.markers import Fate
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState, slot_of
from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    NotLostError,
    RepairRefusedError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import Observation, Verdict
from airflow_provider_kafka2pc.txn.protocol.record_digest import describe_difference
from airflow_provider_kafka2pc.txn.protocol.records import (
    DecisionRecord,
    Kind,
    LostTxn,
    RunRecord,
    RunStatus,
    new_decision,
    topics_of,
)
from airflow_provider_kafka2pc.txn.protocol.repair_lease import DEFAULT_TTL_MS
from airflow_provider_kafka2pc.txn.two_phase import visibility
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, check_current_producers
from airflow_provider_kafka2pc.txn.two_phase.doomed import commit_headroom, doomed_of
from airflow_provider_kafka2pc.txn.two_phase.loss_proof import fate_of, proof_of
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult, recover, recover_until_clear
from airflow_provider_kafka2pc.txn.two_phase.repair_lease import hold_run
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver, check_unique
from airflow_provider_kafka2pc.txn.two_phase.ruling import (
    committed_in,
    covered,
    lost_of_decisions,
    now_ms,
    obey,
    partitions_of,
    ref_of,
)

log = logging.getLogger(__name__)

ACTOR = "repair"


def attempts_of(run: str) -> str:
    """The run key every repair attempt of ``run`` starts with: ids no export of the exporter
    writes (a POOLING run has no run key, an INCREMENTING one a sanitized run id)."""
    return f"repair.{hashlib.sha256(run.encode()).hexdigest()[:10]}."


@dataclass(frozen=True)
class RepairPlan:
    """What one repair attempt exports again: the lost slots of one exporter's run."""

    record: RunRecord  # the run as its LOST (or ACKNOWLEDGED) record has it
    attempt_key: str

    @property
    def prefix(self) -> str:
        return self.record.prefix

    @property
    def run(self) -> str:
        return self.record.run

    @property
    def lost(self) -> tuple[LostTxn, ...]:
        return self.record.lost

    @property
    def slots(self) -> tuple[int, ...]:
        """The lost transactions' slots: the Spark partitions to export again."""
        return tuple(sorted(s for t in self.lost if (s := slot_of(t.covered.transactional_id)) is not None))

    def transactional_id(self, slot: int) -> str:
        """The id the re-export of ``slot`` writes into."""
        return naming.transactional_id(self.prefix, slot, naming.NamingStrategy.INCREMENTING, self.attempt_key)

    def describe(self) -> str:
        records = sum(t.covered.records for t in self.lost)
        return (
            f"run {self.run} of exporter {self.prefix}: {len(self.lost)} lost transaction(s) with {records} records "
            f"(Spark partitions {', '.join(map(str, self.slots))}), exported again as "
            f"{self.transactional_id(self.slots[0]) if self.slots else '-'}..."
        )


@dataclass(frozen=True)
class RepairReport:
    record: RunRecord  # the run's record once the call ended: REPAIRED, or why nothing was done
    note: str
    repaired_now: bool  # this call exported and committed (False: done already, or another repair won)


def plan_repair(state: LogState, prefix: str, run: str, attempt_key: str) -> RepairPlan | RunRecord:
    """The plan, or the run's record when it is REPAIRED already. Refuses what cannot be repaired."""
    rec = state.runs.get((prefix, run))
    if rec is not None and rec.status is RunStatus.REPAIRED:
        return rec
    if rec is None or rec.status is not RunStatus.LOST:
        status = "has no final run record" if rec is None else f"is {rec.status.value}"
        if rec is not None and rec.status is RunStatus.ACKNOWLEDGED:
            # A person dealt with the loss, perhaps by exporting the missing part again: a repair could duplicate it.
            status += ": its loss was acknowledged (and perhaps exported again by hand), so a repair could duplicate it"
        elif rec is not None:
            status += ": nothing of it was lost"
        raise NotLostError(
            f"run {run!r} of exporter {prefix!r} {status}; only a LOST run can be repaired "
            f"(`kafka2pc list --prefix {prefix}` shows the LOST ones)"
        )
    unnamed = [t.covered.transactional_id for t in rec.lost if slot_of(t.covered.transactional_id) is None]
    if unnamed:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} lost transaction(s) whose ids name no slot ({', '.join(unnamed)}): "
            "the Spark partitions to export again are unknown. Nothing was written"
        )
    offsets = [t for t in rec.lost if slot_of(t.covered.transactional_id) == naming.OFFSETS_SLOT]
    if offsets:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} lost its consumer-offsets participant "
            f"({offsets[0].covered.transactional_id}): its Kafka source's group did not move with the run, and a "
            "repair re-exports output only. Nothing was written. Move the group to the run's ends "
            f"(`kafka2pc describe --prefix {prefix}` shows them), then repair"
        )
    undigested = [t.covered.transactional_id for t in rec.lost if t.covered.digest is None]
    if undigested:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} cannot be repaired: its lost transaction(s) {', '.join(undigested)} "
            "carry no digest of their records (the export had repairable=False, or wrote a frame stored already, a "
            "cache or a checkpoint, which a repair cannot read again, or dealt its rows over the task slots of a "
            "barrier stage, which a repair cannot deal again, or ran a version before 0.2.0), so a "
            "re-computation cannot be proven identical. Nothing was written. Re-export the missing part in a run "
            f"of its own, or acknowledge the loss (`kafka2pc acknowledge --prefix {prefix} --run {run}`)"
        )
    return RepairPlan(rec, attempt_key)


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
) -> RepairReport:
    """Repair the LOST run ``run`` of ``prefix`` (steps in the module's docstring). Idempotent: a
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
            wire, decision_log, prefix, run, attempt_key, export_again, actor, max_workers, end_txn_timeout_s
        )


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
    log.info("repair of %s: exporting again", plan.describe())
    committables = list(export_again(plan))
    _check_same(plan, committables, wire, decision_log, actor)
    refs = [ref_of(c) for c in committables]
    check_unique(refs)
    resolver = TransactionResolver(wire, committed_in(state), max_workers=max_workers, timeout_s=end_txn_timeout_s)
    observed = resolver.observe_all(refs)
    _check_committable(plan, committables, observed, wire, decision_log, actor, max_workers, end_txn_timeout_s)
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


def _check_same(
    plan: RepairPlan, committables: Sequence[Committable], wire: WireClient, decision_log: DecisionLog, actor: str
) -> None:
    """Every lost slot exported again, each with the records it lost: else nothing becomes visible."""
    expected = _lost_by_new_id(plan)
    got = {c.transactional_id: c for c in committables}
    problems = [f"{tid}: not exported again" for tid in sorted(set(expected) - set(got))]
    problems += [f"{tid}: not a transaction this repair asked for" for tid in sorted(set(got) - set(expected))]
    for tid, c in sorted(got.items()):
        lost = expected.get(tid)
        if lost is None:
            continue
        was = lost.covered
        if c.digest is None:
            problems.append(f"{was.transactional_id}: the re-export recorded no digest")
        elif (c.records, c.digest) != (was.records, was.digest):
            assert was.digest is not None  # plan_repair refused a lost transaction without one
            where = ", ".join(was.partitions) or "its partitions"
            problems.append(
                f"{was.transactional_id} (Spark partition {slot_of(tid)}, on {where}): "
                + describe_difference(was.digest, c.digest)
            )
    if not problems:
        return
    if committables:
        abort_prepared(committables, wire, decision_log, f"repair of {plan.run}", actor=actor)
    raise RepairRefusedError(
        f"repair of run {plan.run} of exporter {plan.prefix} refused: the source no longer gives the records the "
        f"run lost, Spark partition by Spark partition ({'; '.join(problems)}): its data changed, or its "
        "partitioning did (another cluster size or parallelism splits files and coalesces shuffles "
        "differently: repair with the run's Spark settings). "
        f"Nothing of the repair is visible: its {len(committables)} transaction(s) "
        f"were aborted, and the run stays LOST. Restore the source to what run {plan.run} read and repair again, "
        f"or acknowledge the loss (`kafka2pc acknowledge --prefix {plan.prefix} --run {plan.run}`)"
    )


def _lost_by_new_id(plan: RepairPlan) -> dict[str, LostTxn]:
    """The lost transaction each of the repair's transactional ids exports again (same slot)."""
    return {plan.transactional_id(s): t for s in plan.slots for t in plan.lost
            if slot_of(t.covered.transactional_id) == s}  # fmt: skip


def _moved_topics(
    plan: RepairPlan, committables: Sequence[Committable], observed: Mapping[str, tuple[Observation, TxnState | None]]
) -> list[str]:
    """Each new transaction must write to the topics its lost one did, as the broker lists them: the
    digest covers keys and values, not where they go (a repair given another topic would pass it).
    Partitions are not compared: records without a key land where the producer's partitioner
    chooses, differently each time."""
    expected = _lost_by_new_id(plan)
    problems = []
    for c in committables:
        lost = expected.get(c.transactional_id)
        if lost is None or not lost.covered.partitions:  # an old record names no partitions
            continue
        was = lost.covered.topics
        now = topics_of(partitions_of(c, observed[c.transactional_id][1]))
        if now != was:
            problems.append(
                f"{lost.covered.transactional_id} (Spark partition {slot_of(c.transactional_id)}) wrote to "
                f"{', '.join(sorted(was))}; its re-export to {', '.join(sorted(now)) or 'no topic'}"
            )
    return problems


def _check_committable(
    plan: RepairPlan,
    committables: Sequence[Committable],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
    wire: WireClient,
    decision_log: DecisionLog,
    actor: str,
    max_workers: int,
    end_txn_timeout_s: float,
) -> None:
    """As the commit does before its decision: every new transaction open under its own producer,
    with the commit's headroom before its broker deadline (a re-export that outlived
    ``transaction.timeout.ms`` was aborted by the broker already), and on its lost one's topics.
    Else all are aborted, nothing of the repair is visible."""
    refs = [ref_of(c) for c in committables]
    check_current_producers(refs, observed, [plan.prefix])
    doomed = doomed_of(
        refs, observed, commit_headroom(len(refs), max_workers, decision_log.budget_s, end_txn_timeout_s)
    )
    # Topics only of transactions the broker lists open: a doomed one's partitions may be gone.
    moved = _moved_topics(plan, committables, observed) if not doomed else []
    if not doomed and not moved:
        return
    abort_prepared(committables, wire, decision_log, f"repair of {plan.run}", actor=actor)
    if moved:
        raise RepairRefusedError(
            f"repair of run {plan.run} of exporter {plan.prefix} refused: its re-export wrote to other topics than "
            f"the run ({'; '.join(moved)}). Nothing of the repair is visible: its {len(committables)} transaction(s) "
            "were aborted, and the run stays LOST. Repair again with the run's topic (the export's `topic`; from the "
            "CLI, `--topic`, or none when the frame has a topic column)"
        )
    raise RepairRefusedError(
        f"repair of run {plan.run} of exporter {plan.prefix}: {len(doomed)} of its {len(refs)} transaction(s) could "
        f"no longer commit ({'; '.join(f'{t}: {why}' for t, why in sorted(doomed.items()))}). They were aborted: "
        "nothing of the repair is visible, and the run stays LOST. Repair again; the re-export and its commit must "
        "end within the broker's transaction.timeout.ms"
    )


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
